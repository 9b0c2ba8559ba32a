"""What ``register`` prints is for people: no raw terminal escape codes, no warning about
MLflow's type hints (the registered model is data for the installed loader, not a Python
model whose ``predict`` MLflow inspects)."""

from __future__ import annotations

from deploy_support import cli


def test_register_prints_no_escape_codes_and_no_type_hint_warning(tmp_path, fresh_store):
    uri = fresh_store  # the shared tiny benchmark's store, a copy of this test's own
    done = cli("register", "-e", "deploy", "--device", "cpu", "--model", "conv_block",
               "--compiler", "onnxruntime", "--allow-unstable", "--tracking-uri", uri,
               env={"PYTHONWARNINGS": "always"}, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "alias 'cpu' now points at it" in done.stdout
    printed = done.stdout + done.stderr
    assert "\x1b[" not in printed
    assert "type hint" not in printed.lower()
