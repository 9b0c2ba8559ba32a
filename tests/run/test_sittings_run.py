"""``benchmark --sittings 2`` end to end: each group measured twice in fresh workers, every
figure the mean of its two sittings, each sitting in the host's history, the re-run
interval from the spread this run measured, settled over the whole run."""

from __future__ import annotations

import json
import math

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import copy_empty_store

MODELS = ["conv_block:width=8,depth=1,image_size=32", "mha_block:width=32,depth=1"]


@pytest.fixture(scope="module")
def two_sittings(tmp_path_factory, empty_store):
    from mlflow_ngraph.commands.cli import main

    tmp = tmp_path_factory.mktemp("sittings")
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")
    args = ["benchmark", "--batch-sizes", "1,2", "--compiler", "identity"]
    args += ["--compiler", "onnxruntime", "--warmup", "1", "--repetitions", "3"]
    args += ["--min-duration", "0", "--max-duration", "0.8", "--sittings", "2"]
    args += ["--experiment", "sit", "--tracking-uri", uri, "--home", str(tmp / "home")]
    for model in MODELS:
        args += ["--model", model]
    main(args)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("sit")
    runs = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'")
    return client, runs, tmp / "home"


def test_every_figure_is_the_mean_of_two_sittings_each_in_the_history(two_sittings):
    client, runs, home = two_sittings
    assert len(runs) == 4
    # each sitting of each engine entered the host's history: two lines per engine
    histories = [p for p in (home / "history").glob("*/*.jsonl")]
    sittings = [[json.loads(line) for line in p.read_text().splitlines()] for p in histories]
    assert len(sittings) == 8 and all(len(s) == 2 for s in sittings)
    means = sorted(math.sqrt(s[0]["throughput"] * s[1]["throughput"]) for s in sittings)
    logged = []
    for run in runs:
        for b in (1, 2):
            history = client.get_metric_history(run.info.run_id, S.M_SITTINGS)
            assert {(m.step, m.value) for m in history} == {(1, 2.0), (2, 2.0)}
            logged.append(run.data.metrics[f"{S.M_THROUGHPUT}.bs{b}"])
            said = run.data.tags[f"{S.T_SITTINGS}.bs{b}"]
            assert said.startswith("throughput ") and said.count("/s") == 2
    assert sorted(logged) == pytest.approx(means, rel=1e-9)


def test_the_sittings_are_spread_over_the_run_not_back_to_back(two_sittings):
    """Every model's first sitting, then every model's second: a model's two sittings are
    the whole run's other groups apart, so they see how the host moves over a run."""
    _, _, home = two_sittings
    times: dict[str, list[list[float]]] = {}
    for path in (home / "history").glob("*/*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        times.setdefault(lines[0]["family"], []).append([line["time"] for line in lines])
    conv, mha = times["conv_block"], times["mha_block"]
    assert max(t[0] for t in conv) < min(t[0] for t in mha)  # models in the spec's order
    assert max(t[0] for t in mha) < min(t[1] for t in conv)  # then the second sittings
    assert max(t[1] for t in conv) < min(t[1] for t in mha)


def test_the_rerun_interval_rests_on_this_runs_spread_settled_over_the_whole_run(two_sittings):
    _, runs, _ = two_sittings
    said = {run.data.tags[f"{S.T_RERUN}.bs{b}"] for run in runs for b in (1, 2)}
    for text in said:
        # the history holds only this run's sittings, so either the run measured the
        # spread or there is none yet; never an assumed one
        assert "from this run's 2 sittings" in text or text.startswith("none: fewer than")
    # settled at the run's end: the spread of the whole run, the same for every engine of
    # one kind of figure (the first group's results were logged before the second's
    # sittings existed)
    throughput = {
        run.data.tags[f"{S.T_RERUN}.bs{b}"]
        for run in runs
        if run.data.params[S.P_COMPILER] == "identity"
        for b in (1, 2)
    }
    assert len(throughput) == 1
    for run in runs:
        m = run.data.metrics
        if "from this run's" in run.data.tags[f"{S.T_RERUN}.bs1"]:
            assert m[f"{S.M_THROUGHPUT_RERUN_LOW}.bs1"] < m[f"{S.M_THROUGHPUT}.bs1"]
            assert m[f"{S.M_THROUGHPUT_RERUN_HIGH}.bs1"] > m[f"{S.M_THROUGHPUT}.bs1"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--sittings", "2", "--isolation", "none"], "needs --isolation process"),
        (["--sittings", "0"], "sittings must be at least 1"),
        (["--sittings", "2", "--scenario", "latency", "--protocol", "paper"], "--protocol rounds"),
    ],
)
def test_sittings_that_cannot_be_are_one_line(tmp_path, capsys, extra, says):
    from mlflow_ngraph.commands.cli import main

    with pytest.raises(SystemExit) as done:
        main(["benchmark", "--model", MODELS[0], "--home", str(tmp_path / "h"), *extra])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
