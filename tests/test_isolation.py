"""Each cell in its own process: a crash, a hang or a model that cannot be built fails its
own cells with the reason, and the healthy model of the same run is measured."""

from __future__ import annotations

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


def test_the_spare_worker_is_stopped_while_a_cell_measures_and_gone_after(tmp_path):
    """The next cell's worker imports while the current cell builds, never while it
    measures; a run leaves no worker behind."""
    import psutil

    from mlflow_ngraph import isolation
    from mlflow_ngraph.config import MeasureSettings
    from mlflow_ngraph.worker import CellTask

    task = CellTask(
        name="cell", model_name="conv_block", model_params={"width": 8, "depth": 1},
        compiler="identity", flags={}, batch_sizes=[1], device="cpu", device_kind="cpu",
        home=str(tmp_path), measure=MeasureSettings(warmup=1, repetitions=3, min_duration_s=0.5),
        tolerance=1e-3, log_file=str(tmp_path / "worker.log"),
    )  # fmt: skip
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


def test_a_run_leaves_no_worker_behind(run_cli, tracking_uri):
    code, out, err = _run(run_cli, tracking_uri, [HEALTHY], "--compiler", "onnxruntime")
    assert code == 0, err
    assert _workers() == []
