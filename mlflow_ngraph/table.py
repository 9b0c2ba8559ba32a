"""The one fixed-width text table of the tool: the benchmark summary, `compare`'s terminal
tables, the compiler and model listings, `pull`'s candidates and the sweep's view.

Plain text, no dependency (the benchmark imports no pandas), safe to paste in an issue:
columns two spaces apart, a dashed rule under the header, numbers right-aligned.

Given a ``width`` (a terminal's), a wider table is made to fit as ``rich`` does it: long
headers break at their ``_`` and spaces, long text wraps within its column, and what still
does not fit goes on in further panels below, each repeating the first ``keep`` columns
(the ones that name a row).

Every cell and header is shown :func:`~mlflow_ngraph.text.visible`: a value from a tracking
store (a name, a flag, an error) cannot send a terminal escape sequence or break a row.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence
from typing import Any

from mlflow_ngraph.text import visible

#: what a missing value reads as
MISSING = "-"
#: a text column is wrapped at this many characters when the table is too wide
TEXT_WRAP = 24
#: the width of a terminal that does not say (a pipe, a file): what a newcomer's window has
DEFAULT_WIDTH = 100
GAP = "  "


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` first), :data:`DEFAULT_WIDTH` without one."""
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("x%"))
    except ValueError:
        return False
    return True


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    numeric: Sequence[bool] | None = None,
    width: int | None = None,
    keep: int = 1,
) -> str:
    """``headers`` over ``rows``; ``numeric`` says which columns to right-align (by default
    those whose every present value reads as a number). With ``width``, a wider table is
    wrapped to fit (see the module), repeating its first ``keep`` columns in each panel.
    Control and format characters in a cell are shown as escapes (``\\x1b``)."""
    cells = [[visible(h) for h in headers]]
    cells += [["" if c is None else visible(c) for c in r] for r in rows]
    if numeric is None:
        numeric = [
            bool(rows)
            and all(_is_number(r[i]) for r in cells[1:] if r[i] not in ("", MISSING))
            and any(r[i] not in ("", MISSING) for r in cells[1:])
            for i in range(len(headers))
        ]
    columns = list(range(len(headers)))
    if width is None or _width([_widest(cells, i) for i in columns]) <= width:
        return _panel(cells, columns, numeric, None)
    keep = min(keep, len(columns))
    limits = _limits(cells, numeric, keep, width)
    panels = _panels([limits[i] for i in columns], keep, width)
    return "\n\n".join(_panel(cells, panel, numeric, limits) for panel in panels)


def _widest(cells: list[list[str]], i: int) -> int:
    return max(len(row[i]) for row in cells)


def _width(widths: Sequence[int]) -> int:
    return sum(widths) + len(GAP) * max(len(widths) - 1, 0)


def _limits(cells: list[list[str]], numeric: Sequence[bool], keep: int, width: int) -> list[int]:
    """Each column's width once wrapped. A number never wraps; a header breaks down to its
    longest word. The naming columns keep their text whole unless they fill most of a
    panel; another text column wraps to what a panel leaves beside them, at least
    :data:`TEXT_WRAP`."""
    natural = [max((len(row[i]) for row in cells[1:]), default=0) for i in range(len(numeric))]
    if _width(natural[:keep]) > width * 0.6:
        natural[:keep] = [
            n if numeric[i] else min(n, TEXT_WRAP) for i, n in enumerate(natural[:keep])
        ]
    room = max(TEXT_WRAP, width - _width(natural[:keep]) - len(GAP))
    out = []
    for i, is_number in enumerate(numeric):
        values = natural[i] if is_number or i < keep else min(natural[i], room)
        words = max(len(w) for w in _header_words(cells[0][i]))
        out.append(max(values, words, 1))
    return out


def _header_words(header: str) -> list[str]:
    """``cpu_reduction_pct`` -> ``cpu_``, ``reduction_``, ``pct``: where a header may break."""
    words, word = [], ""
    for char in header:
        word += char
        if char in "_ ":
            words.append(word)
            word = ""
    return [*words, word] if word else words or [""]


def _fill(text: str, width: int, header: bool) -> list[str]:
    if len(text) <= width:
        return [text]
    if not header:
        return textwrap.wrap(text, width, break_on_hyphens=False) or [""]
    lines, line = [], ""
    for word in _header_words(text):
        if line and len(line) + len(word) > width:
            lines.append(line.rstrip())
            line = ""
        line += word
    return [*lines, line.rstrip()]


def _panels(widths: Sequence[int], keep: int, width: int) -> list[list[int]]:
    """Columns per panel: the first ``keep`` in each, the others in order while they fit
    (at least one per panel, however wide)."""
    head = list(range(keep))
    panels, current = [], list(head)
    for i in range(keep, len(widths)):
        if len(current) > keep and _width([widths[j] for j in [*current, i]]) > width:
            panels.append(current)
            current = list(head)
        current.append(i)
    if len(current) > keep or not panels:
        panels.append(current)
    return panels


def _panel(
    cells: list[list[str]], columns: list[int], numeric: Sequence[bool], limits: list[int] | None
) -> str:
    """The table of ``columns``; with ``limits``, each cell wrapped to its column's."""
    grid = []
    for r, row in enumerate(cells):
        if limits is None:
            grid.append([[row[i]] for i in columns])
        else:
            grid.append([_fill(row[i], limits[i], r == 0) for i in columns])
    widths = [max(len(line) for row in grid for line in row[k]) for k in range(len(columns))]
    right = [numeric[i] for i in columns]

    def lines(row: list[list[str]]) -> list[str]:
        height = max(len(cell) for cell in row)
        out = []
        for n in range(height):
            values = [cell[n] if n < len(cell) else "" for cell in row]
            out.append(
                GAP.join(
                    v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, right)
                ).rstrip()
            )
        return out

    text = lines(grid[0]) + [GAP.join("-" * w for w in widths)]
    for row in grid[1:]:
        text += lines(row)
    return "\n".join(text)
