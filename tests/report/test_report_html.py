"""The HTML report: a section per model, Plotly figures with interval bands, UNSTABLE points
hollow, the summary's winners rows, the store's text escaped, plotly.js inlined once."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from mlflow_ngraph.measure.verdict import winners
from mlflow_ngraph.report import html_report, tables
from mlflow_ngraph.report.query import runs_to_frame
from mlflow_ngraph.report.runsource import RunData
from mlflow_ngraph.report.summary import winner_cells
from mlflow_ngraph.tracking import schema as S

EVIL = "<script>alert(1)</script>"
DECODER = json.JSONDecoder()
UNSTABLE_WHY = "interval 31% wider than --max-interval"
MOVED = f"the throughput moved 3.18x lower against this engine measured at 06:24 {EVIL}"


def _run(run_id: str, model: str, compiler: str, figures: dict, marks: dict,
         **tags: str) -> RunData:  # fmt: skip
    """A cell run as the store holds it: ``figures`` batch -> {metric: value} (flat keys),
    ``marks`` batch -> (STABLE/UNSTABLE, reason)."""
    metrics = {S.flat_key(m, b): v for b, values in figures.items() for m, v in values.items()}
    tags = {S.T_ROLE: "cell", S.T_STATUS: S.STATUS_OK, S.T_PARENT: "parent", **tags}
    for b, (mark, why) in marks.items():
        tags[f"{S.T_STABILITY}.bs{b}"] = mark
        if why:
            tags[f"{S.T_STABILITY_REASON}.bs{b}"] = why
    params = {S.P_DEVICE: "cpu", S.P_MODEL: model, S.P_COMPILER: compiler, S.P_SCENARIO: "t"}
    return RunData(run_id, "1", len(run_id), params, tags, metrics)


def _t(value: float, low: float, high: float, **more: float) -> dict:
    return {S.M_THROUGHPUT: value, S.M_THROUGHPUT_CI_LOW: low, S.M_THROUGHPUT_CI_HIGH: high,
            S.M_REPETITIONS: 10, **more}  # fmt: skip


STABLE = (S.STABILITY_STABLE, "")


def _frame():
    """Two models: ``resnet18`` (openvino twice eager's at batch 1 and 8, its batch 8
    UNSTABLE with a reason and a 66x paired speedup: noise) and a model whose name is a
    script; re-run intervals on resnet18's openvino."""
    runs = [
        _run("a1", "resnet18", "identity", {1: _t(100, 98, 102), 8: _t(400, 390, 410)},
             {1: STABLE, 8: STABLE}),
        _run("a2", "resnet18", "openvino",
             {1: _t(200, 196, 204, speedup_paired=2.0, speedup_ci_low=1.9, speedup_ci_high=2.1,
                    throughput_rerun_low=180, throughput_rerun_high=220),
              8: _t(800, 500, 1100, speedup_paired=66.0, speedup_ci_low=1.5,
                    speedup_ci_high=90.0)},
             {1: STABLE, 8: (S.STABILITY_UNSTABLE, UNSTABLE_WHY)}),
        _run("b1", EVIL, "identity", {1: _t(10, 9, 11)}, {1: STABLE}),
        _run("b2", EVIL, "onnxruntime", {1: _t(30, 29, 31)}, {1: STABLE},
             **{f"{S.T_MOVED}.bs1": MOVED}),
    ]  # fmt: skip
    frame, _ = tables.prepare(runs_to_frame(runs, tables.READ_METRICS))
    return frame


@pytest.fixture(scope="module")
def frame():
    return _frame()


@pytest.fixture(scope="module")
def page(frame) -> str:
    return html_report.page(frame, "report", [{"host": f"h{EVIL}", "device": "cpu"}])


def _figures(page: str) -> list[tuple[list, dict]]:
    """The data and layout of every Plotly figure on the page."""
    out = []
    calls = page.split("Plotly.newPlot(")[1:]
    for call in calls:
        arguments = call.split(",", 1)[1]  # after the div's id
        data, end = DECODER.raw_decode(arguments.lstrip())
        layout, _ = DECODER.raw_decode(arguments.lstrip()[end:].lstrip(", \n"))
        out.append((data, layout))
    return out


def test_a_section_and_a_figure_per_model_and_plotly_js_inlined_once(page):
    assert page.count("<section id=") == 2
    assert "<h2>resnet18</h2>" in page
    assert len(_figures(page)) == 2
    assert page.count("* plotly.js v") == 1  # the library once, for every figure
    assert page.index("* plotly.js v") < page.index("Plotly.newPlot")
    assert "<script src=" not in page  # nothing fetched: it works offline


def _resnet_traces(page: str) -> list[dict]:
    data, _ = next(f for f in _figures(page) if any(t.get("name") == "openvino" for t in f[0]))
    return data


def test_points_have_their_interval_bands_and_unstable_points_are_hollow(page):
    data = _resnet_traces(page)
    line = next(t for t in data if t.get("name") == "openvino" and t["yaxis"] == "y")
    assert line["x"] == [1, 8] and line["y"] == [200, 800]
    assert line["marker"]["symbol"] == ["circle", "circle-open"]  # batch 8 is UNSTABLE
    assert "UNSTABLE" not in line["text"][0]
    assert "UNSTABLE" in line["text"][1] and UNSTABLE_WHY in line["text"][1]
    bands = [t for t in data if t.get("fill") == "toself" and t["yaxis"] == "y"]
    sitting = next(t for t in bands if 1100 in t["y"])  # openvino's 95% interval
    assert sorted(sitting["y"]) == [196, 204, 500, 1100] and sitting["x"] == [1, 8, 8, 1]
    rerun = next(t for t in data if t.get("line", {}).get("dash") == "dot")
    assert rerun["x"] == [1, 1] and rerun["y"] == [220, 180]  # the re-run interval, logged at 1
    bars = line["error_y"]  # this run's interval on each point (a lone point has no band)
    assert bars["array"] == [4, 300] and bars["arrayminus"] == [4, 300]
    speedup = next(t for t in data if t.get("mode") == "lines+markers" and t["yaxis"] == "y2")
    assert speedup["y"] == [2.0, 66.0] and speedup["marker"]["symbol"][1] == "circle-open"


def test_an_unstable_outlier_does_not_set_the_speedup_axis(page):
    _, layout = next(f for f in _figures(page) if any(t.get("name") == "openvino" for t in f[0]))
    low, high = layout["yaxis2"]["range"]
    assert low <= 1.0 and 2.1 <= high < 5  # the STABLE 2x and its interval, not the 66x
    (arrow,) = layout["annotations"]  # which says where the 66x is
    assert arrow["yref"] == "y2" and high * 0.95 < arrow["y"] < high
    assert arrow["x"] == pytest.approx(math.log10(8))  # batch 8, on a log axis
    assert arrow["text"].startswith("66 UNSTABLE")
    # an UNSTABLE figure near the STABLE ones stays on its axis (800 within 3x of 410)
    assert layout["yaxis"]["range"][1] > 800 and layout["xaxis"]["tickvals"] == [1, 8]


def _td(cell: object, header: str = "") -> str:
    if str(cell) == "UNSTABLE":
        return '<td class="unstable"><b>UNSTABLE</b></td>'
    if header == "stable":  # words, read from the left as the UNSTABLE and moved cells are
        return f'<td class="mark">{html_report.esc(cell)}</td>'
    return f"<td>{html_report.esc(cell)}</td>"


def test_the_winners_rows_are_the_summarys(page, frame):
    part = html_report.keyed(frame)
    best = winners(html_report.verdict_rows(part))
    headers, rows = winner_cells(best)
    assert headers[:3] == ["model", "bs", "compiler"]
    assert sorted(tuple(map(str, r[:3])) for r in rows) == [
        (EVIL, "1", "onnxruntime"),
        ("resnet18", "1", "openvino"),
        ("resnet18", "8", "openvino"),
    ]
    marks = {(r[0], r[1]): r[8] for r in rows}
    assert marks[("resnet18", 8)] == "UNSTABLE" and marks[("resnet18", 1)] == "yes"
    for row in rows:  # each as the page shows it, cell by cell
        assert f"<tr>{''.join(_td(c, h) for c, h in zip(row, headers))}</tr>" in page
    assert "2.00x" in page and "beyond noise" in page


def test_text_from_the_store_is_escaped(page):
    assert EVIL not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # in headings and tables
    for data, _ in _figures(page):  # and in the figures' labels (Plotly renders HTML)
        assert all("<script" not in json.dumps(t) for t in data)


def test_a_figure_the_guard_said_moved_says_so_in_its_row_and_its_point(page):
    """The guard's word (``ngraph.moved.bs<b>``) reached only the benchmark's terminal."""
    said = html_report.esc(MOVED)
    assert f'<td class="moved">yes<span class="why">moved: {said}</span></td>' in page
    data, _ = next(f for f in _figures(page) if any(t.get("name") == "onnxruntime" for t in f[0]))
    point = next(t for t in data if t.get("name") == "onnxruntime" and t["yaxis"] == "y")
    assert f"<b>moved</b>: {said}" in point["text"][0]
    resnet = next(t for t in _resnet_traces(page) if t.get("name") == "openvino")
    assert not any("moved" in text for text in resnet["text"])


def test_the_paper_metrics_and_the_environment(page):
    assert all(f"<th>{m}</th>" in page for m in ("RTR", "ASE", "BSR"))
    # resnet18 openvino: RTR at 8 = 800 / 200 = 4, ASE = 0.5, BSR = 0.5 / (400/100/8) = 1
    assert "<td>4</td><td>0.5</td><td>1</td>" in page
    assert f'<b>UNSTABLE</b><span class="why">{UNSTABLE_WHY}</span>' in page  # and why
    assert "<h2>Environment</h2>" in page and "<td>h&lt;script&gt;" in page


def test_the_page_is_written_next_to_a_local_store(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "s" / "mlflow.db"
    assert html_report.report_path(f"sqlite:///{db}", "r e/p") == tmp_path / "s" / "r-e-p.html"
    assert html_report.report_path(str(tmp_path / "mlruns"), "r") == tmp_path / "r.html"
    assert html_report.report_path("file:///x/mlruns", "r") == Path("/x/r.html")
    assert html_report.report_path("http://server:5000", "r") == tmp_path / "r.html"


def test_a_benchmarks_page_holds_its_own_cells_and_their_baselines(tracking_uri, tmp_path):
    """Logged on the parent as report.html and written beside the store: the parent's cells
    and the identity baseline another invocation measured, not that one's other cells."""
    from mlflow.tracking import MlflowClient
    from report_data import R18, Cell, log_benchmark

    client = MlflowClient(tracking_uri)
    experiment = client.create_experiment("pages", artifact_location=str(tmp_path / "art"))
    identity = Cell("cpu", R18, "resnet", "identity", {1: 100.0, 8: 300.0})
    openvino = Cell("cpu", R18, "resnet", "openvino", {1: 150.0, 8: 600.0})
    log_benchmark(client, experiment, "cpu", [identity, openvino])
    onnx = Cell("cpu", R18, "resnet", "onnxruntime", {1: 120.0, 8: 900.0})
    parent = log_benchmark(client, experiment, "cpu", [onnx])

    path = html_report.benchmark_report(client, tracking_uri, parent)
    assert path == tmp_path / "ngraph-report-pages-cpu.html"
    page = path.read_text(encoding="utf-8")
    logged = client.download_artifacts(parent, html_report.ARTIFACT, str(tmp_path / "dl"))
    assert Path(logged).read_text(encoding="utf-8") == page
    (figure,) = _figures(page)
    names = {t["name"] for t in figure[0] if "name" in t}
    assert names == {"identity", "onnxruntime"}  # openvino is the other invocation's
    assert "<td>resnet18</td><td>8</td><td>onnxruntime</td><td>900.0</td><td>3.00x</td>" in page
