"""``benchmark --protocol paper`` end to end: each engine of the group timed alone, exactly
``--repetitions`` single inferences, the paper's figures logged, every t_i an artifact, the
speedup T_c / T_identity beside it, and cells of their own (a rounds run's keys unchanged)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import copy_empty_store

MODEL = "conv_block:width=8,depth=1,image_size=32"
REPETITIONS = 40
WARMUP = 3


def _benchmark(uri: str, home, experiment: str, *extra: str) -> None:
    from mlflow_ngraph.commands.cli import main

    args = ["benchmark", "--model", MODEL, "--batch-sizes", "1,2", "--compiler", "identity"]
    args += ["--compiler", "onnxruntime", "--warmup", str(WARMUP), "--min-duration", "0"]
    args += ["--experiment", experiment, "--tracking-uri", uri, "--home", str(home), *extra]
    main(args)


@pytest.fixture(scope="module")
def paper_runs(tmp_path_factory, empty_store):
    tmp = tmp_path_factory.mktemp("paper")
    uri = copy_empty_store(empty_store, tmp / "mlflow.db")
    home = tmp / "home"
    _benchmark(uri, home, "paper", "--scenario", "latency", "--protocol", "paper",
               "--repetitions", str(REPETITIONS))  # fmt: skip
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("paper")
    runs = client.search_runs([experiment.experiment_id])
    cells = {r.data.params["compiler"]: r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"}
    return client, cells, uri, home


def _times(client, run_id: str, b: int) -> list[float]:
    path = client.download_artifacts(run_id, S.times_file(b))
    rows = list(csv.DictReader(io.StringIO(open(path).read())))
    assert [int(r["request"]) for r in rows] == list(range(len(rows)))
    return [float(r["time_ms"]) for r in rows]


def test_each_figure_is_the_mean_of_exactly_the_requests_asked(paper_runs):
    client, cells, _, _ = paper_runs
    assert sorted(cells) == ["identity", "onnxruntime"]
    for run in cells.values():
        assert run.data.params["protocol"] == "paper"
        for b in (1, 2):
            metrics = run.data.metrics
            times = _times(client, run.info.run_id, b)
            assert len(times) == REPETITIONS
            assert metrics[f"{S.M_REPETITIONS}.bs{b}"] == REPETITIONS
            assert metrics[f"{S.M_LATENCY_SAMPLES}.bs{b}"] == REPETITIONS
            rates = b / (np.asarray(times) / 1000)
            assert metrics[f"{S.M_THROUGHPUT}.bs{b}"] == pytest.approx(rates.mean(), rel=1e-6)
            assert metrics[f"{S.M_THROUGHPUT_STD}.bs{b}"] == pytest.approx(
                rates.std(ddof=1), rel=1e-6
            )
            assert run.data.tags[f"{S.T_STOP_REASON}.bs{b}"] == "repetitions"
            assert f"{S.M_SPEEDUP_PAIRED}.bs{b}" not in metrics  # no rounds, no pairing


def test_the_speedup_is_the_ratio_of_the_two_means(paper_runs):
    _, cells, _, _ = paper_runs
    ort, identity = cells["onnxruntime"].data.metrics, cells["identity"].data.metrics
    for b in (1, 2):
        ratio = ort[f"throughput.bs{b}"] / identity[f"throughput.bs{b}"]
        assert ort[f"{S.M_SPEEDUP_RATIO}.bs{b}"] == pytest.approx(ratio, rel=1e-6)
        assert ort[f"{S.M_SPEEDUP}.bs{b}"] == pytest.approx(ratio, rel=1e-6)


def test_a_rounds_run_beside_it_measures_cells_of_its_own(paper_runs):
    client, cells, uri, home = paper_runs
    _benchmark(uri, home, "paper", "--scenario", "latency", "--repetitions", "3")
    runs = client.search_runs([cells["identity"].info.experiment_id])
    keys = {r.data.tags[S.T_CELL_KEY] for r in runs if r.data.tags.get(S.T_ROLE) == "cell"}
    assert len(keys) == 4  # two cells per protocol: neither took the other's results
    rounds = [
        r for r in runs
        if r.data.tags.get(S.T_ROLE) == "cell" and r.data.params["protocol"] == "rounds"
    ]  # fmt: skip
    ort = next(r for r in rounds if r.data.params["compiler"] == "onnxruntime").data.metrics
    # paired in rounds: the speedup is the paired estimate, the plain ratio logged beside it
    assert ort[f"{S.M_SPEEDUP}.bs1"] == pytest.approx(ort[f"{S.M_SPEEDUP_PAIRED}.bs1"])
    ratio = (
        ort["throughput.bs1"]
        / next(r for r in rounds if r.data.params["compiler"] == "identity").data.metrics[
            "throughput.bs1"
        ]
    )
    assert ort[f"{S.M_SPEEDUP_RATIO}.bs1"] == pytest.approx(ratio, rel=1e-6)


def test_the_paper_protocol_with_batched_engines_is_one_line(tmp_path, capsys):
    from mlflow_ngraph.commands.cli import main

    with pytest.raises(SystemExit) as done:
        main(["benchmark", "--model", MODEL, "--protocol", "paper", "--home", str(tmp_path)])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--scenario latency" in err[0]
