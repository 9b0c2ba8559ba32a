"""The terminal summary printed at the end of a benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table (no dependency, safe to paste in an issue)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_summary(rows, spec) -> str:
    """One line per model x compiler x batch size, identity's speedup alongside."""
    headers = [
        "model",
        "compiler",
        "bs",
        "samples/s",
        "+-",
        "p50 ms",
        "CPU %",
        "speedup",
        "compile s",
        "status",
        "note",
    ]
    table = []
    for r in rows:
        note = r.note + (" (resumed)" if r.skipped else "")
        table.append(
            [
                r.model,
                r.compiler,
                r.batch_size,
                _num(r.throughput),
                _num(r.throughput_std),
                _num(r.latency_p50_ms, 2),
                _num(r.cpu_percent),
                _num(r.speedup, 2),
                _num(r.compile_s, 2),
                r.status,
                note[:80],
            ]
        )
    title = (
        f"device {spec.device}, scenario {spec.measure.scenario}, experiment {spec.experiment!r}"
    )
    counts = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    footer = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return f"{title}\n{format_table(headers, table)}\n{footer}"
