"""``compare --sweep ID``: the runs of one sweep, its devices side by side, from the results
indexes and from a live search alike."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from report_data import R18, log_benchmark, model_cells, new_store, records_of

from mlflow_ngraph.commands.report import compare


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    uri, client, exp = new_store(tmp_path_factory.mktemp("sweeps"), "swept")

    def on(device):
        return [replace(c, device=device) for c in model_cells() if c.model == R18]

    log_benchmark(client, exp, "xeon-a", on("xeon-a"), sweep="aaaa11112222")
    log_benchmark(client, exp, "orin-1", on("orin-1"), sweep="aaaa11112222")
    log_benchmark(client, exp, "xeon-b", on("xeon-b"), sweep="bbbb33334444")
    log_benchmark(client, exp, "xeon-c", on("xeon-c"))  # a plain benchmark, in no sweep
    return uri


def _run(uri, *args):
    return CliRunner().invoke(
        compare, ["--tracking-uri", uri, "-e", "swept", *args], catch_exceptions=False
    )


@pytest.mark.parametrize("live", [False, True])
def test_sweep_keeps_its_own_devices(swept, live):
    args = ["--sweep", "aaaa11112222", "--format", "json", "--table", "cells"]
    cells = records_of(_run(swept, *args, *(["--live"] if live else [])))
    assert {c["device"] for c in cells} == {"xeon-a", "orin-1"}
    assert {c["compiler"] for c in cells} >= {"identity", "openvino"}
    assert all(c["speedup"] is not None for c in cells if c["compiler"] == "openvino")
    both = records_of(
        _run(swept, "--sweep", "aaaa11112222,bbbb33334444", "--format", "json", "--table", "cells")
    )
    assert {c["device"] for c in both} == {"xeon-a", "orin-1", "xeon-b"}


def test_unknown_sweep_is_one_line(swept):
    result = _run(swept, "--sweep", "nosuchsweep")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("no runs match --sweep nosuchsweep: no run of such a sweep")
    )
