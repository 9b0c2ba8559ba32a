"""The compare command: formats, filters, and one clear line for every bad input."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from report_data import DEIT, R18, one, records_of


def error_line(result) -> str:
    """The single error line, after checking it is the only one and there is no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    return lines[-1]


def test_help(compare_cli):
    result = compare_cli("--help")
    assert result.exit_code == 0
    for option in ("--experiment", "--device", "--model", "--family", "--compiler",
                   "--batch-size", "--valid-only", "--format", "--plots", "--log-report",
                   "--ranges", "--table", "--tracking-uri", "--where"):  # fmt: skip
        assert option in result.output


def test_terminal_default_prints_every_table(compare_cli):
    result = compare_cli("-e", "paper")
    assert result.exit_code == 0, result.output
    for title in ("Per-cell results", "Table VI", "Tables VII/VIII", "Table III", "Ranking flips"):
        assert title in result.stdout
    assert "640 ± 6.4" in result.stdout  # throughput with its std
    assert "run_id" not in result.stdout  # bookkeeping columns stay out of the terminal
    assert "1 older run(s) of a re-measured cell left out" in result.stderr


def test_json_has_one_record_per_cell(compare_cli):
    cells = records_of(compare_cli("-e", "paper", "--format", "json", "--model", R18))
    keys = {"device", "model", "compiler", "batch_size", "throughput", "speedup", "rtr", "ase"}
    assert all(keys | {"bsr", "missing", "run_id"} <= set(r) for r in cells)
    assert {r["compiler"] for r in cells} == {"identity", "openvino", "tvm"}
    assert len(cells) == 4 + 4 + 2


def test_csv_is_the_cell_table(compare_cli):
    result = compare_cli("-e", "paper", "--format", "csv", "--model", DEIT, "--batch-size", "8")
    frame = pd.read_csv(io.StringIO(result.stdout))
    assert list(frame["compiler"]) == ["identity", "openvino"]  # tvm failed: no batch 8
    assert frame.loc[1, "speedup"] == 5.0
    assert frame.loc[1, "bsr"] == pytest.approx((1000 / 150 / 8) / (200 / 50 / 8), rel=1e-12)


def test_markdown_and_several_tables_in_json(compare_cli):
    md = compare_cli("-e", "paper", "--format", "markdown", "--table", "families")
    assert md.stdout.startswith("## Table VI") and "| family | compiler |" in md.stdout
    both = records_of(compare_cli("--format", "json", "--table", "depth,flips"))
    assert set(both) == {"depth", "flips"}


def test_filters_keep_the_baselines(compare_cli):
    """A compiler or batch-size filter hides the identity and batch 1 but keeps using them."""
    cells = records_of(compare_cli("--format", "json", "--compiler", "openvino",
                                   "--batch-size", "4,8", "--family", "resnet"))  # fmt: skip
    assert {(r["model"], r["batch_size"]) for r in cells} == {
        (m, b) for m in (R18, "resnet50") for b in (4, 8)
    }
    assert one(cells, model=R18, batch_size=8)["bsr"] == pytest.approx(0.6 / 0.4, rel=1e-12)


def test_where_filters_on_model_params_and_flags(compare_cli):
    wide = records_of(compare_cli("--format", "json", "--where", "model.width=96"))
    assert {r["model"] for r in wide} == {
        "conv_block:depth=2,width=96",
        "conv_block:depth=4,width=96",
    }
    flagged = records_of(compare_cli("--format", "json", "--where", "flag.hint=throughput",
                                     "--model", R18))  # fmt: skip
    assert {r["compiler"] for r in flagged} == {"openvino"}
    assert one(flagged, batch_size=8)["speedup"] == 3.0  # the identity was still read


def test_valid_only(compare_cli):
    cells = records_of(compare_cli("-e", "paper", "--format", "json", "--valid-only"))
    assert {r["status"] for r in cells} == {"OK"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-e", "nope"], "no runs match --experiment 'nope': no such experiment"),
        (["--device", "tpu"], "no runs match --device tpu (with the filters before it)"),
        (["--device", "cpu", "--family", "swin"], "no runs match --family swin"),
        (["-e", "paper", "--compiler", "tensorrt"],
         "no runs match --compiler tensorrt (with the filters before it)"),
        (["--batch-size", "64"], "no runs match --batch-size 64 (measured: 1, 2, 4, 8, 16)"),
        (["--where", "model.width=512"], "no runs match --where model.width=512"),
    ],
)  # fmt: skip
def test_no_match_names_the_filter(compare_cli, args, message):
    assert message in error_line(compare_cli(*args))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--format", "xml"], "Invalid value for '--format'"),
        (["--table", "bogus"], "unknown --table 'bogus'"),
        (["--where", "colour=red"], "unknown filter key 'colour'"),
        (["--where", "model.width"], "--where 'model.width': expected KEY=VALUE"),
        (["--batch-size", "eight"], "--batch-size 'eight' is not an integer"),
        (["--ranges", "8-2"], "--ranges range '8-2' is empty (expected LOW-HIGH"),
        (["--devise", "cpu"], "No such option '--devise'"),
        # a store that cannot be opened: said at once, not after MLflow's minutes of retries
        (["--tracking-uri", "sqlite:////etc/passwd/x.db"], "lies under '/etc/passwd'"),
        (["--tracking-uri", "htp://127.0.0.1:5000"], "unknown scheme 'htp'"),
    ],
)
def test_bad_input_is_one_clear_line(compare_cli, args, message):
    assert message in error_line(compare_cli(*args))
