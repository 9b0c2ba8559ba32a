"""The end-of-run summary: rows are cells (compiler and flags), each with its own speedup,
and the fastest valid compiler per model and batch size is named."""

from __future__ import annotations

from types import SimpleNamespace

import mlflow
import pytest

from mlflow_ngraph.plan.cells import cell_run_name, differing_flags
from mlflow_ngraph.report.summary import format_summary
from mlflow_ngraph.tracking.sink import Row
from tests._support import TINY

LATENCY = "openvino:PERFORMANCE_HINT=LATENCY"
THROUGHPUT = "openvino:PERFORMANCE_HINT=THROUGHPUT"


def test_two_settings_of_one_compiler_are_two_rows_with_their_own_speedups(run_cli, tracking_uri):
    pytest.importorskip("openvino")
    code, out, err = run_cli(
        "benchmark",
        *TINY,
        "--compiler",
        "identity",
        "--compiler",
        LATENCY,
        "--compiler",
        THROUGHPUT,
        "--tracking-uri",
        tracking_uri,
        "--experiment",
        "two-flags",
    )
    assert code == 0, err
    client = mlflow.tracking.MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("two-flags")
    cells = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'")
    logged = {
        r.data.params["flag.PERFORMANCE_HINT"]: r
        for r in cells
        if r.data.params["compiler"] == "openvino"
    }
    assert set(logged) == {"LATENCY", "THROUGHPUT"}
    lines = out.splitlines()
    for hint, run in logged.items():
        label = f"openvino[PERFORMANCE_HINT={hint}]"
        assert run.info.run_name.endswith(label)  # short run names tell the settings apart
        for b in (1, 2):
            row = next(
                line.split()
                for line in lines
                if line.split()[1:3] == [label, str(b)] and "OK" in line.split()
            )
            speedup = run.data.metrics[f"speedup.bs{b}"]
            assert float(row[7]) == pytest.approx(speedup, abs=0.006)
    assert "fastest valid compiler per model and batch size:" in out


def _row(compiler, b, throughput, status="OK", flags=None, speedup=None):
    return Row("m", compiler, b, status, throughput=throughput, speedup=speedup, flags=flags or {})


def test_winner_is_the_fastest_valid_non_baseline_row():
    spec = SimpleNamespace(device="cpu", experiment="e", measure=SimpleNamespace(scenario="t"))
    rows = [
        _row("identity", 1, 100.0),
        _row("openvino", 1, 500.0, status="INVALID"),  # fastest, but outputs did not match
        _row("onnxruntime", 1, 300.0, flags={"threads": 1}, speedup=3.0),
        _row("onnxruntime", 1, 200.0, flags={"threads": 2}, speedup=2.0),
    ]
    out = format_summary(rows, spec, experiment="where-it-went")
    table = out.split("fastest valid compiler per model and batch size:")[1]
    winner = [line.split() for line in table.splitlines() if line.startswith("m ")]
    # no intervals measured: the lead is given, its noise is not judged
    assert winner == [
        ["m", "1", "onnxruntime[threads=1]", "300.0", "3.00x", "onnxruntime[threads=2]", "1.50x",
         "-", "-"]
    ]  # fmt: skip
    assert "experiment 'where-it-went'" in out.splitlines()[0]


def _winner_line(rows):
    spec = SimpleNamespace(device="cpu", experiment="e", measure=SimpleNamespace(scenario="t"))
    out = format_summary(rows, spec)
    table = out.split("fastest valid compiler per model and batch size:")[1]
    return out, next(line for line in table.splitlines() if line.startswith("m "))


def _not_legend(out: str) -> str:
    """The summary without its legend lines (they name UNSTABLE to explain it)."""
    return "\n".join(line for line in out.splitlines() if not line.startswith("  "))


def test_winner_lead_beyond_or_within_noise_and_its_stability():
    base = Row("m", "identity", 1, "OK", throughput=100.0, ci_low=95.0, ci_high=105.0, stable=True)
    ov = Row("m", "openvino", 1, "OK", throughput=300.0, ci_low=290.0, ci_high=310.0, stable=True)
    ort = Row("m", "onnxruntime", 1, "OK", throughput=250.0, ci_low=240.0, ci_high=260.0)
    ort.stable = True
    out, line = _winner_line([base, ov, ort])
    assert "openvino" in line and "onnxruntime" in line and "1.20x" in line
    assert "beyond this run's noise" in line and "UNSTABLE" not in _not_legend(out)
    ort.ci_high = 295.0  # the intervals overlap: the order is within noise
    _, line = _winner_line([base, ov, ort])
    assert "within noise" in line
    base.stable = False  # the baseline's noise is its own row's mark, not the lead's
    out, line = _winner_line([base, ov, ort])
    assert "within noise" in line and "UNSTABLE" not in line and line.endswith("yes")
    assert "1 of 3 measurements UNSTABLE after their re-measurements" in out
    ort.ci_high = 260.0  # the intervals separate, but the next row is noise: not judged
    ort.stable = False
    _, line = _winner_line([base, ov, ort])
    assert "not judged: next UNSTABLE" in line and "beyond" not in line
    ov.stable = False
    _, line = _winner_line([base, ov, ort])
    assert "not judged: winner and next UNSTABLE" in line and line.endswith("UNSTABLE")
    ort.stable, ov.stable, ort.ci_high = True, True, 295.0
    base.stable, ov.speedup_ci_low, ov.speedup_ci_high = True, 1.15, 1.25
    ov.speedup, ort.speedup = 1.2, 1.19
    ort.speedup_ci_low, ort.speedup_ci_high = 1.18, 1.22  # paired: the speedups overlap
    _, line = _winner_line([base, ov, ort])
    assert "within noise" in line
    ort.speedup, ort.speedup_ci_low, ort.speedup_ci_high = 1.1, 1.05, 1.12
    # separate, though the throughput intervals overlap
    _, line = _winner_line([base, ov, ort])
    assert "beyond this run's noise" in line


def test_the_winner_and_its_lead_come_from_the_paired_speedups_not_the_throughputs():
    # the throughputs were read in windows of different lengths and say the opposite order;
    # the speedups come from the same rounds and are what "beyond noise" judges
    rows = [
        Row("m", "identity", 4, "OK", throughput=17.3, stable=True),
        Row("m", "openvino", 4, "OK", throughput=31.0, speedup=1.49, speedup_ci_low=1.31,
            speedup_ci_high=1.59, stable=True),
        Row("m", "onnxruntime", 4, "OK", throughput=30.9, speedup=1.79, speedup_ci_low=1.66,
            speedup_ci_high=1.98, stable=True),
    ]  # fmt: skip
    _, line = _winner_line(rows)
    assert line.split()[:7] == ["m", "4", "onnxruntime", "30.9", "1.79x", "openvino", "1.20x"]
    assert "beyond this run's noise" in line
    rows[2].speedup = None  # one row unpaired: all are ranked on their throughputs
    _, line = _winner_line(rows)
    assert line.split()[2] == "openvino" and line.split()[6] == "1.00x"


def test_names_show_only_the_flags_that_differ():
    differing = differing_flags(
        [("ov", {"hint": "LATENCY", "streams": 2}), ("ov", {"hint": "THROUGHPUT", "streams": 2})]
    )
    assert differing == {"ov": {"hint"}}
    name = cell_run_name("conv_block:depth=3,width=64", "ov", {"hint": "LATENCY"}, {"hint"})
    assert name == "conv_block d3 w64 ov[hint=LATENCY]"
    assert cell_run_name("resnet18", "identity", {}, set()) == "resnet18 identity"


def test_summary_shows_the_interval_and_the_stability():
    spec = SimpleNamespace(device="cpu", experiment="e", measure=SimpleNamespace(scenario="t"))
    steady = Row("m", "identity", 1, "OK", throughput=100.0, ci_low=98.25, ci_high=101.5)
    noisy = Row("m", "openvino", 1, "OK", throughput=400.0, speedup=4.0, stable=False)
    lines = format_summary([steady, noisy], spec).splitlines()
    header = lines[1].split()
    assert header[3:6] == ["samples/s", "95%", "CI"]
    assert lines[3].split()[3:5] == ["100.0", "98.2-101.5"]
    assert lines[4].split()[4] == "-"  # no interval measured: said, not invented
    assert "UNSTABLE" in lines[4].split()


def test_one_table_printer_right_aligns_numbers():
    from mlflow_ngraph.table import format_table

    text = format_table(["name", "n", "note"], [["a", 5, None], ["bbb", 123.5, "x"]])
    assert text.splitlines() == [
        "name      n  note",
        "----  -----  ----",
        "a         5",
        "bbb   123.5  x",
    ]


def test_the_winners_table_marks_a_row_as_the_summary_does():
    spec = SimpleNamespace(device="cpu", experiment="e", measure=SimpleNamespace(scenario="t"))
    rows = [
        Row("m", "identity", 1, "OK", throughput=100.0, stable=False),
        Row("m", "openvino", 1, "OK", throughput=300.0, speedup=3.0, stable=True),
        Row("m", "onnxruntime", 1, "OK", throughput=250.0, speedup=2.5, stable=False),
        Row("m", "identity", 8, "OK", throughput=400.0, stable=True),
        Row("m", "openvino", 8, "OK", throughput=900.0, speedup=2.25, stable=False),
        Row("m", "onnxruntime", 8, "OK", throughput=500.0, speedup=1.25, stable=True),
    ]
    out = format_summary(rows, spec)
    summary, winners = out.split("fastest valid compiler per model and batch size:")
    marks = {}
    for line in summary.splitlines()[3:]:
        parts = line.split()
        if len(parts) > 3 and parts[0] == "m":
            marks[(parts[1], parts[2])] = "UNSTABLE" if "UNSTABLE" in parts else "yes"
    for line in winners.splitlines():
        parts = line.split()
        if parts and parts[0] == "m":
            assert parts[-1] == marks[(parts[2], parts[1])], line
    assert len([x for x in winners.splitlines() if x.startswith("m ")]) == 2


def test_in_a_terminal_the_summary_fits_its_width_and_each_panel_names_its_rows():
    spec = SimpleNamespace(device="cpu", experiment="e", measure=SimpleNamespace(scenario="t"))
    label = "resnet18-with-a-long-name"
    rows = [
        Row(label, "identity", 1, "OK", throughput=100.0, ci_low=98.25, ci_high=101.5,
            latency_p50_ms=10.0, cpu_percent=190.0, compile_s=0.5),
        Row(label, "openvino", 1, "OK", throughput=400.0, speedup=4.0, speedup_ci_low=3.9,
            speedup_ci_high=4.1, latency_p50_ms=2.5, cpu_percent=195.0, compile_s=3.25,
            stable=False, note="speedup interval +-6.1% is wider than +-5%"),
    ]  # fmt: skip
    whole = format_summary(rows, spec)
    assert max(len(line) for line in whole.splitlines()) > 100  # a pipe gets whole rows
    row = next(line for line in whole.splitlines() if "openvino" in line and "400.0" in line)
    assert "UNSTABLE" in row and "4.00" in row
    fitted = format_summary(rows, spec, width=100)
    lines = fitted.splitlines()
    assert max(len(line) for line in lines) <= 100
    # every panel repeats model, compiler and batch size: a wrapped row still says whose
    openvino_lines = [line for line in lines if "openvino" in line and label in line]
    assert len(openvino_lines) >= 3  # two panels of the summary and the winners table
    assert any("400.0" in line for line in openvino_lines)
    assert any("UNSTABLE" in line for line in openvino_lines)
