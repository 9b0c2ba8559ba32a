"""Each cell in its own process: a crash, a hang or a model that cannot be built fails its
own cells with the reason, and the healthy model of the same run is measured."""

from __future__ import annotations

import os
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
        run_cli, tracking_uri, models, "--cell-timeout", "15", "--isolation", isolation
    )
    assert code == 0, err
    rows = _rows(out)
    assert "timed out after 15 s" in rows[("tests.fixtures.crashing:hanging:input_shape=4", "1")]
    assert " OK" in rows[(HEALTHY_LABEL, "2")]


def _workers() -> list:
    import psutil

    def worker(p) -> bool:  # a spawned or forked worker, or the template it is forked from
        line = " ".join(p.cmdline())
        return "spawn_main" in line or "forkserver" in line  # not the resource tracker

    return [p for p in psutil.Process().children(recursive=True) if worker(p)]


def _task(tmp_path, model="conv_block", params=None, min_duration=0.5):
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.run.worker import CellTask

    return CellTask(
        name="cell", model_name=model, model_params=params or {"width": 8, "depth": 1},
        compiler="identity", flags={}, batch_sizes=[1], device="cpu", device_kind="cpu",
        home=str(tmp_path), tolerance=1e-3, log_file=str(tmp_path / "worker.log"),
        measure=MeasureSettings(warmup=1, repetitions=3, min_duration_s=min_duration),
    )  # fmt: skip


def _group(tmp_path, tasks, baseline=None, ahead=None, retries=0, policy=None):
    """Run ``tasks`` (name -> CellTask) as one group; returns (records, deaths)."""
    from mlflow_ngraph.measure.rounds import RoundPolicy
    from mlflow_ngraph.run import isolation

    records: dict[str, list] = {name: [] for name in tasks}

    def events(name):
        def on_event(kind, payload):
            if kind == "record":
                records[name].append(payload[1])

        return on_event

    cells = [isolation.GroupCell(n, t, events(n)) for n, t in tasks.items()]
    first = next(iter(tasks.values()))
    isolation.run_group(
        cells, [1, 2], baseline, first.measure,
        policy or RoundPolicy(window_s=0.02, min_rounds=3, precision=0.5),
        retries, 300, ahead,
    )  # fmt: skip
    return records, {c.name: c.death for c in cells}


@pytest.mark.serial
def test_a_group_measures_its_engines_interleaved_and_pairs_the_speedup(tmp_path, monkeypatch):
    """...and while one member measures a window, the others are stopped (their runtimes'
    spinning thread pools would take its cores); all run again for their verdicts. Every
    window goes to the windows log when one is asked for."""
    import json

    import psutil

    from mlflow_ngraph.run import isolation

    tasks = {"id": _task(tmp_path, min_duration=0), "ts": _task(tmp_path, min_duration=0)}
    tasks["ts"].compiler = "torchscript"
    tasks["ts"].flags = {"freeze": True, "optimize_for_inference": True}
    others, verdicts = [], []
    real = isolation._Group.ask

    def ask(self, cell, command, kinds):
        rest = [c.worker.proc.pid for c in self.cells if c is not cell]
        statuses = [psutil.Process(pid).status() for pid in rest]
        (others if command[0] == "window" else verdicts).extend(statuses)
        return real(self, cell, command, kinds)

    isolation._Group.ask = ask
    monkeypatch.setenv(isolation.WINDOWS_LOG_ENV, str(tmp_path / "windows.jsonl"))
    monkeypatch.delenv("MLFLOW_NGRAPH_HOST_PROBE", raising=False)  # the default: the join
    started = time.time()
    try:
        records, deaths = _group(tmp_path, tasks, baseline="id")
    finally:
        isolation._Group.ask = real
        isolation.shutdown()
    ended = time.time()
    assert deaths == {"id": None, "ts": None}
    assert others and set(others) == {psutil.STATUS_STOPPED}
    assert verdicts and psutil.STATUS_STOPPED not in verdicts
    (base,), (ts,) = records["id"], records["ts"]
    assert base["status"] == ts["status"] == "OK"
    m, mb = ts["metrics"], base["metrics"]
    assert m["interleaved"] == mb["interleaved"] == 1.0
    assert m["windows"] == mb["windows"] >= 3  # one window each per round
    # the speedup is the paired rounds' estimate, inside its own interval; the ratio of the
    # two throughputs (samples over seconds of all windows) weighs rounds by their length,
    # so on a drifting host it may sit outside that interval, but not far from the speedup
    assert m["speedup_ci_low"] <= m["speedup_paired"] <= m["speedup_ci_high"]
    assert 0.67 < m["speedup_paired"] / (m["throughput"] / mb["throughput"]) < 1.5
    assert "speedup_ci_low" not in mb and m["host_drift"] == mb["host_drift"] >= 0
    assert _workers() == []
    lines = [json.loads(s) for s in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert [(x["batch_size"], x["baseline"], x["attempt"]) for x in lines] == [(1, "id", 1)]
    logged = lines[-1]["engines"]
    assert (
        len(logged["ts"]["windows"]) == m["windows"] and logged["ts"]["compiler"] == "torchscript"
    )
    assert all(w[3] > 0 for w in logged["id"]["windows"])  # the CPU seconds of each window
    # the host's join was read in the baseline's worker around every round (the runner
    # never imports PyTorch), and its median logged with the figures
    assert lines[-1]["host_probe"] == "join"
    readings = lines[-1]["host_readings"]
    assert len(readings) == m["windows"]
    if (os.cpu_count() or 1) >= 2:  # a pool of one thread has nothing to meet
        assert all(r > 0 for r in readings)
        assert 0 < m["host_state_rounds"] <= m["windows"] and m["host_join_rate"] > 0
    # when each window began (to set beside what the host logged then): one engine's windows
    # in turn, none while the other engine's ran
    spans = sorted((w[6], w[6] + w[2]) for e in logged.values() for w in e["windows"])
    assert started < spans[0][0] and spans[-1][1] < ended
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_an_unstable_group_is_measured_again_with_its_baseline(tmp_path):
    """A speedup judged UNSTABLE sends the whole group (its baseline too) back to the
    rounds after a pause; the last attempt is kept."""
    from mlflow_ngraph.plan.config import RunPolicy
    from mlflow_ngraph.run import isolation

    tasks = {"id": _task(tmp_path, min_duration=0), "ts": _task(tmp_path, min_duration=0)}
    tasks["ts"].compiler = "torchscript"
    tasks["ts"].flags = {"freeze": True, "optimize_for_inference": True}
    tasks["ts"].run = RunPolicy(max_interval=1e-12)  # no real interval is that narrow
    isolation.GROUP_RETRY_PAUSE_S = 0.0
    try:
        records, _ = _group(tmp_path, tasks, baseline="id", retries=1)
    finally:
        isolation.GROUP_RETRY_PAUSE_S = 2.0
        isolation.shutdown()
    (base,), (ts,) = records["id"], records["ts"]
    assert ts["stability"]["stable"] is False and "speedup interval" in ts["stability"]["reason"]
    assert ts["stability"]["attempts"] == base["stability"]["attempts"] == 2


@pytest.mark.parametrize("protocol", ["rounds", "paper"])
def test_a_baseline_that_moved_grossly_marks_the_speedups_divided_by_it(tmp_path, protocol):
    """The coordinator judges the baseline first and hands its gross move against the
    host's history to the engines whose speedups are divided by it: paired in its rounds,
    or (the paper's protocol, each engine alone) the ratio of their throughputs."""
    from types import SimpleNamespace

    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.measure.stability import Stability
    from mlflow_ngraph.plan.config import RunPolicy
    from mlflow_ngraph.run import isolation
    from mlflow_ngraph.run.worker import _remember

    # the baseline last: the coordinator must judge it first all the same
    tasks = {"ts": _task(tmp_path, min_duration=0), "id": _task(tmp_path, min_duration=0)}
    if protocol == "paper":
        paper = MeasureSettings(scenario="latency", protocol="paper", warmup=1, repetitions=5)
        tasks["ts"].measure = tasks["id"].measure = paper
        # five timed requests give a wide interval: the width is not what is tested
        tasks["ts"].run = tasks["id"].run = RunPolicy(max_interval=10.0)
    tasks["ts"].compiler = "torchscript"
    tasks["ts"].flags = {"freeze": True, "optimize_for_inference": True}
    seen = 1e9  # the identity engine once ran far faster on this host: its figure moved
    earlier = SimpleNamespace(
        batch_size=1, throughput=seen, throughput_ci_low=seen / 1.01, throughput_ci_high=seen,
        throughput_halfwidth=0.01, throughput_unscreened=None, speedup_paired=None,
        speedup_ci_low=None, speedup_ci_high=None, speedup_halfwidth=None,
        speedup_unscreened=None, host_other_cpu_percent=0.0, host_steal_percent=0.0,
        host_load_avg=0.5, windows_disturbed=0, windows=30,
    )  # fmt: skip
    _remember(tasks["id"], earlier, Stability(True), False)
    try:
        records, _ = _group(tmp_path, tasks, baseline="id")
    finally:
        isolation.shutdown()
    (base,), (ts,) = records["id"], records["ts"]
    assert "the throughput moved" in base["stability"]["reason"]
    assert ts["stability"]["stable"] is False
    assert "its baseline identity: the throughput moved" in ts["stability"]["reason"]


def test_spares_build_the_next_models_cells_and_are_stopped_while_a_group_measures(tmp_path):
    """The next model's workers import and build while this group prepares, are stopped
    (SIGSTOP) during its rounds, and its cells then measure the model they built."""
    import psutil

    from mlflow_ngraph.run import isolation

    log = tmp_path / "builds.txt"
    logged = {"log": str(log), "input_shape": "4"}
    ahead = [isolation.Ahead("tests.fixtures.models:build_logged", "identity", logged)]
    seen = []
    real = isolation._Proxy.window

    def window(self, seconds):
        seen.extend(psutil.Process(s.proc.pid).status() for _, s in isolation._spares)
        return real(self, seconds)

    isolation._Proxy.window = window
    try:
        _group(tmp_path, {"id": _task(tmp_path, min_duration=0)}, "id", ahead)
        ((_, spare),) = isolation._spares
        assert seen and set(seen) == {psutil.STATUS_STOPPED}
        deadline = time.monotonic() + 120
        while not (log.is_file() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)  # the spare builds the model before it has its task
        assert log.read_text().split() == [str(spare.proc.pid)]
        nxt = _task(tmp_path, "tests.fixtures.models:build_logged", logged, min_duration=0)
        records, deaths = _group(tmp_path, {"next": nxt}, "next")
        assert deaths == {"next": None} and records["next"][0]["status"] == "OK"
    finally:
        isolation._Proxy.window = real
        isolation.shutdown()
    assert log.read_text().split() == [str(spare.proc.pid)]  # not built again by its cell
    assert _workers() == []


def test_a_run_leaves_no_worker_behind(run_cli, tracking_uri):
    code, out, err = _run(run_cli, tracking_uri, [HEALTHY], "--compiler", "onnxruntime")
    assert code == 0, err
    assert _workers() == []


# --- reference outputs kept in the home -----------------------------------------------------
def _reference(tmp_path, name="conv_block", params=None, b=2):
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.run import worker
    from mlflow_ngraph.run.supply import EngineSupply

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

    from mlflow_ngraph.run import worker

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


def test_the_group_retry_line_names_compilers_not_cell_keys():
    from types import SimpleNamespace

    from mlflow_ngraph.run.isolation import _compiler_labels

    tasks = [
        SimpleNamespace(compiler="openvino", flags={"PERFORMANCE_HINT": "LATENCY"}),
        SimpleNamespace(compiler="openvino", flags={"PERFORMANCE_HINT": "THROUGHPUT"}),
        SimpleNamespace(compiler="onnxruntime", flags={"intra_op_num_threads": 0}),
    ]
    assert _compiler_labels(tasks) == [
        "openvino[PERFORMANCE_HINT=LATENCY]",
        "openvino[PERFORMANCE_HINT=THROUGHPUT]",
        "onnxruntime",
    ]


def test_a_group_refuses_one_cell_given_twice_before_starting_a_worker(tmp_path):
    # its coordinator would wait forever on the second for events the first consumed
    from mlflow_ngraph.measure.rounds import RoundPolicy
    from mlflow_ngraph.run import isolation

    task = _task(tmp_path)
    cells = [isolation.GroupCell("k", task, lambda *a: None) for _ in range(2)]
    with pytest.raises(ValueError, match="given twice"):
        isolation.run_group(cells, [1], None, task.measure, RoundPolicy(), 0, 30)
    assert all(c.worker is None for c in cells)


def test_a_windows_log_that_cannot_be_written_costs_one_warning_not_the_measurement(
    tmp_path, monkeypatch, caplog
):
    from types import SimpleNamespace

    from mlflow_ngraph.measure.harness import Window
    from mlflow_ngraph.run import isolation

    path = str(tmp_path / "missing" / "windows.jsonl")
    monkeypatch.setenv(isolation.WINDOWS_LOG_ENV, path)
    cell = SimpleNamespace(task=_task(tmp_path))
    proxy = SimpleNamespace(cell=cell, taken=[Window(1, 1, 0.1, 0.2)])
    with caplog.at_level("WARNING", logger="mlflow_ngraph.run.worker"):
        isolation._log_windows({"id": proxy}, 1, None, 1)
        isolation._log_windows({"id": proxy}, 2, None, 1)
    warned = [r for r in caplog.records if "cannot write the windows log" in r.getMessage()]
    assert len(warned) == 1 and path in warned[0].getMessage()


def test_the_hosts_join_is_read_in_a_process_of_its_own_stopped_between_readings():
    """The join is read where no engine is measured: a join read in the baseline's worker
    left PyTorch's threads spinning into that worker's next window (an A/A pair of ONNX
    Runtime workers read 1.02-1.05x, 1.0 inside 5 of 20 intervals). The reader is stopped
    between readings, forked again if it dies, and ended with the run; a join that raises
    is no reading, never a lost measurement."""
    import psutil

    from mlflow_ngraph.measure.hostprobe import JoinProbe
    from mlflow_ngraph.measure.rounds import RoundPolicy
    from mlflow_ngraph.run import isolation

    probe = JoinProbe().through(isolation._reader_read)
    try:
        first = probe.read()
        reader = isolation._reader
        assert psutil.Process(reader.proc.pid).status() == psutil.STATUS_STOPPED
        if (os.cpu_count() or 1) >= 2:  # a pool of one thread has nothing to meet
            assert first is not None and first > 100  # adds per second
        reader.kill()
        probe.read()
        assert isolation._reader is not reader and isolation._reader.alive()
        assert isolation._probe(RoundPolicy(screen=False)) is None  # a GPU engine's
    finally:
        isolation.shutdown()
    assert isolation._reader is None and _workers() == []

    def broken():
        raise RuntimeError("no pool")

    assert isolation._join_rate(broken) is None
