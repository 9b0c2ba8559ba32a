"""A benchmark ends with its HTML report: logged as ``report.html`` on its parent run and
written next to its store, the path said in one line (the suite's tiny benchmark)."""

from __future__ import annotations

from pathlib import Path

from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import TINY_STORE_COMPILERS, TINY_STORE_EXPERIMENT


def test_a_benchmark_logs_its_report_on_its_parent_and_writes_it_next_to_the_store(
    tiny_store: Path, tmp_path: Path
):
    client = MlflowClient(f"sqlite:///{tiny_store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(TINY_STORE_EXPERIMENT)
    (parent,) = client.search_runs([experiment.experiment_id], f"tags.`{S.T_ROLE}` = 'benchmark'")
    assert "report.html" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    logged = Path(client.download_artifacts(parent.info.run_id, "report.html", str(tmp_path)))

    said = [line for line in (tiny_store / "stdout").read_text().splitlines()
            if line.startswith("report: ")]  # fmt: skip
    assert len(said) == 1  # one line, at the end of the run
    written = Path(said[0].removeprefix("report: "))
    assert written.parent == tiny_store.resolve() and written.name.endswith(".html")
    page = written.read_text(encoding="utf-8")
    assert page == logged.read_text(encoding="utf-8")

    assert page.count("<section id=") == 1  # the one model
    assert page.count("* plotly.js v") == 1 and page.count("Plotly.newPlot") == 1
    for compiler in TINY_STORE_COMPILERS:
        assert f'"name":"{compiler}"' in page  # a line per compiler in the figure
    assert "Fastest valid compiler per batch size" in page
    assert f"<td>{parent.info.run_id}</td>" in page  # the environment of its parent run
