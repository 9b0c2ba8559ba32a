"""Render compare tables as terminal text, CSV, markdown, JSON or one HTML page.

Terminal text and markdown are for people: a column ``X`` with a companion ``X_std`` is
shown as ``X ± std``, numbers are rounded, missing values read ``-``, and bookkeeping columns
(run ids, flags) are hidden. CSV and JSON are for programs: every column, full precision,
missing values empty (CSV) or ``null`` (JSON).
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

FORMATS = ("terminal", "csv", "markdown", "json")
MISSING = "-"

TITLES = {
    "cells": "Per-cell results (throughput in samples/s, latency in ms, CPU in % of all cores)",
    "families": "Table VI: throughput [samples/s] and CPU [%] by family, compiler and device, "
    "mean ± pooled std over batch-size ranges",
    "depth": "Tables VII/VIII: depth scaling of block speedups (least-squares slope per added "
    "block; retention = speedup at the deepest stack / at one block)",
    "compile": "Table III: compile time in seconds by model and batch size",
    "flips": "Ranking flips: order by identity throughput against each compiler's order "
    "(swapped pairs are written in the identity's order; the compiler reverses each)",
}

#: rows of one table on the HTML page: a browser stays responsive, the CSV keeps them all
HTML_MAX_ROWS = 2000

#: columns people do not need on screen (CSV and JSON keep them)
HIDDEN = {
    "cells": ("family", "model_params", "flags", "scenario", "experiment_id", "run_id", "error"),
    "flips": ("identity_order", "compiler_order"),
}


def format_number(value: object) -> str:
    """Four significant digits; integers as integers; ``-`` for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if number.is_integer() and abs(number) < 1e15:
            return str(int(number))
        return f"{number:.0f}" if abs(number) >= 10_000 else f"{number:.4g}"
    return str(value)


def for_people(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> pd.DataFrame:
    """Strings to show: ``X ± std`` pairs merged, numbers rounded, hidden columns dropped."""
    shown: dict[str, list[str]] = {}
    for column in frame.columns:
        if column in hidden or column.endswith("_std") and column[:-4] in frame:
            continue
        text = [format_number(v) for v in frame[column]]
        std = f"{column}_std"
        if std in frame:
            text = [_with_std(t, s) for t, s in zip(text, frame[std], strict=True)]
        shown[column] = text
    return pd.DataFrame(shown, columns=list(shown))


def _with_std(text: str, std: object) -> str:
    spread = format_number(std)
    return text if text == MISSING or spread == MISSING else f"{text} ± {spread}"


def _cell(text: str) -> str:
    return text.replace("\n", " ")


def to_terminal(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> str:
    """A fixed-width text table; numbers right-aligned."""
    shown = for_people(frame, hidden)
    if shown.empty:
        return "(no rows)"
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) for c in shown.columns]
    widths = [max(len(c), *(len(v) for v in shown[c])) for c in shown.columns]
    lines = [_line(list(shown.columns), widths, numeric)]
    lines.append("  ".join("-" * w for w in widths))
    lines += [_line([_cell(v) for v in row], widths, numeric) for row in shown.values]
    return "\n".join(line.rstrip() for line in lines)


def _line(values: Sequence[str], widths: Sequence[int], numeric: Sequence[bool]) -> str:
    cells = [
        v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric, strict=True)
    ]
    return "  ".join(cells)


def to_markdown(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> str:
    """A GitHub-flavoured markdown table."""
    shown = for_people(frame, hidden)
    if shown.empty:
        return "(no rows)"
    escape = lambda text: _cell(text).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(escape(c) for c in shown.columns) + " |"]
    lines.append("|" + "|".join(" --- " for _ in shown.columns) + "|")
    lines += ["| " + " | ".join(escape(v) for v in row) + " |" for row in shown.values]
    return "\n".join(lines)


def to_csv(frame: pd.DataFrame) -> str:
    """Every column, full precision, missing values empty."""
    return frame.to_csv(index=False)  # floats as repr: the shortest exact form


def _plain(value: object) -> object:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    """One plain-Python dict per row (NaN -> ``None``)."""
    return [
        {column: _plain(value) for column, value in zip(frame.columns, row, strict=True)}
        for row in frame.itertuples(index=False, name=None)
    ]


def render(tables: Mapping[str, pd.DataFrame], fmt: str) -> str:
    """All ``tables`` in one format.

    One table: JSON is a list of records and CSV a plain file. Several tables: JSON is an
    object of table name -> records, and CSV holds each table after a ``# <name>`` line.
    """
    if fmt == "json":
        body = {name: records(df) for name, df in tables.items()}
        payload = next(iter(body.values())) if len(body) == 1 else body
        return json.dumps(payload, indent=1, allow_nan=False)
    if fmt == "csv":
        if len(tables) == 1:
            return to_csv(next(iter(tables.values())))
        return "\n".join(f"# {name}\n{to_csv(df)}" for name, df in tables.items())
    if fmt == "markdown":
        parts = [
            f"## {TITLES[n]}\n\n{to_markdown(df, HIDDEN.get(n, ()))}" for n, df in tables.items()
        ]
        return "\n\n".join(parts) + "\n"
    if fmt == "terminal":
        parts = [f"{TITLES[n]}\n\n{to_terminal(df, HIDDEN.get(n, ()))}" for n, df in tables.items()]
        return "\n\n\n".join(parts) + "\n"
    raise ValueError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = html.escape(path.stem)
    return f'<figure><img alt="{alt}" src="data:image/png;base64,{data}"></figure>'


_STYLE = """body{font-family:sans-serif;margin:2em;max-width:110em}
table{border-collapse:collapse;font-size:13px;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee}figure{margin:1em 0}.note{color:#555}"""


def to_html(
    tables: Mapping[str, pd.DataFrame],
    plots: Sequence[Path],
    notes: Sequence[str] = (),
    title: str = "mlflow-ngraph compare",
) -> str:
    """One self-contained page: every table, then every figure (PNGs embedded as data URIs,
    so the page renders in MLflow's artifact viewer and offline alike)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    parts += [f'<p class="note">{html.escape(n)}</p>' for n in notes]
    for name, frame in tables.items():
        shown = for_people(frame.head(HTML_MAX_ROWS), HIDDEN.get(name, ()))
        parts.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        if len(frame) > HTML_MAX_ROWS:
            cut = f"first {HTML_MAX_ROWS} of {len(frame)} rows; all rows: tables/{name}.csv"
            parts.append(f'<p class="note">{cut}</p>')
        parts.append(shown.to_html(index=False, escape=True, border=0))
    if plots:
        parts.append("<h2>Figures</h2>")
        parts += [_image(path) for path in plots]
    body = "\n".join(parts)
    head = f"<meta charset='utf-8'><title>{html.escape(title)}</title><style>{_STYLE}</style>"
    return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n{body}\n</body></html>\n"
