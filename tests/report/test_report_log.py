"""``compare --log-report``: a report run holding tables, figures and report.html."""

from __future__ import annotations

from report_data import records_of

from mlflow_ngraph.tracking import schema as S


def _files(client, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for item in client.list_artifacts(run_id, path):
        out |= _files(client, run_id, item.path) if item.is_dir else {item.path}
    return out


def test_log_report_run_and_artifacts(compare_cli, store, tmp_path):
    _, client = store
    # the small experiment: two figures are enough to check the page (drawing is slow)
    result = compare_cli("-e", "gpu-lab", "--log-report", "--table", "families")
    assert result.exit_code == 0, result.output
    run_id = result.stderr.split("report logged as run ")[1].split()[0]
    run = client.get_run(run_id)
    assert run.data.tags[S.T_ROLE] == "report"
    assert run.info.experiment_id == client.get_experiment_by_name("gpu-lab").experiment_id
    assert run.data.params["filter.experiment"] == "gpu-lab"
    assert run.data.metrics["cells"] > 0 and run.info.status == "FINISHED"

    files = _files(client, run_id)
    for table in ("cells", "families", "depth", "compile", "flips"):
        assert {f"tables/{table}.{ext}" for ext in ("csv", "md", "json")} <= files
    assert {"report.html", "tables.html", "sources.json"} <= files
    assert {f for f in files if f.startswith("plots/")} == {
        "plots/fig05_throughput_gpu.png",
        "plots/fig08_ase.png",
    }

    page = open(client.download_artifacts(run_id, "tables.html", str(tmp_path))).read()
    assert page.count('src="data:image/png;base64,') == 2  # both figures, embedded
    for title in ("Table VI", "Tables VII/VIII", "Table III", "Ranking flips", "Per-cell"):
        assert title in page
    # the HTML report, the same page compare wrote next to the store
    report = open(client.download_artifacts(run_id, "report.html", str(tmp_path))).read()
    written = result.stderr.split("report: ")[1].split("\n")[0]
    assert open(written, encoding="utf-8").read() == report
    assert "Plotly.newPlot" in report and "mlflow-ngraph compare: experiment gpu-lab" in report

    # the report run is no cell: a later compare reads the cell runs only
    cells = records_of(compare_cli("-e", "gpu-lab", "--format", "json"))
    assert run_id not in {r["run_id"] for r in cells}
