"""compare for a newcomer: its tables fit a 100-column terminal, an empty table says why and
what fills it, and a missing experiment names the command that fills it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from report_data import Cell, log_benchmark, model_cells, new_store

from mlflow_ngraph.commands.report import compare

WIDTH = 100


def _compare(uri: str, *args: str, columns: int = WIDTH):
    return CliRunner().invoke(
        compare, ["--tracking-uri", uri, *args], env={"COLUMNS": str(columns)}
    )


def test_every_table_fits_a_100_column_terminal_the_answer_first(store):
    uri, _ = store
    result = _compare(uri, "-e", "paper")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    header = lines[lines.index(next(x for x in lines if x.startswith("Per-cell"))) + 2]
    # the first panel names the row and answers: throughput, speedup, stability, status
    for column in ("model", "compiler", "bs", "throughput", "speedup", "stability", "status"):
        assert column in header.split(), header
    # a wide terminal gets the table in one piece
    wide = _compare(uri, "-e", "paper", "--table", "cells", columns=400)
    assert max(len(x) for x in wide.stdout.splitlines()) > WIDTH
    assert sum(1 for x in wide.stdout.splitlines() if x.split()[:1] == ["model"]) == 1


@pytest.fixture
def models_only(tmp_path):
    uri, client, exp = new_store(tmp_path, "ngraph-default")
    log_benchmark(client, exp, "cpu", model_cells())
    return uri, client, exp


def test_depth_tables_without_blocks_say_why_and_what_fills_them(models_only):
    uri, _, _ = models_only
    result = _compare(uri, "-e", "ngraph-default", "--table", "depth")
    assert result.exit_code == 0, result.output
    assert "(no rows: these runs hold no conv_block or mha_block; `mlflow-ngraph blocks " in (
        " ".join(result.stdout.split())  # the reason may wrap at the terminal's width
    )


def test_blocks_at_one_depth_get_a_note_naming_the_grid(models_only):
    uri, client, exp = models_only
    params = {"width": "64", "depth": "3"}
    log_benchmark(client, exp, "cpu", [
        Cell("cpu", "conv_block", "conv_block", "identity", {1: 20.0, 8: 100.0}, params),
        Cell("cpu", "conv_block", "conv_block", "openvino", {1: 40.0, 8: 300.0}, params),
    ])  # fmt: skip
    result = _compare(uri, "-e", "ngraph-default", "--table", "depth")
    assert result.exit_code == 0, result.output
    assert "each block was measured at one depth (conv_block d3)" in result.stderr
    assert "mlflow-ngraph blocks --small" in result.stderr


def test_an_experiment_not_filled_yet_names_the_command_that_fills_it(models_only):
    uri, _, _ = models_only
    result = _compare(uri, "-e", "ngraph-blocks")
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, result.stderr
    assert "no such experiment" in lines[0]
    assert "`mlflow-ngraph blocks --small` fills it" in lines[0]
    other = _compare(uri, "-e", "ngraph-typo").stderr
    assert "experiments there: " in other and "ngraph-default" in other
