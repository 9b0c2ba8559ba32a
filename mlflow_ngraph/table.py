"""The one fixed-width text table of the tool: the benchmark summary, `compare`'s terminal
tables, the compiler and model listings, `pull`'s candidates and the sweep's view.

Plain text, no dependency (the benchmark imports no pandas), safe to paste in an issue:
columns two spaces apart, a dashed rule under the header, numbers right-aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: what a missing value reads as
MISSING = "-"


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("x%"))
    except ValueError:
        return False
    return True


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[bool] | None = None
) -> str:
    """``headers`` over ``rows``; ``numeric`` says which columns to right-align (by default
    those whose every present value reads as a number)."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    if numeric is None:
        numeric = [
            bool(rows)
            and all(_is_number(r[i]) for r in cells[1:] if r[i] not in ("", MISSING))
            and any(r[i] not in ("", MISSING) for r in cells[1:])
            for i in range(len(headers))
        ]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)
        ).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [line(row) for row in cells[1:]]
    return "\n".join(lines)
