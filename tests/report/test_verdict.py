"""One verdict everywhere: the summary, compare's tables and the MLflow descriptions read
the same rules (measure/verdict.py): "beyond noise" only between two STABLE figures,
stability per batch size, the speedup's interval by one rule, the throughput ratio beside
the paired speedup where the two part, and a legend line for every column shown."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from report_data import Cell, log_benchmark, new_store, one, records_of

from mlflow_ngraph.commands.report import compare
from mlflow_ngraph.measure.legend import meaning
from mlflow_ngraph.measure.verdict import BEYOND_RUN, RERUN, SITTING, winners
from mlflow_ngraph.report.summary import SUMMARY_HEADERS, WINNER_HEADERS, format_summary
from mlflow_ngraph.tracking import ui
from mlflow_ngraph.tracking.sink import Row

SPEC = SimpleNamespace(
    device="cpu",
    experiment="e",
    measure=SimpleNamespace(scenario="throughput"),
    batch_sizes=[1, 8],
)


def _rows(rerun: bool = True) -> list[Row]:
    """Two batch sizes of one model: at bs1 every figure STABLE and the winner's lead
    beyond noise; at bs8 the next row UNSTABLE (its intervals would separate too). With
    ``rerun``, the speedups' re-run intervals (the host's spread measured) separate too."""
    rows = []
    ov_rerun, ort_rerun = ((2.7, 3.3), (1.8, 2.2)) if rerun else ((None, None), (None, None))
    for b, next_stable in ((1, True), (8, False)):
        rows += [
            Row("m", "identity", b, "OK", throughput=100.0, ci_low=98.0, ci_high=102.0,
                stable=True),
            Row("m", "openvino", b, "OK", throughput=300.0, ci_low=295.0, ci_high=305.0,
                speedup=3.0, speedup_ci_low=2.9, speedup_ci_high=3.1, speedup_ratio=3.0,
                paired=True, stable=True, speedup_rerun_low=ov_rerun[0],
                speedup_rerun_high=ov_rerun[1]),
            Row("m", "onnxruntime", b, "OK", throughput=200.0, ci_low=195.0, ci_high=205.0,
                speedup=2.0, speedup_ci_low=1.9, speedup_ci_high=2.1, speedup_ratio=2.0,
                paired=True, stable=next_stable, speedup_rerun_low=ort_rerun[0],
                speedup_rerun_high=ort_rerun[1]),
        ]  # fmt: skip
    return rows


def _table_lines(text: str) -> list[str]:
    """The lines of a summary that are table rows (not legend or sentences)."""
    return [line for line in text.splitlines() if line.startswith("m ")]


def test_beyond_noise_only_between_two_stable_figures_and_stability_per_batch_size():
    out = format_summary(_rows(), SPEC)
    winners = out.split("fastest valid compiler per model and batch size:")[1]
    bs1, bs8 = _table_lines(winners)
    assert "beyond noise" in bs1 and "UNSTABLE" not in bs1
    assert "not judged: next UNSTABLE" in bs8 and "beyond" not in bs8
    # each batch size's own mark, on its own row of the summary
    ort = [line for line in _table_lines(out.split("fastest")[0]) if "onnxruntime" in line]
    assert [line.split()[-1] for line in ort] == ["yes", "UNSTABLE"]
    for line in out.splitlines():  # no verdict of a lead beside an UNSTABLE mark
        if not line.startswith("  "):  # the legend's lines say what each word means
            assert not ("beyond noise" in line and "UNSTABLE" in line), line


def _winners(rows: list[Row]) -> list[dict]:
    for r in rows:
        r.label = r.compiler
    return winners(rows)


def test_a_lead_only_this_runs_intervals_judged_says_so():
    """Where the host has no spread between sittings yet (no re-run intervals), the sitting
    intervals judge the lead and the words say it: beyond this run's noise, not beyond a
    re-run's. Where re-run intervals exist they judge it, even against separate sitting
    intervals."""
    bs1 = [w for w in _winners(_rows(rerun=False)) if w["batch_size"] == 1][0]
    assert (bs1["noise"], bs1["judged_on"], bs1["beyond"]) == (BEYOND_RUN, SITTING, True)
    out = format_summary(_rows(rerun=False), SPEC)
    (line,) = _table_lines(out.split("fastest valid compiler per model and batch size:")[1])[:1]
    assert "beyond this run's noise" in line
    assert "beyond this run's noise: the host has no spread" in out  # the legend says what
    (won,) = [w for w in _winners(_rows()) if w["batch_size"] == 1]
    assert (won["noise"], won["judged_on"]) == ("beyond noise", RERUN)
    # the re-run intervals overlap while the sitting intervals separate: within noise
    rows = _rows()
    for r in rows:
        if r.compiler == "onnxruntime":
            r.speedup_rerun_high = 2.8
    (won,) = [w for w in _winners(rows) if w["batch_size"] == 1]
    assert (won["noise"], won["judged_on"], won["beyond"]) == ("within noise", RERUN, False)


def _shown_headers(table: str) -> list[str]:
    """The headers of a fixed-width table: its first line, split on runs of 2+ spaces."""
    return re.split(r"\s{2,}", table.splitlines()[0].strip())


def test_the_summary_explains_every_column_it_shows():
    out = format_summary(_rows(), SPEC)
    legend = {line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  ")}
    for header in [*SUMMARY_HEADERS, *WINNER_HEADERS]:
        assert meaning(header), header
        assert header in legend, header
    assert "payback" in legend and "drift %" in legend


def test_a_paired_speedup_that_parts_from_the_throughput_ratio_shows_both_with_the_reason():
    rows = _rows()[:3]
    # mha_block openvino bs8 on a busy host: 50.35x paired, 25x as a ratio of throughputs
    rows[1].speedup, rows[1].speedup_ci_low, rows[1].speedup_ci_high = 50.35, 48.0, 52.0
    rows[1].throughput, rows[1].ci_low, rows[1].ci_high = 2500.0, 2450.0, 2550.0
    rows[1].speedup_ratio = 25.0
    out = format_summary(rows, SPEC)
    row = next(line for line in _table_lines(out) if "openvino" in line)
    assert "50.35*" in row and "48.00-52.00" in row
    (note,) = [line for line in out.splitlines() if line.startswith("* m openvino bs1")]
    assert "50.35x paired [48.00-52.00]" in note and "throughput ratio 25.00x" in note
    assert "different windows" in note and "the paired one" in note
    # the onnxruntime row's ratio equals its paired speedup: one figure, no note
    assert "2.00*" not in out and len([x for x in out.splitlines() if x.startswith("* ")]) == 1


@pytest.fixture(scope="module")
def interval_store(tmp_path_factory):
    """resnet18 openvino bs8: a paired speedup whose rounds were too few for a signed-rank
    interval (none logged); the two throughputs have theirs. mha_block openvino bs8: a
    paired 50.35x [48-52] over throughputs whose ratio is 25x."""
    uri, client, exp = new_store(tmp_path_factory.mktemp("verdict-store"), "verdict")
    cells = [
        Cell("cpu", "resnet18", "resnet", "identity", {8: 20.0}, ci={8: (17.0, 23.0)}),
        Cell("cpu", "resnet18", "resnet", "openvino", {8: 105.0}, ci={8: (90.0, 120.0)},
             speedup_paired={8: 5.257}),
        Cell("cpu", "mha_block", "mha_block", "identity", {8: 10.0}, ci={8: (9.8, 10.2)}),
        Cell("cpu", "mha_block", "mha_block", "openvino", {8: 250.0}, ci={8: (245.0, 255.0)},
             speedup_paired={8: 50.35}, speedup_ci={8: (48.0, 52.0)},
             stability={8: "UNSTABLE"}),
    ]  # fmt: skip
    log_benchmark(client, exp, "cpu", cells)
    return uri


def _compare(uri: str, *args: str):
    return CliRunner().invoke(compare, ["--tracking-uri", uri, *args])


def test_the_summary_and_compare_show_one_speedup_interval(interval_store):
    """The benchmark's summary said "-" where compare said 5.257 [3.85-7.179]: the summary
    showed only a logged paired interval, compare fell back to the throughputs'. One rule
    now, in both."""
    row = one(records_of(_compare(interval_store, "--format", "json")),
              model="resnet18", compiler="openvino", batch_size=8)  # fmt: skip
    low, high = row["speedup_ci_low"], row["speedup_ci_high"]
    assert low < 5.257 < high
    rows = [
        Row("resnet18", "identity", 8, "OK", throughput=20.0, ci_low=17.0, ci_high=23.0),
        Row("resnet18", "openvino", 8, "OK", throughput=105.0, ci_low=90.0, ci_high=120.0,
            speedup=5.257, speedup_ratio=5.25, paired=True),
    ]  # fmt: skip
    out = format_summary(rows, SPEC)
    line = next(x for x in out.splitlines() if x.startswith("resnet18") and "openvino" in x)
    assert f"{low:.2f}-{high:.2f}" in line


def test_compare_shows_the_ratio_only_where_it_parts_and_explains_every_column(interval_store):
    rows = records_of(_compare(interval_store, "--format", "json"))
    mha = one(rows, model="mha_block", compiler="openvino", batch_size=8)
    assert mha["speedup"] == pytest.approx(50.35) and mha["throughput_ratio"] == pytest.approx(25)
    assert mha["speedup_ci_low"] == 48.0 and mha["throughput_ratio_ci_high"] < 48.0
    assert (
        one(rows, model="resnet18", compiler="openvino", batch_size=8)["throughput_ratio"] is None
    )
    result = _compare(interval_store, "--format", "markdown", "--table", "all")
    assert result.exit_code == 0, result.output
    for block in result.output.split("\n## ")[1:]:
        lines = block.splitlines()
        table = [line for line in lines if line.startswith("| ")]
        if not table:
            continue
        headers = [h.strip() for h in table[0].strip("| ").split(" | ")]
        explained = {line.split("`")[1] for line in lines if line.startswith("`")}
        assert set(headers) <= explained, (lines[0], set(headers) - explained)
    assert "throughput_ratio" in result.output


def _cells(line: str) -> list[str]:
    """A markdown table row's cells, without the view's ``&nbsp;`` padding."""
    if not line.startswith("|"):
        return []
    return [c.replace("&nbsp;", " ").strip() for c in line.strip().strip("|").split("|")]


def test_the_description_says_no_beyond_noise_beside_an_unstable_figure():
    rows = _rows()
    text = ui.description("cpu", SPEC, rows, "k", "1", ui.MAX_RUN_TAG)
    table = [" | ".join(_cells(line)) for line in text.splitlines() if _cells(line)[:1] == ["m"]]
    assert len(table) == 2
    assert "beyond noise" in table[0] and "UNSTABLE" not in table[0]
    assert "not judged: next UNSTABLE" in table[1] and "beyond" not in table[1]
    for column in ui.WINNER_COLUMNS:
        assert f"*{column}*: " in text, column
    note = ui.cell_note([r for r in rows if r.compiler == "onnxruntime"], [], "v")
    marks = [_cells(line)[-1] for line in note.splitlines()[4:6]]
    assert marks == ["yes", "**UNSTABLE**"]  # per batch size
    for column in ui.CELL_COLUMNS:
        assert f"*{column}*: " in note, column
