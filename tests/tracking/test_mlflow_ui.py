"""What MLflow's UI shows of a benchmark: the designed view (its tag, its address, its
columns, sort and chart set), the descriptions with the winners table, the run colors; on a
real tiny benchmark in its own process, its store read back directly and through a real
``mlflow server`` on 127.0.0.1."""

from __future__ import annotations

import base64
import json
import math
import re
import subprocess
import urllib.request
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking import ui
from tests._support import (
    PYTHON,
    TINY_STORE_COMPILERS,
    TINY_STORE_EXPERIMENT,
    clone_store,
    free_port,
    wait_http,
)

COMPILERS = TINY_STORE_COMPILERS
BATCH_SIZES = (1, 2)  # TINY's


@pytest.fixture(scope="module")
def viewed(tiny_store, tmp_path_factory):
    """(client, experiment, parent run, cell runs, stdout) of one tiny benchmark."""
    uri = clone_store(tiny_store, tmp_path_factory.mktemp("ui") / "store", skip_home=True)
    done = SimpleNamespace(stdout=(tiny_store / "stdout").read_text())
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(TINY_STORE_EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get(S.T_ROLE) == "benchmark"]
    cells = [r for r in runs if r.data.tags.get(S.T_ROLE) == "cell"]
    return client, experiment, parent, cells, done.stdout, uri


def decode_view(value: str) -> dict:
    """The view state of a tag written by :func:`ui.encode_view` (or plain JSON), as MLflow's
    loader reads it."""
    data = json.loads(value)
    text = data["state"] if isinstance(data, dict) and "state" in data else value
    if isinstance(text, str) and text.startswith("deflate;"):
        text = zlib.decompress(base64.b64decode(text[len("deflate;") :])).decode()
    return json.loads(text) if isinstance(text, str) else text


def _state(experiment, key):
    value = experiment.tags[ui.VIEW_TAG_PREFIX + key]
    # what MLflow's loader checks of a saved-view envelope before it reads the state
    envelope = json.loads(value)
    assert isinstance(envelope["name"], str) and isinstance(envelope["createdAt"], int)
    assert isinstance(envelope["state"], str)
    return decode_view(value)


def _key(parent):
    return ui.view_key("cpu", parent.data.tags[S.T_SPEC_HASH])


def test_the_printed_address_opens_the_designed_view(viewed):
    client, experiment, parent, _, out, _ = viewed
    key = _key(parent)
    eid = experiment.experiment_id
    page = f"http://127.0.0.1:5000/#/experiments/{eid}/runs?viewStateShareKey={key}"
    assert f"answer: {page}&workflowType=machine_learning\n" in out
    assert f"charts: {page}&workflowType=machine_learning&compareRunsMode=CHART\n" in out
    state = _state(client.get_experiment(eid), key)
    # who, where it wins, then each batch size's rounded figures with their own stability
    expected = ["tags.`model`", "params.`compiler`", "tags.`fastest at`"]
    for b in BATCH_SIZES:
        figures = ("samples/s", "speedup", "speedup CI", "re-run CI")
        expected += [f"tags.`bs{b} {f}`" for f in figures]
        expected += [f"tags.`bs{b} lead`", f"tags.`bs{b} stable`"]
    expected += ["tags.`ngraph.status`", "params.`device`"]
    assert state["selectedColumns"] == expected == state["columnOrder"]
    assert state["columnWidths"]["attributes.`Run Name`"] == ui.NAME_WIDTH
    assert state["orderByKey"] == "metrics.`speedup.bs2`" and state["orderByAsc"] is False
    assert state["runsHiddenMode"] == "SHOW_ALL"


def test_the_view_filter_and_sort_run_on_the_store_winner_first(viewed):
    client, experiment, parent, cells, _, _ = viewed
    state = _state(experiment, _key(parent))
    order = state["orderByKey"] + (" ASC" if state["orderByAsc"] else " DESC")
    shown = client.search_runs(
        [experiment.experiment_id], filter_string=state["searchFilter"], order_by=[order]
    )
    assert sorted(r.info.run_id for r in shown) == sorted(r.info.run_id for r in cells)
    speedups = [r.data.metrics.get("speedup.bs2", float("-inf")) for r in shown]
    assert speedups == sorted(speedups, reverse=True)


def test_no_single_dot_chart_in_the_designed_set(viewed):
    client, experiment, parent, cells, _, _ = viewed

    def client_history(run, key):
        return client.get_metric_history(run.info.run_id, key)

    charts = _state(experiment, _key(parent))["compareRunCharts"]
    visible = [c for c in charts if not c["deleted"]]
    # one model: its panel of throughput and of speedup over batch size, nothing else
    title = "conv_block d1 image_size32 w8"
    assert [c["metricKey"] for c in visible] == [f"{title}/throughput", f"{title}/speedup"]
    for card in visible:
        assert card["type"] == "LINE" and card["xAxisKey"] == "step"
        assert card["selectedMetricKeys"] == [card["metricKey"], card["metricKey"] + " UNSTABLE"]
    # each cell run holds its model's copies at step = batch size, STABLE or not
    for run in cells:
        if run.data.tags[S.T_STATUS] != S.STATUS_OK:
            continue
        steps = []
        for stable in (True, False):
            key = S.view_metric(title, S.M_THROUGHPUT, stable)
            steps += [m.step for m in client_history(run, key)]
        assert sorted(steps) == [1, 2], run.info.run_name
    # MLflow adds a chart for every metric key its chart set lacks: every flat key is in it
    flat = {k for r in cells for k in r.data.metrics if S.parse_flat_key(k)}
    assert len(flat) > 20
    assert flat <= {c["metricKey"] for c in charts}
    hidden = {c["metricKey"] for c in charts if c["deleted"]}
    assert flat <= hidden
    sections = {s["uuid"]: s for s in _state(experiment, _key(parent))["compareRunSections"]}
    assert sections[ui.MORE_SECTION]["display"] is False


def test_descriptions_hold_the_winners_table_with_stability(viewed):
    client, experiment, parent, _, _, _ = viewed
    key = _key(parent)
    for note in (
        client.get_experiment(experiment.experiment_id).tags[ui.NOTE_TAG],
        parent.data.tags[ui.NOTE_TAG],
    ):
        assert ui.section_title("cpu", key) in note
        assert f"viewStateShareKey={key}" in note
        (verdict,) = [line for line in note.splitlines() if line.startswith("- conv_block")]
        assert re.search(r": fastest \*\*(torchscript|onnxruntime)\*\* at batch", verdict)
        rows = [line for line in note.splitlines() if line.startswith("|&nbsp;conv_block d1 ")]
        assert [cells_of(row)[1] for row in rows] == ["1", "2"]
        for row in rows:
            stable = cells_of(row)[-1]
            # the winner's own mark, then which of its figures (own, next, baseline) are noise
            mark = re.fullmatch(
                r"(yes|-|\*\*UNSTABLE\*\*)( \(((own|next|baseline)(, )?)+\))?", stable
            )
            assert mark, row
            assert (mark[1] == "**UNSTABLE**") == ("own" in (mark[2] or "")), row
            winner = re.fullmatch(
                r"\*\*\[(\w+)\]\(#/experiments/(\w+)/runs/(\w+)"
                r"\?workflowType=machine_learning\)\*\*",
                cells_of(row)[2],
            )
            assert winner and winner[1] in ("torchscript", "onnxruntime"), row
            run = client.get_run(winner[3])  # the link opens the winner's run
            assert run.data.params["compiler"] == winner[1]


def cells_of(row: str) -> list[str]:
    """The cells of a markdown row written by ``ui``: each padded with ``&nbsp;``."""
    cells = row.strip("|").split("|")
    assert all(c.startswith("&nbsp;") and c.endswith("&nbsp;") for c in cells), row
    return [c[len("&nbsp;") : -len("&nbsp;")] for c in cells]


def test_each_cell_run_describes_its_figures_and_leads_to_the_view(viewed):
    client, _, parent, cells, _, _ = viewed
    note = client.get_experiment_by_name(TINY_STORE_EXPERIMENT).tags[ui.NOTE_TAG]
    winners = set(re.findall(r"/runs/(\w+)\?workflowType", note))
    for run in cells:
        text = run.data.tags[ui.NOTE_TAG]
        assert f"viewStateShareKey={_key(parent)}" in text
        rows = [cells_of(line) for line in text.splitlines() if line.startswith("|&nbsp;")]
        assert [row[0] for row in rows[1:]] == ["1", "2"]
        assert ("Fastest for its model at batch" in text) == (run.info.run_id in winners)


def test_cell_runs_have_one_color_per_compiler(viewed):
    _, _, _, cells, _, _ = viewed
    colors = {r.data.params["compiler"]: r.data.tags[ui.RUN_COLOR_TAG] for r in cells}
    assert sorted(colors) == sorted(COMPILERS)
    # one colour per compiler: no two compilers alike, each a colour the UI draws
    assert len(set(colors.values())) == len(colors), colors
    assert all(re.fullmatch(r"#[0-9a-fA-F]{6}", c) for c in colors.values()), colors


def test_the_tracking_server_hands_the_view_to_the_ui(viewed, tmp_path):
    """The experiment page reads the view through the server's API, as the browser does."""
    _, experiment, parent, _, _, uri = viewed
    port = free_port()
    server = subprocess.Popen(
        [str(Path(PYTHON).with_name("mlflow")), "server", "--backend-store-uri", uri,
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/get"
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server)
        answer = urllib.request.urlopen(f"{url}?experiment_id={experiment.experiment_id}")
        tags = {t["key"]: t["value"] for t in json.loads(answer.read())["experiment"]["tags"]}
    finally:
        server.terminate()
        server.wait(30)
    state = decode_view(tags[ui.VIEW_TAG_PREFIX + _key(parent)])
    assert state["orderByKey"] == "metrics.`speedup.bs2`"
    assert tags[ui.NOTE_TAG].startswith(ui.section_title("cpu", _key(parent)))


def test_a_new_section_keeps_the_hand_written_text_and_the_other_views():
    own = "Notes by hand: run on the quiet host."
    first = ui.merge_sections(own, "ngraph-cpu-a", "### cpu: x (view ngraph-cpu-a)\nA", 20000)
    second = ui.merge_sections(first, "ngraph-gpu-b", "### gpu: x (view ngraph-gpu-b)\nB", 20000)
    again = ui.merge_sections(second, "ngraph-cpu-a", "### cpu: x (view ngraph-cpu-a)\nA2", 20000)
    assert again.startswith(own)
    assert "A2" in again and "\nA\n" not in again + "\n" and "\nB" in again
    assert again.count("(view ngraph-cpu-a)") == 1
    cut = ui.merge_sections(again, "ngraph-cpu-a", "### cpu: x (view ngraph-cpu-a)\nA3", 80)
    assert "(view ngraph-gpu-b)" not in cut and "A3" in cut


def test_a_long_view_is_deflated_as_mlflow_reads_it():
    def encoded(batch_sizes):
        keys = [S.flat_key(m, b) for m in sorted(S.FLAT_METRICS) for b in batch_sizes]
        state = ui.view_state("cpu", batch_sizes, [], keys)
        value = ui.encode_view("v", state)
        assert len(value) <= ui.MAX_EXPERIMENT_TAG
        return state, value

    state, value = encoded(list(range(1, 33)))  # 32 batch sizes: ~700 hidden cards
    assert json.loads(value)["state"].startswith("deflate;")
    assert decode_view(value) == state
    # too many to hide even deflated: the hidden cards go, what is drawn stays
    state, value = encoded(list(range(1, 400)))
    shown = decode_view(value)
    assert shown["compareRunCharts"] == [c for c in state["compareRunCharts"] if not c["deleted"]]
    # and the columns of the smallest batch sizes
    assert state["selectedColumns"][: len(shown["selectedColumns"])] == shown["selectedColumns"]


def _rows():
    """Two blocks of one name (other depth and width) three orders of magnitude apart, at
    batch 1 and 8: each its own winner per batch size, one UNSTABLE noise point."""
    from mlflow_ngraph.tracking.sink import Row

    small, large = "mha_block:depth=2,width=64", "mha_block:depth=3,width=256"
    out = []
    for model, scale in ((small, 1000.0), (large, 1.0)):
        for b in (1, 8):
            figures = {"identity": 1.0, "onnxruntime": 2.0 if b == 1 else 1.5}
            figures["openvino"] = 1.5 if b == 1 else 3.0
            for compiler, speedup in figures.items():
                out.append(
                    Row(model, compiler, b, "OK", throughput=scale * b * speedup,
                        speedup=speedup, speedup_ci_low=speedup * 0.9,
                        speedup_ci_high=speedup * 1.1, stable=True)
                )  # fmt: skip
    noise = Row(large, "torchscript", 8, "OK", throughput=66.0 * 8, speedup=66.0, stable=False)
    return [*out, noise]


def test_the_view_groups_by_model_as_the_summary_names_it():
    state = ui.view_state("cpu", [1, 8], _rows(), [])
    assert state["groupBy"] == {
        "aggregateFunction": "max",
        "groupByKeys": [{"mode": "tag", "groupByData": ui.MODEL_TAG}],
    }
    assert state["groupsExpanded"] == {} and state["useGroupedValuesInCharts"] is False
    # the two mha_blocks are two models, each with a section of its own, in the order of
    # the table's groups (the highest speedup at batch 8 first: the 66x one's model)
    names = [s["name"] for s in state["compareRunSections"]]
    assert names == ["mha_block d3 w256", "mha_block d2 w64", ui.MLFLOW_METRICS_SECTION]
    assert [s["columns"] for s in state["compareRunSections"]] == [2, 2, 2]
    assert state["isAccordionReordered"] is True  # else MLflow sorts the sections by name


def test_one_panel_per_model_on_batch_size_its_noise_out_of_range():
    rows = _rows()
    charts = [c for c in ui.view_state("cpu", [1, 8], rows, [])["compareRunCharts"]]
    panels = {c["metricKey"]: c for c in charts if not c["deleted"]}
    assert sorted(panels) == sorted(
        f"mha_block {m}/{k}" for m in ("d2 w64", "d3 w256") for k in ("throughput", "speedup")
    )
    for key, card in panels.items():
        section = card["metricSectionId"]
        assert section == ("ngraph-model-1" if "d2 w64" in key else "ngraph-model-0"), key
        assert card["xAxisKey"] == "step" and card["xAxisScaleType"] == "log"  # 1 to 8
        assert card["range"]["xMin"] < 0 < math.log10(8) < card["range"]["xMax"]
    # the small block's throughput (1000-24000 samples/s) on a log axis too
    assert panels["mha_block d2 w64/throughput"]["scaleType"] == "log"
    # the large block's throughput spans 1 to 24 samples/s: a log axis, in log10 units
    throughput = panels["mha_block d3 w256/throughput"]
    assert throughput["scaleType"] == "log"
    assert throughput["range"]["yMin"] < 0 and 1.38 < throughput["range"]["yMax"] < 1.6
    # its speedups 1-3x are STABLE; the 66x UNSTABLE one is drawn apart, out of the range
    speedup = panels["mha_block d3 w256/speedup"]
    assert speedup["scaleType"] == "linear" and 3.0 < speedup["range"]["yMax"] < 4
    assert speedup["selectedMetricKeys"][1] == "mha_block d3 w256/speedup UNSTABLE"
    noise = [p for p in ui.view_points([rows[-1]]) if p[0].endswith("/speedup UNSTABLE")]
    assert noise == [("mha_block d3 w256/speedup UNSTABLE", 66.0, 8)]
    assert S.is_schema_metric(noise[0][0]) and not S.is_schema_metric("x/made_up")
    # a model's parameters as a metric key allows them (no ``=``)
    assert (
        ui.metric_title("conv_block:depth=1,image_size=32,width=8")
        == "conv_block d1 image_size32 w8"
    )
    from mlflow.utils.validation import _validate_metric_name

    _validate_metric_name(S.view_metric(ui.metric_title("m:image_size=32"), "speedup", False))
    # the per-model copies never draw twice: every one not on a panel is a deleted card
    keys = [p[0] for r in rows for p in ui.view_points([r])]
    hidden = ui.view_state("cpu", [1, 8], rows, keys)["compareRunCharts"]
    assert {c["metricKey"] for c in hidden if c["deleted"]} == {
        f"mha_block d3 w256/{k} UNSTABLE" for k in ("throughput", "speedup")
    }


def test_rounded_figures_lead_and_stability_per_batch_size():
    rows = _rows()
    lead = ui.leads(rows)
    large = [r for r in rows if r.model.endswith("width=256")]
    onnx = [r for r in large if r.compiler == "onnxruntime"]
    tags = ui.figure_tags(onnx, lead, [1])
    assert tags[ui.MODEL_TAG] == "mha_block d3 w256" and tags[ui.FASTEST_TAG] == "bs1"
    # batch 1: fastest, 2.0 over openvino's 1.5; batch 8: third of four, behind noise
    expected = ["2.00", "2.00x", "1.80-2.20", "-", "1.33x", "STABLE"]
    assert [tags[f"bs1 {f}"] for f in ui.FIGURES] == expected
    assert tags["bs8 samples/s"] == "12.0" and tags["bs8 lead"] == "1.50x"
    noise = ui.figure_tags([large[-1]], lead, [])
    assert noise["bs8 stable"] == "UNSTABLE" and noise[ui.FASTEST_TAG] == "-"
    assert noise["bs8 speedup CI"] == "-" and noise["bs8 lead"] == "22.00x"
    small = ui.figure_tags([r for r in rows if r.model.endswith("width=64")][:1], lead, [])
    assert small["bs1 samples/s"] == "1000" and small["bs1 lead"] == "-"  # identity: slowest
    # MLflow's tag keys allow these names
    from mlflow.utils.validation import _validate_tag_name

    for key in tags:
        _validate_tag_name(key)


def test_the_view_shows_both_intervals_of_a_figure_as_the_summary_does():
    from mlflow_ngraph.measure.verdict import settle
    from mlflow_ngraph.tracking.sink import Row

    model = "conv_block:depth=1,width=8"
    eager = Row(model, "identity", 1, "OK", throughput=100.0, ci_low=98.0, ci_high=102.0,
                rerun_low=90.0, rerun_high=111.0, stable=True)  # fmt: skip
    paired = Row(model, "onnxruntime", 1, "OK", throughput=200.0, speedup=2.0,
                 speedup_ci_low=1.9, speedup_ci_high=2.1, speedup_rerun_low=1.7,
                 speedup_rerun_high=2.3, stable=True)  # fmt: skip
    # measured apart from eager: no paired interval; the summary shows the one the two
    # throughputs' intervals give, and so must the view (it showed "-")
    apart = Row(model, "tvm", 1, "OK", throughput=150.0, ci_low=147.0, ci_high=153.0,
                speedup=1.5, stable=True)  # fmt: skip
    rows = [eager, paired, apart]
    settle(rows)
    lead = ui.leads(rows)
    figures = {r.compiler: ui.figure_tags([r], lead, []) for r in rows}
    assert figures["onnxruntime"]["bs1 re-run CI"] == "1.70-2.30"  # the speedup's
    assert figures["identity"]["bs1 re-run CI"] == "90.0-111.0"  # eager's throughput's
    tvm = figures["tvm"]
    assert (tvm["bs1 speedup CI"], tvm["bs1 re-run CI"]) == ("1.46-1.54", "-")
    note = ui.cell_note([paired], [], "v")
    header = cells_of(note.splitlines()[2])
    assert header == list(ui.CELL_COLUMNS)
    cells = dict(zip(header, cells_of(note.splitlines()[4]), strict=True))
    assert (cells["speedup CI"], cells["speedup re-run"]) == ("1.90-2.10", "1.70-2.30")
    assert "*re-run*: none yet" not in note
    # no row has a re-run interval: the note says why, in one line
    alone = ui.cell_note([apart], [], "v")
    assert "*re-run*: none yet: this host's spread needs measuring" in alone


def test_the_winners_table_is_padded_and_links_the_model_training_view():
    rows = _rows()
    best = ui.ranked(rows)
    link = ui.run_address("7", "abc")
    assert link == "#/experiments/7/runs/abc?workflowType=machine_learning"
    lines = ui.winners_markdown(best, {("mha_block d2 w64", "onnxruntime"): link})
    header, rule, *body = lines
    assert header.startswith("|&nbsp;model&nbsp;|&nbsp;batch&nbsp;|")
    assert rule.count("|") == header.count("|")
    first = body[0].strip("|").split("|")
    assert first[:2] == ["&nbsp;mha_block d2 w64&nbsp;", "&nbsp;1&nbsp;"]
    assert first[2] == f"&nbsp;**[onnxruntime]({link})**&nbsp;"
    # every cell of every row padded on both sides: no figure runs into the next
    for line in body:
        assert all(c.startswith("&nbsp;") and c.endswith("&nbsp;") for c in line[1:-1].split("|"))
    assert ui.view_address("", "7", "k").endswith("&workflowType=machine_learning")


def test_a_model_whose_every_figure_is_noise_keeps_its_log_scale_and_no_range():
    from mlflow_ngraph.tracking.sink import Row

    rows = [
        Row("m", "identity", 1, "OK", throughput=6.6, speedup=1.0, stable=False),
        Row("m", "onnxruntime", 1, "OK", throughput=1362.0, speedup=206.0, stable=False),
    ]
    (throughput, speedup) = [c for c in ui.answer_charts([1], rows)]
    assert throughput["scaleType"] == "log" and "yMin" not in throughput["range"]
    assert speedup["scaleType"] == "log"
    # one batch size: a linear x axis around it
    assert throughput["xAxisScaleType"] == "linear"
    assert throughput["range"]["xMin"] < 1 < throughput["range"]["xMax"]
