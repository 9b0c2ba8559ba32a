"""Which cell failures are the host's (a plain re-run measures them again) and the fix each
names: a file of the home's caches gone from under a compile is one, a missing file of the
user's is not."""

from __future__ import annotations

from mlflow_ngraph.errors import VANISHED, host_errno, host_fix, vanished


def test_a_file_of_the_home_gone_from_under_a_compile_is_the_hosts_failure(tmp_path):
    home = tmp_path / "home"
    reason = (f"CompileFailed: ONNX export failed: [Errno 2] No such file or directory: "
              f"'{home}/exports/.tmp-x1y2/model.onnx'")  # fmt: skip
    assert vanished(reason, home)
    labelled = f"{VANISHED} ({reason})"  # as the runner labels it
    assert host_errno(labelled) == 2
    assert "let nothing remove the home's files" in host_fix(labelled)


def test_a_missing_file_elsewhere_or_another_failure_is_the_compilers(tmp_path):
    home = tmp_path / "home"
    assert not vanished("[Errno 2] No such file or directory: '/data/model.onnx'", home)
    assert not vanished(f"RuntimeError: shape mismatch in {home}/engines/x", home)
    assert host_errno("RuntimeError: shape mismatch") is None
    assert host_errno("OSError: [Errno 28] No space left on device") == 28
