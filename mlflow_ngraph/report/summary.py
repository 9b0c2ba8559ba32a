"""The terminal summary printed at the end of a benchmark, and the short names of cells."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from mlflow_ngraph.measure.legend import legend
from mlflow_ngraph.measure.verdict import NO_RERUN, PARTED_REASON, settle, shown_rerun, winners
from mlflow_ngraph.plan.cells import compiler_label, differing_flags
from mlflow_ngraph.table import format_table


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval(low: float | None, high: float | None, digits: int = 1) -> str:
    """A 95% interval, ``-`` where there is none (fewer than three windows, no paired
    baseline, or a record from before intervals)."""
    return "-" if low is None or high is None else f"{low:.{digits}f}-{high:.{digits}f}"


def _stability(stable: bool | None) -> str:
    """``yes``, ``UNSTABLE`` (its interval too wide, other processes took the CPU or the
    host drifted: a number to re-measure) or ``-`` (not judged: FAILED, or a record from
    before the check)."""
    return "-" if stable is None else ("yes" if stable else "UNSTABLE")


#: the winners table's columns
WINNER_HEADERS = [
    "model", "bs", "compiler", "samples/s", "speedup", "lead over", "lead", "noise", "stable",
]  # fmt: skip


def winner_cells(best: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """The winners table's headers and rows, as the summary shows them (the HTML report
    shows the same cells)."""
    rows = [
        [
            w["model"],
            w["batch_size"],
            w["label"],
            _num(w["throughput"]),
            f"{w['speedup']:.2f}x" if w["speedup"] is not None else "-",
            w["next"] or "-",
            f"{w['lead']:.2f}x" if w["lead"] is not None else "-",
            w["noise"],
            _stability(w["stable"]),
        ]
        for w in best
    ]
    return list(WINNER_HEADERS), rows


def _winners_table(best: list[dict[str, Any]], width: int | None = None) -> str:
    headers, rows = winner_cells(best)
    return format_table(headers, rows, width=width, keep=2)


#: the summary's columns, one per figure of a row
SUMMARY_HEADERS = [
    "model",
    "compiler",
    "bs",
    "samples/s",
    "95% CI",
    "p50 ms",
    "CPU %",
    "speedup",
    "speedup CI",
    "re-run CI",
    "drift %",
    "compile s",
    "payback",
    "status",
    "stable",
    "note",
]


def format_summary(
    rows, spec, experiment: str | None = None, width: int | None = None, remeasure=None
) -> str:
    """One line per model x compiler setting x batch size, identity's speedup alongside,
    then the fastest valid compiler per model and batch size.

    ``experiment`` is the experiment the results went to (under ``mlflow run`` that of the
    project run), the spec's by default. With ``width`` (a terminal's columns) the tables
    wrap into panels that fit it, each repeating model, compiler and batch size; without,
    a row is one line (what a log file or a pipe wants). ``remeasure``: the command that
    measures the UNSTABLE measurements again in place, named where there are some.
    """
    _label(rows)
    settle(rows)
    paper = getattr(spec.measure, "protocol", "rounds") == "paper"
    title = _title(spec, experiment, paper)
    footer = _status_counts(rows)
    table = format_table(SUMMARY_HEADERS, [_summary_row(r) for r in rows], width=width, keep=3)
    out = [title, table, footer, *_parted_notes(rows)]
    if any(r.throughput is not None for r in rows):
        out += _summary_legend(rows, paper)
    unstable = sum(1 for r in rows if getattr(r, "stable", None) is False)
    if unstable:
        out.append(
            f"{unstable} of {len(rows)} measurements UNSTABLE after their re-measurements "
            "(interval wider than --max-interval, other processes took the CPU, or the host "
            "drifted; the log says which): read their numbers, and the speedups built on "
            "them, as noise; measure them again in their own runs, on a quiet host, with: "
            f"{remeasure or 'the same command with --remeasure unstable'}"
        )
    out += _winners_part(rows, width, paper)
    if width is not None:  # the sentences too
        out = _wrap(out, width)
    return "\n".join(out)


def _title(spec, experiment: str | None, paper: bool) -> str:
    """The summary's first line: device, scenario, the protocol where it is the paper's,
    the arithmetic, the output check and the experiment."""
    arithmetic = getattr(spec, "math", "fp32")
    tolerance = getattr(spec, "tolerance", None)
    within = f" (output check within {tolerance:g})" if tolerance else ""
    protocol = (
        f"protocol paper ({spec.measure.repetitions} single inferences timed), " if paper else ""
    )
    return (
        f"device {spec.device}, scenario {spec.measure.scenario}, {protocol}"
        f"math {_MATH_WORDS.get(arithmetic, arithmetic)}{within}, "
        f"experiment {experiment or spec.experiment!r}"
    )


def _status_counts(rows) -> str:
    """The summary's footer: how many rows ended in each status (``1 FAILED, 4 OK``)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))


def _summary_legend(rows, paper: bool) -> list[str]:
    """A line per column of the summary (:mod:`mlflow_ngraph.measure.legend`), with what
    this run's intervals rest on: the paper protocol's, and why no row has a re-run
    interval yet."""
    lines = legend(SUMMARY_HEADERS)
    for i, line in enumerate(lines):
        if paper and line.startswith("  95% CI:"):
            lines[i] = (
                "  95% CI: 95% interval of the throughput, samples/s: of the mean of b/t over "
                "the timed inferences (the engines were timed one after the other, unpaired)"
            )
        if line.startswith("  speedup:") and any(getattr(r, "ratio_parted", None) for r in rows):
            lines[i] = line + "; *: the ratio of the throughputs parts from it (see above)"
        if line.startswith("  re-run CI:") and not any(_rerun(r) != "-" for r in rows):
            lines[i] = f"{line} ({NO_RERUN})"
    return lines


def _parted_notes(rows) -> list[str]:
    """A line per row whose speedup (the paired estimate) and ratio of throughputs part by
    more than their intervals: both figures, and why the paired one is the estimate."""
    lines = []
    for r in rows:
        if getattr(r, "ratio_parted", None) is None:
            continue
        ratio, ratio_ci = r.ratio_parted
        lines.append(
            f"* {r.model} {r.label} bs{r.batch_size}: {r.speedup:.2f}x paired "
            f"[{_interval(*r.speedup_interval, 2)}] (throughput ratio {ratio:.2f}x "
            f"[{_interval(*ratio_ci, 2)}]: {PARTED_REASON})"
        )
    return lines


def _winners_part(rows, width: int | None, paper: bool) -> list[str]:
    """The summary's lines naming the fastest valid compiler per model and batch size (none
    where no group has one), with what its lead means."""
    best = winners(rows)
    if not best:
        return []
    return [
        "",
        "fastest valid compiler per model and batch size:",
        _winners_table(best, width),
        *legend(["lead over", "lead", "noise"]),
        "(lead: the ratio of the two speedups over identity "
        + ("(T_c / T_identity, timed one after the other)" if paper else "from the same rounds")
        + "; judged only where both figures are STABLE)",
    ]


def _wrap(lines: list[str], width: int) -> list[str]:
    """``lines`` with each sentence longer than ``width`` filled to it (a table, which has
    its own line breaks, as it is; a legend line's continuation indented under it)."""
    return [
        line
        if "\n" in line or len(line) <= width
        else textwrap.fill(line, width, subsequent_indent=" " * 4 * line.startswith("  "))
        for line in lines
    ]


#: how the summary names the run's arithmetic (compilers/precision.py)
_MATH_WORDS = {"fp32": "strict FP32", "tf32": "TF32 allowed", "fp16": "FP16"}


def _label(rows) -> None:
    """Give each row its ``label``: the compiler and the flags that tell its settings apart."""
    differing = differing_flags((r.compiler, getattr(r, "flags", {}) or {}) for r in rows)
    for r in rows:
        r.label = compiler_label(
            r.compiler, getattr(r, "flags", {}) or {}, differing.get(r.compiler, ())
        )


def payback_text(value: float | None) -> str:
    """Inferences until a compile is paid back: ``2.1k``, ``never`` (not faster), ``-``."""
    if value is None or value != value:
        return "-"
    if math.isinf(value):
        return "never"
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.0f}"


def _rerun(r) -> str:
    """Where a re-run on this host is expected to land (:func:`shown_rerun`); ``-`` where
    the host has no measured spread."""
    low, high, speedup = shown_rerun(r)
    return _interval(low, high, 2) if speedup else _interval(low, high)


def _summary_row(r) -> list[Any]:
    """A row's cells under :data:`SUMMARY_HEADERS`."""
    drift = getattr(r, "drift", None)
    return [
        r.model,
        r.label,
        r.batch_size,
        _num(r.throughput),
        _interval(getattr(r, "ci_low", None), getattr(r, "ci_high", None)),
        _num(r.latency_p50_ms, 2),
        _num(r.cpu_percent),
        _num(r.speedup, 2) + ("*" if getattr(r, "ratio_parted", None) else ""),
        _interval(*(getattr(r, "speedup_interval", None) or (None, None)), 2),
        _rerun(r),
        _num(100 * drift if drift is not None else None),
        _num(r.compile_s, 2),
        payback_text(getattr(r, "payback", None)),
        r.status,
        _stability(getattr(r, "stable", None)),
        (r.note + (" (resumed)" if r.skipped else ""))[:80],
    ]
