"""The loadgen command's logic without LoadGen runs: its settings, the reading of LoadGen's
logs, the Server search, the journal, its lines, and bad input as one line."""

from __future__ import annotations

import json
import logging
import time

import pytest

from mlflow_ngraph.commands.cli import main
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.loadgen.drive import LoadgenCell, line
from mlflow_ngraph.loadgen.record import LoadgenJournal
from mlflow_ngraph.loadgen.search import ServerSearch
from mlflow_ngraph.loadgen.settings import LoadgenSettings, parse_scenarios
from mlflow_ngraph.loadgen.summary import ScenarioResult, invalid_reason, parse_logs
from mlflow_ngraph.plan.config import ModelSpec


def mllog(key, value):
    return ":::MLLOG " + json.dumps({"key": key, "value": value, "time_ms": 1.0})


SERVER_SUMMARY = """Scenario : Server
Completed samples per second    : 194.48
Result is : INVALID
50.00 percentile latency (ns)   : 2251516
99.00 percentile latency (ns)   : 6328880
"""


def write_logs(folder, detail, summary=SERVER_SUMMARY):
    folder.mkdir(parents=True, exist_ok=True)
    lines = [mllog(k, v) for k, v in detail.items()] + ["torn {"]
    (folder / "mlperf_log_detail.txt").write_text("\n".join(lines))
    (folder / "mlperf_log_summary.txt").write_text(summary)


def test_the_scenarios_and_the_bound_are_checked():
    assert parse_scenarios(["Server,offline", "single-stream", "server"]) == (
        "server", "offline", "singlestream",
    )  # fmt: skip
    with pytest.raises(NgraphError, match="unknown scenario 'latency'"):
        LoadgenSettings(scenarios=("latency",))
    for bound in (0, -5):
        with pytest.raises(NgraphError, match="--latency-bound must be above 0"):
            LoadgenSettings(scenarios=("server",), latency_bound_ms=bound)
    with pytest.raises(NgraphError, match="not an http"):
        LoadgenSettings(scenarios=("server",), url="127.0.0.1:5001")
    a = LoadgenSettings(scenarios=("server",), latency_bound_ms=50)
    assert a.key() != LoadgenSettings(scenarios=("server",), latency_bound_ms=20).key()


def test_loadgen_s_verdict_and_figures_are_read_from_its_logs(tmp_path):
    valid = {"result_validity": "VALID", "result_completed_samples_per_sec": 194.479,
             "result_scheduled_samples_per_sec": 194.7, "result_query_count": 392}  # fmt: skip
    write_logs(tmp_path / "ok", valid)
    result = parse_logs("server", tmp_path / "ok")
    assert result.valid and result.figures["server.qps"] == pytest.approx(194.479)
    assert result.figures["server.p99_ms"] == pytest.approx(6.32888)
    invalid = {"result_validity": "INVALID", "result_perf_constraints_met": True,
               "result_min_duration_met": True, "early_stopping_met": False,
               "result_invalid_reason": "",
               "early_stopping_result": " * Run unsuccessful. * Processed 392 queries"}  # fmt: skip
    write_logs(tmp_path / "bad", invalid)
    result = parse_logs("server", tmp_path / "bad")
    assert not result.valid and result.validity == "INVALID"
    assert result.reason.startswith("early stopping was not satisfied")
    assert "Processed 392 queries" in result.reason
    assert ScenarioResult.from_dict(result.to_dict()) == result
    assert "no logs" in parse_logs("offline", tmp_path / "none").reason
    assert invalid_reason({"result_validity": "INVALID"}) == "LoadGen said INVALID"


def test_single_stream_reports_the_early_stopping_estimate(tmp_path):
    detail = {"result_validity": "VALID", "early_stopping_latency_ss": 2098079}
    write_logs(tmp_path, detail, "90.00 percentile latency (ns)   : 2096837\n")
    assert parse_logs("singlestream", tmp_path).figures["singlestream.p90_ms"] == 2.098079


def test_the_server_search_grows_then_bisects_to_the_highest_rate_that_holds():
    capacity = 130.0  # rates up to it hold
    search = ServerSearch(start_qps=80.0, steps=12)
    while (qps := search.next_qps()) is not None:
        search.report(qps, qps <= capacity)
    assert search.held <= capacity < search.failed
    assert search.failed / search.held - 1 <= 0.03 and "bracketed" in search.stop_reason
    assert [s.qps for s in search.done[:3]] == [80.0, 120.0, 180.0]
    down = ServerSearch(start_qps=100.0, steps=3)
    while (qps := down.next_qps()) is not None:
        down.report(qps, False)
    assert [s.qps for s in down.done] == [100.0, 50.0, 25.0] and down.held is None
    floor = ServerSearch(start_qps=100.0, steps=9, floor_qps=20.0)
    while (qps := floor.next_qps()) is not None:
        floor.report(qps, False)
    assert [s.qps for s in floor.done] == [100.0, 50.0, 25.0]  # 12.5 is under the floor
    assert "no lower rate holds it" in floor.stop_reason
    short = ServerSearch(start_qps=100.0, steps=5)
    short.report(short.next_qps(), False, needed=662)
    assert short.next_qps() is None and len(short.done) == 1  # no halving
    assert "raise --min-duration to at least 8 s" in short.stop_reason  # 1.1 x 662 / 100


def test_a_server_run_too_short_for_early_stopping_names_the_duration_it_needs(tmp_path):
    from mlflow_ngraph.loadgen.cell import too_short
    from mlflow_ngraph.loadgen.settings import early_stopping_floor

    assert early_stopping_floor() == 459  # LoadGen: 93 processed + 366 more, none over
    # a stream's early stopping allows one over: LoadGen asks "at least 64 / 662 queries"
    assert early_stopping_floor(0.90, over=1) == 64
    assert early_stopping_floor(0.99, over=1) == 662
    advice = (" * Run unsuccessful.  * Processed 120 queries.  * Would need to run at least "
              "542 more queries,  with the run being successful if every additional  query "
              "were under latency.")  # fmt: skip
    held = {"result_validity": "INVALID", "result_perf_constraints_met": True,
            "early_stopping_met": False, "early_stopping_result": advice,
            "result_query_count": 120, "result_overlatency_query_count": 1}  # fmt: skip
    write_logs(tmp_path / "held", held)
    assert too_short(parse_logs("server", tmp_path / "held")) == 662
    over = {**held, "result_perf_constraints_met": False}  # the p99 did not hold: go lower
    write_logs(tmp_path / "over", over)
    assert too_short(parse_logs("server", tmp_path / "over")) is None


def test_an_invalid_result_is_said_without_a_figure():
    settings = LoadgenSettings(scenarios=("server", "offline"))
    cell = LoadgenCell(ModelSpec("conv_block"), "openvino", {}, "cpu", settings)
    bad = ScenarioResult("server", False, "the latency bound was not held",
                         {"server.qps": 183.0, "server.p99_ms": 70.0})  # fmt: skip
    said = line(cell, "server", bad)
    assert "INVALID (the latency bound was not held)" in said
    assert "183" not in said and "QPS" not in said
    good = ScenarioResult("offline", True, "", {"offline.samples_per_s": 1234.5})
    assert line(cell, "offline", good).endswith("1234.5 samples/s (VALID)")


def test_the_journal_skips_a_torn_line(tmp_path):
    journal = LoadgenJournal(tmp_path, "sqlite:///x.db", "e", "cpu")
    journal.result(
        "c1", "offline", ScenarioResult("offline", True, "", {"offline.samples_per_s": 1.0})
    )
    journal.logged("c1", "offline")
    journal.result("c1", "server", ScenarioResult("server", False, "why"))
    text = journal.path.read_text().splitlines()
    journal.path.write_text("\n".join([*text[:2], text[2][:-9]]) + "\n")  # the last torn
    done, logged = journal.state("c1")
    assert set(done) == {"offline"} and logged == {"offline"}
    assert journal.state("other") == ({}, set())


@pytest.mark.parametrize(
    "args, says",
    [
        (["--scenario", "bogus"], "unknown scenario 'bogus'"),
        (["--scenario", "server", "--latency-bound", "0"], "--latency-bound must be above 0"),
        (["--scenario", "server", "--url", "http://127.0.0.1:9"], "nothing answers at"),
    ],
)
def test_bad_input_is_one_line(args, says, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_NGRAPH_HOME", str(tmp_path))
    argv = ["loadgen", "--model", "conv_block:width=8,depth=1,image_size=32", *args,
            "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and says in err and len(err.splitlines()) == 1


def test_the_server_table_gives_each_compiler_its_speedup_over_eager_and_no_invalid_figure():
    from mlflow_ngraph.loadgen.table import format_rows, with_speedups

    def row(compiler, value, validity="VALID", device="cpu"):
        return {"device": device, "model": "resnet18", "compiler": compiler, "target": "engine",
                "bound": "50", "validity": validity, "reason": "the latency bound was not held",
                "value": value, "p99": 40.0 if value else None}  # fmt: skip

    rows = with_speedups([row("identity", 50.0), row("openvino", 150.0), row("tvm", None,
                          "INVALID"), row("openvino", 99.0, device="gpu")], "server")  # fmt: skip
    assert [r["speedup"] for r in rows] == [1.0, 3.0, None, None]
    text = format_rows(rows, "server", width=400)
    assert "3.00x" in text and "150.0" in text and "INVALID: the latency bound" in text


def test_the_mlproject_loadgen_entry_point_is_the_command():
    import shlex

    from mlflow.projects.utils import load_project

    from mlflow_ngraph.commands.entrypoints import command_line
    from tests._support import REPO

    params = {"models": "resnet18 conv_block:width=8,depth=1", "compilers": "openvino",
              "latency_bound": "20"}  # fmt: skip
    entry = load_project(str(REPO)).get_entry_point("loadgen")
    words = shlex.split(entry.compute_command(params, None))
    assert "entrypoints/loadgen.py" in words and (REPO / "entrypoints/loadgen.py").is_file()
    args = command_line("loadgen", words[words.index("entrypoints/loadgen.py") + 1 :])
    assert args == [
        "loadgen", "--model", "resnet18", "--model", "conv_block:width=8,depth=1",
        "--compiler", "openvino", "--device", "cpu", "--scenario", "offline",
        "--scenario", "server", "--latency-bound", "20",
    ]  # fmt: skip


def test_benchmark_with_a_loadgen_scenario_is_the_loadgen_command(monkeypatch, tmp_path, capsys):
    from mlflow_ngraph.loadgen import drive

    planned = {}

    def plan(models, compilers, device, settings, home):
        planned.update(models=[m.label for m in models], compilers=compilers, settings=settings)
        raise NgraphError("planned")

    monkeypatch.setattr(drive, "plan_cells", plan)
    monkeypatch.setenv("MLFLOW_NGRAPH_HOME", str(tmp_path))
    argv = ["benchmark", "--model", "conv_block:width=8,depth=1", "--compiler", "onnxruntime",
            "--scenario", "server", "--min-duration", "5", "--batch-sizes", "2",
            "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]  # fmt: skip
    with pytest.raises(SystemExit):
        main(argv)
    assert "planned" in capsys.readouterr().err
    settings = planned["settings"]
    assert planned["models"] == ["conv_block:depth=1,width=8"]
    assert planned["compilers"] == [("onnxruntime", {})] and settings.scenarios == ("server",)
    assert settings.min_duration_s == 5 and settings.max_batch == 2
    assert settings.latency_bound_ms == 50  # loadgen's default
    with pytest.raises(SystemExit):
        main(["benchmark", "--scenario", "offline", "--spec", "smoke"])
    assert "give --model (not --spec)" in capsys.readouterr().err


def test_two_sweep_devices_of_one_profile_keep_their_own_cell_keys(monkeypatch):
    """In a sweep, a device's name (not its profile) is in the key: two ``cpu`` devices
    logging into one store keep their own runs; outside a sweep the key is the profile's."""
    from mlflow_ngraph.plan.config import ModelSpec
    from mlflow_ngraph.variables import ENV_DEVICE_NAME

    cell = LoadgenCell(ModelSpec("conv_block"), "identity", {}, "cpu",
                       LoadgenSettings(scenarios=("offline",)))  # fmt: skip
    monkeypatch.delenv(ENV_DEVICE_NAME, raising=False)
    alone = cell.key
    monkeypatch.setenv(ENV_DEVICE_NAME, "cpu")
    assert cell.key == alone
    monkeypatch.setenv(ENV_DEVICE_NAME, "cpu-b")
    b = cell.key
    monkeypatch.setenv(ENV_DEVICE_NAME, "cpu-c")
    assert len({alone, b, cell.key}) == 3


def test_the_http_runner_sends_again_on_a_fresh_connection_when_a_kept_alive_one_was_closed():
    """A scoring server closes an idle kept-alive connection (uvicorn after 5 s: the pause
    between two Server runs): the next request is sent on a fresh connection, not a failure.
    A server that answers nothing is still a failure."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import numpy as np

    from mlflow_ngraph.loadgen.runners import HttpRunner

    posts = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            posts.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            self.close_connection = True  # closed after answering, without saying so

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    runner = HttpRunner(url, np.zeros((4, 3), dtype=np.float32), batch=1, slots=1)
    try:
        for _ in range(3):
            runner.run(0, [0])
    finally:
        server.shutdown()
        server.server_close()
    assert posts == ["/invocations"] * 3
    with pytest.raises(OSError):
        runner.run(0, [0])  # nothing answers now: the fresh connection fails


class _Spin:
    """A runner of one slot whose batch takes 0.1 ms of CPU."""

    batch, slots = 1, 1

    def run(self, slot, indices):
        began = time.perf_counter()
        while time.perf_counter() - began < 1e-4:
            pass


@pytest.mark.parametrize("scenario", ["singlestream", "multistream"])
def test_a_stream_generated_for_a_slower_pace_runs_once_more_at_the_pace_it_measured(
    scenario, tmp_path, caplog
):
    """The pace is measured a moment before the run; where the host was busier then, the
    real LoadGen generated queries for a runner 20x slower, ran out of them before its
    minimum duration, and the scenario was INVALID (a loaded CI host's MultiStream)."""
    from mlflow_ngraph.loadgen.sut import run_scenario

    settings = LoadgenSettings(scenarios=(scenario,), min_duration_s=1.0)
    with caplog.at_level(logging.INFO, logger="mlflow_ngraph.loadgen.sut"):
        result = run_scenario(_Spin(), scenario, settings, tmp_path, (2e-3, 500.0))
    assert result.valid, result.reason
    assert result.details["result_min_duration_met"] is True
    assert f"{scenario} ended before its minimum duration" in caplog.text


class _Sleep:
    """A runner of one slot whose batch takes 0.4 ms (a MultiStream query: 3 ms or more)."""

    batch, slots = 1, 1

    def run(self, slot, indices):
        time.sleep(4e-4)


def test_a_stream_whose_minimum_duration_ends_before_early_stopping_can_pass_runs_on_to_it(
    tmp_path,
):
    """A MultiStream query of 8 batches at 3 ms or more fills 1 s with about 300 queries;
    LoadGen's early stopping judges p99 only from 662 (a loaded CI host's conv block at
    --min-duration 1 was INVALID for it). The run asks LoadGen for that many."""
    from mlflow_ngraph.loadgen.sut import run_scenario

    settings = LoadgenSettings(scenarios=("multistream",), min_duration_s=1.0)
    result = run_scenario(_Sleep(), "multistream", settings, tmp_path, (4e-4, 2500.0))
    assert result.valid, result.reason
    assert result.details["early_stopping_met"] is True
    assert result.details["result_query_count"] >= 662
    assert result.figures["multistream.p99_ms"] >= 8 * 0.4
