"""Each cell in its own process: a crash, a hang or a model that cannot be built fails its
own cells with the reason, and the healthy model of the same run is measured."""

from __future__ import annotations

import time

import pytest

HEALTHY = "conv_block:width=8,depth=1,image_size=32"
HEALTHY_LABEL = "conv_block:depth=1,image_size=32,width=8"
MEASURE = ["--batch-sizes", "1,2", "--warmup", "1", "--repetitions", "3", "--min-duration", "0"]


def _rows(out: str) -> dict[tuple[str, str], str]:
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[2].isdigit():
            rows[(parts[0], parts[2])] = line
    return rows


def _run(run_cli, tracking_uri, models, *extra):
    args = ["benchmark", *MEASURE, "--compiler", "identity", "--tracking-uri", tracking_uri]
    for model in models:
        args += ["--model", model]
    return run_cli(*args, *extra)


def test_crashes_and_a_broken_factory_fail_their_cells_and_the_run_goes_on(run_cli, tracking_uri):
    models = [
        "tests.fixtures.crashing:aborting:input_shape=4",
        "tests.fixtures.crashing:segfaulting:input_shape=4",
        "tests.fixtures.crashing:raising:input_shape=4",
        HEALTHY,
    ]
    code, out, err = _run(run_cli, tracking_uri, models)
    assert code == 0, err
    rows = _rows(out)
    for b in ("1", "2"):
        assert "FAILED" in rows[("tests.fixtures.crashing:aborting:input_shape=4", b)]
        assert "SIGABRT" in rows[("tests.fixtures.crashing:aborting:input_shape=4", b)]
        assert "SIGSEGV" in rows[("tests.fixtures.crashing:segfaulting:input_shape=4", b)]
        assert "cannot build" in rows[("tests.fixtures.crashing:raising:input_shape=4", b)]
        assert " OK" in rows[(HEALTHY_LABEL, b)]
    assert "Traceback" not in err
    # the re-run does not crash the same way: the failures are resumed from the journal
    code, out, err = _run(run_cli, tracking_uri, models)
    assert code == 0, err
    assert out.count("(resumed)") == 8


@pytest.mark.parametrize("isolation", ["process"])
def test_a_hanging_cell_is_killed_at_the_cell_timeout(run_cli, tracking_uri, isolation):
    models = ["tests.fixtures.crashing:hanging:input_shape=4", HEALTHY]
    code, out, err = _run(
        run_cli, tracking_uri, models, "--cell-timeout", "20", "--isolation", isolation
    )
    assert code == 0, err
    rows = _rows(out)
    assert "timed out after 20 s" in rows[("tests.fixtures.crashing:hanging:input_shape=4", "1")]
    assert " OK" in rows[(HEALTHY_LABEL, "2")]


def _workers() -> list:
    import psutil

    return [
        p
        for p in psutil.Process().children(recursive=True)
        if "spawn_main" in " ".join(p.cmdline())  # not the resource tracker
    ]


def _task(tmp_path, model="conv_block", params=None, min_duration=0.5):
    from mlflow_ngraph.config import MeasureSettings
    from mlflow_ngraph.worker import CellTask

    return CellTask(
        name="cell", model_name=model, model_params=params or {"width": 8, "depth": 1},
        compiler="identity", flags={}, batch_sizes=[1], device="cpu", device_kind="cpu",
        home=str(tmp_path), tolerance=1e-3, log_file=str(tmp_path / "worker.log"),
        measure=MeasureSettings(warmup=1, repetitions=3, min_duration_s=min_duration),
    )  # fmt: skip


def test_the_spare_worker_is_stopped_while_a_cell_measures_and_gone_after(tmp_path):
    """The next cell's worker imports while the current cell builds, never while it
    measures; a run leaves no worker behind."""
    import psutil

    from mlflow_ngraph import isolation

    task = _task(tmp_path)
    seen = []

    def on_event(kind, payload):
        if kind == "phase" and payload[1] == "measure" and isolation._spare is not None:
            seen.append(psutil.Process(isolation._spare.proc.pid).status())
        if kind == "record":
            seen.append(payload[1]["status"])

    try:
        assert isolation.run_isolated(task, on_event, timeout_s=300) is None
        assert seen == [psutil.STATUS_STOPPED, "OK"]
        assert isolation._spare is not None and isolation._spare.alive()
        # the spare serves the next cell
        spare_pid = isolation._spare.proc.pid
        seen.clear()
        assert isolation.run_isolated(task, on_event, timeout_s=300, prestart=False) is None
        assert seen[-1] == "OK" and isolation._spare is None
        assert not psutil.pid_exists(spare_pid) or psutil.Process(spare_pid).status() in (
            psutil.STATUS_ZOMBIE,
            psutil.STATUS_DEAD,
        )
    finally:
        isolation.shutdown()
    assert _workers() == []


def test_the_spare_builds_the_next_cells_model_and_its_cell_uses_it(tmp_path):
    """With the next cell named (``Ahead``), its worker builds the model before the task
    comes, and the cell measures that model instead of building it again."""
    from mlflow_ngraph import isolation

    log = tmp_path / "builds.txt"
    logged = {"log": str(log), "input_shape": "4"}
    ahead = isolation.Ahead("tests.fixtures.models:build_logged", "identity", logged)
    records = []

    def on_event(kind, payload):
        if kind == "record":
            records.append(payload[1]["status"])

    try:
        assert isolation.run_isolated(_task(tmp_path), on_event, 300, ahead=ahead) is None
        spare_pid = isolation._spare.proc.pid
        deadline = time.monotonic() + 120
        while not (log.is_file() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)  # the spare builds the model before it has its task
        assert log.read_text().split() == [str(spare_pid)]
        nxt = _task(tmp_path, "tests.fixtures.models:build_logged", logged, min_duration=0)
        assert isolation.run_isolated(nxt, on_event, 300, prestart=False) is None
    finally:
        isolation.shutdown()
    assert records == ["OK", "OK"]
    assert log.read_text().split() == [str(spare_pid)]  # not built again by its cell


def test_a_run_leaves_no_worker_behind(run_cli, tracking_uri):
    code, out, err = _run(run_cli, tracking_uri, [HEALTHY], "--compiler", "onnxruntime")
    assert code == 0, err
    assert _workers() == []


# --- reference outputs kept in the home -----------------------------------------------------
def _reference(tmp_path, name="conv_block", params=None, b=2):
    from mlflow_ngraph import worker
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.supply import EngineSupply

    worker._REFERENCES.clear()  # a fresh worker: nothing in memory
    params = {"width": 8, "depth": 1, "image_size": 32} if params is None else params
    model = load_model(name, dict(params))
    supply = EngineSupply(tmp_path, "cpu", "cpu", "throughput")
    return worker.reference_outputs(model, supply, b)


def _never_compiled(monkeypatch):
    from mlflow_ngraph.compilers.identity import IdentityCompiler

    def compile_(*args, **kwargs):
        raise AssertionError("the reference engine ran although its outputs were stored")

    monkeypatch.setattr(IdentityCompiler, "compile", compile_)


def test_reference_outputs_are_computed_once_and_read_back_identical(tmp_path, monkeypatch):
    import numpy as np

    x, y, label = _reference(tmp_path)
    files = list((tmp_path / "references").glob("*.npz"))
    assert len(files) == 1 and label == "pytorch-eager"
    _never_compiled(monkeypatch)  # the next worker reads the file
    x2, y2, label2 = _reference(tmp_path)
    assert np.array_equal(x, x2) and label2 == label
    assert y2.dtype == y.dtype and np.array_equal(y, y2)
    # another batch size is another entry, not a read of this one
    monkeypatch.undo()
    _reference(tmp_path, b=1)
    assert len(list((tmp_path / "references").glob("*.npz"))) == 2


def test_several_outputs_are_stored_and_read_back_as_a_tuple(tmp_path, monkeypatch):
    import numpy as np

    two_heads = "tests.fixtures.multi_output:two_heads"
    _, y, _ = _reference(tmp_path, two_heads, params={"input_shape": 4})
    _never_compiled(monkeypatch)
    _, y2, _ = _reference(tmp_path, two_heads, params={"input_shape": 4})
    assert isinstance(y, tuple) and isinstance(y2, tuple) and len(y2) == len(y) == 2
    assert all(np.array_equal(a, b) for a, b in zip(y, y2))


@pytest.mark.parametrize("damage", ["torn", "other input"])
def test_a_corrupt_or_stale_reference_entry_is_ignored_and_rewritten(tmp_path, damage):
    import numpy as np

    from mlflow_ngraph import worker

    _, y, _ = _reference(tmp_path)
    (path,) = (tmp_path / "references").glob("*.npz")
    if damage == "torn":
        path.write_bytes(path.read_bytes()[:100])
    else:  # stored for an input the model draws no longer: wrong outputs under the same key
        np.savez(path, input_sha256=np.array("0" * 64), count=np.array(1),
                 is_list=np.array(False), output_0=np.zeros_like(y))  # fmt: skip
    _, y2, _ = _reference(tmp_path)
    assert np.array_equal(y, y2)
    assert worker._read_reference(path, _reference(tmp_path)[0]) is not None  # rewritten whole
