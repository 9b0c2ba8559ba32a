"""The store as the record of what is done: a host of the same device whose home is fresh
(no journal, as a retried sweep task on another node) measures only what the store lacks
and logs nothing twice."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import last_log

MEASURE = ["--warmup", "1", "--repetitions", "3", "--min-duration", "0"]
MODEL = ["--model", "conv_block:width=8,depth=1,image_size=32"]


def _args(uri: str, batch_sizes: str) -> list[str]:
    return ["benchmark", *MODEL, "--batch-sizes", batch_sizes, *MEASURE,
            "--compiler", "identity", "--compiler", "torchscript",
            "--experiment", "record", "--tracking-uri", uri]  # fmt: skip


def _records(home: Path, kind: str) -> list[dict]:
    (path,) = (home / "journals").glob("*.jsonl")
    return [json.loads(x) for x in path.read_text().splitlines() if f'"kind": "{kind}"' in x]


def _cells_once(uri: str) -> list:
    """The cell runs, after checking each holds every metric once per batch size."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("record")
    cells = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    ]
    assert len(cells) == 2
    for run in cells:
        for key in run.data.metrics:
            steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
            assert len(steps) == len(set(steps)), (run.info.run_name, key, steps)
    return cells


def _rows(out: str) -> list[list[str]]:
    """The summary's rows (model, compiler, batch size, status, throughput)."""
    return [line.split()[:5] for line in out.splitlines() if line.startswith("conv_block")]


def test_a_fresh_home_measures_nothing_the_store_holds(run_cli, tmp_path, tracking_uri):
    code, first, err = run_cli(*_args(tracking_uri, "1,2"), "--home", str(tmp_path / "a"))
    assert code == 0, err
    fresh = tmp_path / "b"
    code, second, err = run_cli(*_args(tracking_uri, "1,2"), "--home", str(fresh))
    assert code == 0, err
    assert "compiling" not in last_log(fresh)  # no worker measured anything
    assert err.count("the store already holds 2 result(s)") == 2
    measured = _records(fresh, "measured")
    assert len(measured) == 4 and all(r.get("from_store") for r in measured)
    assert len(_records(fresh, "logged")) == 4
    # the summary shows the results the store holds, speedups included
    assert second.count("(resumed)") == 4
    assert _rows(second) == _rows(first)
    for run in _cells_once(tracking_uri):
        assert run.data.tags[S.T_STATUS] == "OK"
        assert {"speedup.bs2", "rtr.bs2"} <= set(run.data.metrics)


def test_a_fresh_home_measures_only_the_batch_sizes_the_store_lacks(
    run_cli, tmp_path, tracking_uri
):
    code, _, err = run_cli(*_args(tracking_uri, "1"), "--home", str(tmp_path / "a"))
    assert code == 0, err
    fresh = tmp_path / "b"
    code, out, err = run_cli(*_args(tracking_uri, "1,2"), "--home", str(fresh))
    assert code == 0, err
    assert err.count("the store already holds 1 result(s)") == 2
    log = last_log(fresh)
    assert "bs1: compiling" not in log and "bs2: compiling" in log
    assert "compiling" not in err  # the machinery's lines are the log file's (and -v's)
    by_origin = {(r["batch_size"], bool(r.get("from_store"))) for r in _records(fresh, "measured")}
    assert by_origin == {(1, True), (2, False)}
    assert out.count("(resumed)") == 2
    for run in _cells_once(tracking_uri):
        assert {"throughput.bs1", "throughput.bs2", "rtr.bs2"} <= set(run.data.metrics)
        history = MlflowClient(tracking_uri).get_metric_history(run.info.run_id, "throughput")
        assert sorted(m.step for m in history) == [1, 2]


def test_a_result_whose_tags_never_landed_is_not_measured_again(run_cli, tmp_path, tracking_uri):
    """A writer killed between the store's commit of a result's metrics and of its tags
    leaves metrics without a status tag: a fresh home takes the metrics as the result (no
    value logged twice) and writes the missing tag."""
    code, _, err = run_cli(*_args(tracking_uri, "1"), "--home", str(tmp_path / "a"))
    assert code == 0, err
    client = MlflowClient(tracking_uri)
    torn = [r.info.run_id for r in _cells_once(tracking_uri)]
    for run_id in torn:
        client.delete_tag(run_id, f"{S.T_STATUS}.bs1")
    code, out, err = run_cli(*_args(tracking_uri, "1"), "--home", str(tmp_path / "b"))
    assert code == 0, err
    assert "bs1: compiling" not in last_log(tmp_path / "b") and out.count("(resumed)") == 2
    for run in _cells_once(tracking_uri):  # every metric still once per batch size
        assert run.data.tags[f"{S.T_STATUS}.bs1"] == "OK"


def test_a_result_read_back_from_the_store_says_what_it_said_when_logged(tracking_uri):
    """A result taken from the store (a fresh home, another machine's run) lost the guard's
    word on a move, the re-run interval's source, the sittings and the stop reason: the
    recorder writes them as tags, the read-back took the note and stability alone."""
    from mlflow_ngraph.tracking.mlflow_log import stored_results
    from mlflow_ngraph.tracking.recorder import CellRecorder

    client = MlflowClient(tracking_uri)
    run_id = client.create_run("0").info.run_id
    said = {
        "note": "cache hit",
        "stop_reason": "precision",
        "moved": "the throughput moved +31.0% against this engine measured at 09:20",
        "rerun": "measured: 1.2% between sittings over 14 df",
        "sittings_text": "throughput 100/s, 121/s",
    }
    stability = {"stable": True, "reason": "", "attempts": 2}
    record = {"metrics": {"throughput": 110.0}, "status": S.STATUS_OK, "stability": stability}
    CellRecorder(client, "0", "", log_engines=False).record(run_id, 4, record | said)
    measured, failed = stored_results(client, run_id, [1, 4])
    assert failed == {} and list(measured) == [4]
    back = measured[4]
    assert {k: back.get(k) for k in said} == said
    assert back["stability"] == stability and back["metrics"]["throughput"] == 110.0
