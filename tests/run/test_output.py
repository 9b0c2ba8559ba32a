"""The terminal shows results, not machinery: one line per cell (its stability and failures
folded in), a bounded header, the summary; the compiling, loading and re-measuring lines go
to ``-v`` and always to the invocation's log file in the home."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from mlflow_ngraph import console
from mlflow_ngraph.measure.stability import short_reason
from mlflow_ngraph.run.live import cell_results
from mlflow_ngraph.tracking.sink import Row
from tests._support import TINY, last_log

RAISING = "tests.fixtures.crashing:raising:input_shape=4"
CELL_LINE = re.compile(r"^\[\d+/\d+\] ")
#: what the terminal's machinery was before: none of it may reach the terminal without -v
MACHINERY = ("compiling", "engine cache hit", "measuring the group again", "measuring again")


def test_a_run_prints_one_line_per_cell_and_its_machinery_only_to_the_log(run_cli, home):
    """Two models (one that cannot be built) x two compilers, every figure UNSTABLE (no
    measurement is known to +-1e-9) and measured again: four cell lines, the header, the
    summary; the log file holds every compile, re-measurement and full reason."""
    code, out, err = run_cli(
        "benchmark", *TINY, "--model", RAISING, "--compiler", "identity",
        "--compiler", "torchscript", "--max-interval", "1e-9", "--stable-retries", "1",
        "--tracking-uri", f"sqlite:///{home.parent / 'out.db'}",
    )  # fmt: skip
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    cells = [line for line in lines if CELL_LINE.match(line)]
    assert len(cells) == 4, lines
    measured = [line for line in cells if "conv_block" in line]
    failed = [line for line in cells if "raising" in line]
    assert len(measured) == 2 and len(failed) == 2, cells
    for line in measured:  # each batch size's figure, its stability folded in, short
        assert "bs1 " in line and "bs2 " in line and line.count("UNSTABLE (interval +-") == 2
        assert "measure on a quiet host" not in line
    for line in failed:  # both batch sizes failed for one reason: said once, in the line
        assert "bs1,2 FAILED: " in line and "cannot build" in line, line
    header = [line for line in lines if not CELL_LINE.match(line)]
    # what runs (its settings found good), the log file, the signing key made for this home
    # (2), the cells and the estimate (1), a line as each model's group starts (2)
    assert len(header) <= 7, header
    assert " benchmarking 2 model(s)" in header[0], header
    assert header[1].startswith("log: ") and "-benchmark.log" in header[1], header
    assert not [line for line in lines if any(word in line for word in MACHINERY)], lines
    assert "UNSTABLE:" not in err and "building or loading 2 engine(s)" in err
    assert "device cpu" in out and "fastest valid compiler" in out  # the summary: stdout's

    path = Path(header[1].split()[1])
    assert path.parent == home / "logs" and path.read_text() == last_log(home)
    log = path.read_text()
    assert "bs1: compiling" in log and "measuring the group again" in log
    assert "bs1 UNSTABLE: " in log and "measure on a quiet host" in log  # in full
    assert "cannot build" in log and all(line in log for line in cells)
    assert "fastest valid compiler" in log  # the summary too
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ DETAIL ", log, re.M)


def _say(verbose: int, capsys) -> str:
    console.setup_logging(verbose)
    log = logging.getLogger("mlflow_ngraph.run.supply")
    log.log(console.DETAIL, "resnet18/identity bs1: compiling")
    log.info("an estimate")
    log.warning("a warning")
    return capsys.readouterr().err


def test_the_machinery_reaches_the_terminal_only_with_v(capsys):
    plain, verbose, quiet = _say(0, capsys), _say(1, capsys), _say(-1, capsys)
    assert "compiling" not in plain and "an estimate" in plain and "a warning" in plain
    assert "compiling" in verbose and "an estimate" in verbose
    assert "compiling" not in quiet and "an estimate" not in quiet and "a warning" in quiet


def test_the_log_file_takes_every_level_and_the_oldest_are_removed(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    old = [logs / f"20200101-0000{i:02d}-benchmark.log" for i in range(console.KEEP_LOGS + 5)]
    for i, path in enumerate(old):
        path.write_text("old")
        os.utime(path, (1_600_000_000 + i, 1_600_000_000 + i))
    cell = logs / "0123456789abcdef01234567"  # a cell's worker log: not an invocation's
    cell.mkdir()
    console.setup_logging(0)
    path = console.open_log_file(tmp_path, "benchmark")
    assert path is not None and path.parent == logs
    assert f"log: {path}" in capsys.readouterr().err
    logging.getLogger("mlflow_ngraph.run.supply").log(console.DETAIL, "x bs1: compiling")
    logging.getLogger("mlflow_ngraph.run").debug("a debug line")
    console.to_log_file("[1/1] x: bs1 1.0/s")
    console.setup_logging(0)  # closes the file, as the next command in this process does
    text = path.read_text()
    assert "DETAIL mlflow_ngraph.run.supply: x bs1: compiling" in text
    assert "a debug line" in text and "[1/1] x: bs1 1.0/s" in text
    kept = sorted(p.name for p in logs.glob("*.log"))
    assert len(kept) == console.KEEP_LOGS and path.name in kept
    assert old[0].name not in kept and old[-1].name in kept and cell.is_dir()
    assert console.open_log_file(tmp_path, "blocks", say=False) != path  # its own file
    assert capsys.readouterr().err == ""
    console.setup_logging(0)


def test_a_home_that_cannot_hold_a_log_file_is_left_to_its_own_check(tmp_path, capsys):
    home = tmp_path / "home"
    home.write_text("a file, not a directory")
    console.setup_logging(0)
    assert console.open_log_file(home, "benchmark") is None
    assert capsys.readouterr().err == ""


def _row(b: int, **kw) -> Row:
    return Row("resnet18", kw.pop("compiler", "openvino"), b, kw.pop("status", "OK"), **kw)


def test_a_cells_line_folds_in_its_stability_and_its_failures():
    reason = (
        "speedup interval +-12.5% is wider than +-5%; other processes used 40.2% of the CPU "
        "(> 25%): measure on a quiet host"
    )
    rows = [
        _row(1, throughput=100.0, ci_low=90.0, ci_high=110.0, speedup=2.0, stable=True),
        _row(2, throughput=150.0, speedup=1.5, stable=False, stability_note=reason),
        _row(4, status="FAILED", note="CompileFailed: out of memory"),
        _row(8, status="FAILED", note="CompileFailed: out of memory"),
    ]
    line = cell_results(rows)
    assert line == (
        "bs1 100.0/s [90.0-110.0] 2.00x, "
        "bs2 150.0/s 1.50x UNSTABLE (interval +-12.5%, other processes 40.2% CPU), "
        "bs4,8 FAILED: CompileFailed: out of memory"
    )
    identity = [_row(1, compiler="identity", throughput=50.0, speedup=1.0, stable=True)]
    assert cell_results(identity) == "bs1 50.0/s"  # its speedup is 1 by definition
    long = [_row(1, status="FAILED", note="x" * 500)]
    assert len(cell_results(long)) < 200 and cell_results(long).endswith("…")
    assert cell_results([]) == "nothing to measure"


def test_each_cause_of_an_unstable_verdict_has_its_few_words():
    full = (
        "throughput interval +-101.6% is wider than +-10%; other processes used 30.2% of the "
        "CPU (> 25%); the host was contended: the process's threads waited for a core in 19 "
        "of 36 windows (> 50%); the host drifted beyond what the rounds cover: the speedup "
        "moved -7.1% between the first and second half of the rounds; leaving out the "
        "disturbed windows moved the throughput +32.2%, more than its interval: measure on a "
        "quiet host"
    )
    assert short_reason(full) == (
        "interval +-101.6%, other processes 30.2% CPU, host contended, host drifted -7.1%, "
        "disturbed +32.2%"
    )
    assert short_reason("too few windows for a speedup interval: measure on a quiet host") == (
        "too few windows"
    )
    moved = "the speedup moved 2.5x lower against this engine measured on this host at 12:00"
    assert short_reason(moved) == "moved 2.5x lower against an earlier run"
    # a figure combined from sittings: each cause keeps the sitting it came from
    assert short_reason(
        f"sitting 1: {moved}; sitting 2: the throughput moved -12.2% against this run's "
        "earlier sitting of this engine at 09:15 (2247/s)"
    ) == (
        "sitting 1: moved 2.5x lower against an earlier run, "
        "sitting 2: moved -12.2% against this run's earlier sitting"
    )
    assert short_reason("sitting 2: too few windows for a speedup interval") == (
        "sitting 2: too few windows"
    )
    assert short_reason("a cause worded some new way: with its detail") == (
        "a cause worded some new way"
    )
    assert short_reason("") == ""
