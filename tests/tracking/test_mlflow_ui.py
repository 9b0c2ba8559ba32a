"""What MLflow's UI shows of a benchmark: the designed view (its tag, its address, its
columns, sort and chart set), the descriptions with the winners table, the run colors; on a
real tiny benchmark in its own process, its store read back directly and through a real
``mlflow server`` on 127.0.0.1."""

from __future__ import annotations

import base64
import json
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
    # who, the answer at the sorted batch size, the verdicts, then the other batch sizes
    expected = ["params.`model`", "params.`compiler`"]
    expected += ["metrics.`speedup.bs2`", "metrics.`throughput.bs2`"]
    expected += ["tags.`ngraph.stability`", "tags.`ngraph.status`", "params.`device`"]
    expected += ["metrics.`throughput.bs1`", "metrics.`speedup.bs1`"]
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
    _, experiment, parent, cells, _, _ = viewed
    charts = _state(experiment, _key(parent))["compareRunCharts"]
    visible = [c for c in charts if not c["deleted"]]
    assert [c["type"] for c in visible] == ["LINE", "LINE", "BAR", "BAR"]
    for card in visible:
        if S.parse_flat_key(card["metricKey"]):
            assert card["type"] == "BAR"  # one value per run: runs side by side
        else:
            assert card["metricKey"] in S.METRICS and card["xAxisKey"] == "step"
    # MLflow adds a chart for every metric key its chart set lacks: every flat key is in it
    flat = {k for r in cells for k in r.data.metrics if S.parse_flat_key(k)}
    assert len(flat) > 20
    assert flat <= {c["metricKey"] for c in charts}
    hidden = {c["metricKey"] for c in charts if c["deleted"]}
    assert flat - hidden == {"speedup.bs2", "throughput.bs2"}
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
        rows = [line for line in note.splitlines() if line.startswith("| conv_block")]
        assert [row.split(" | ")[1] for row in rows] == ["1", "2"]
        for row in rows:
            stable = row.rstrip(" |").rsplit(" | ", 1)[-1]
            # the winner's own mark, then which of its figures (own, next, baseline) are noise
            mark = re.fullmatch(
                r"(yes|-|\*\*UNSTABLE\*\*)( \(((own|next|baseline)(, )?)+\))?", stable
            )
            assert mark, row
            assert (mark[1] == "**UNSTABLE**") == ("own" in (mark[2] or "")), row
            winner = re.fullmatch(
                r"\*\*\[(\w+)\]\(#/experiments/(\w+)/runs/(\w+)"
                r"\?workflowType=machine_learning\)\*\*",
                row.split(" | ")[2],
            )
            assert winner and winner[1] in ("torchscript", "onnxruntime"), row
            run = client.get_run(winner[3])  # the link opens the winner's run
            assert run.data.params["compiler"] == winner[1]


def test_each_cell_run_describes_its_figures_and_leads_to_the_view(viewed):
    client, _, parent, cells, _, _ = viewed
    note = client.get_experiment_by_name(TINY_STORE_EXPERIMENT).tags[ui.NOTE_TAG]
    winners = set(re.findall(r"/runs/(\w+)\?workflowType", note))
    for run in cells:
        text = run.data.tags[ui.NOTE_TAG]
        assert f"viewStateShareKey={_key(parent)}" in text
        batches = [line.split(" | ")[0] for line in text.splitlines() if line[:3] in ("| 1", "| 2")]
        assert batches == ["| 1", "| 2"]
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
    cards = decode_view(value)["compareRunCharts"]
    assert cards == [c for c in state["compareRunCharts"] if not c["deleted"]]
