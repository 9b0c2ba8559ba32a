"""Render compare tables as terminal text, CSV, markdown, JSON or one HTML page.

Terminal text and markdown are for people: a column ``X`` with a companion ``X_std`` is
shown as ``X ± std``, numbers are rounded, missing values read ``-``, and bookkeeping columns
(run ids, flags) are hidden. CSV and JSON are for programs: every column, full precision,
missing values empty (CSV) or ``null`` (JSON).

Text from the store (names, flags, errors, column names from params) is shown
:func:`~mlflow_ngraph.text.visible` in every format: a control or format character reads as
an escape (``\\x1b``), in a terminal, a file or a browser; JSON escapes them as JSON does.
"""

from __future__ import annotations

import base64
import html
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from mlflow_ngraph.measure.legend import legend
from mlflow_ngraph.measure.verdict import NO_RERUN
from mlflow_ngraph.text import visible

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
    "payback": "Compile time paid back: inferences after which a compile pays for itself "
    "against eager (never: not faster; cache hits left out)",
    "pareto": "Pareto front of throughput [samples/s] against p99 latency [ms], per device "
    "and model, over every valid configuration and batch size (a tune's trials included)",
}

#: rows of one table on the HTML page: a browser stays responsive, the CSV keeps them all
HTML_MAX_ROWS = 2000

#: on a terminal: the columns that name a row, repeated in each panel of a table wider than
#: the terminal, and the columns that answer the question, first after them
KEY_COLUMNS = {
    "cells": 4, "families": 3, "depth": 4, "compile": 2, "flips": 5, "payback": 2, "pareto": 2,
}  # fmt: skip
FIRST = {"cells": ("throughput", "speedup", "stability", "status")}
#: shorter headers on a terminal (the names stay in CSV, JSON and markdown)
SHORT = {"batch_size": "bs"}

#: columns people do not need on screen (CSV and JSON keep them)
HIDDEN = {
    # ``moved``: the guard's words, said below the table in a note (:func:`moved_note`);
    # ``stability_reason``: an UNSTABLE figure's whole reason (the HTML report says it)
    "cells": ("family", "model_params", "flags", "scenario", "experiment_id", "run_id", "error",
              "moved", "stability_reason"),
    "flips": ("identity_order", "compiler_order"),
}  # fmt: skip
#: columns left out for people where no row has a value (CSV and JSON keep them)
HIDDEN_IF_EMPTY = ("throughput_ratio",)


def format_number(value: object) -> str:
    """Four significant digits; integers as integers; ``-`` for a missing value."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return MISSING
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return _format_float(float(value))
    return str(value)


def _format_float(number: float) -> str:
    if number != number:  # NaN
        return MISSING
    if number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:.0f}" if abs(number) >= 10_000 else f"{number:.4g}"


def _format_column(series: pd.Series) -> list[str]:
    """Every value of a column as text (a fast path for float columns)."""
    if pd.api.types.is_float_dtype(series.dtype):
        values = series.to_numpy(dtype=float, na_value=np.nan).tolist()
        return [_format_float(v) for v in values]
    return [visible(format_number(v)) for v in series.tolist()]


def _companion(column: str, frame: pd.DataFrame) -> bool:
    """Whether ``column`` is shown inside another: ``X_std``, ``X_ci_low``, ``X_ci_high``
    of a column ``X`` (for ``throughput``, ``throughput_ci_low``...)."""
    for suffix in ("_std", "_ci_low", "_ci_high", "_rerun_low", "_rerun_high"):
        if column.endswith(suffix) and column[: -len(suffix)] in frame:
            return True
    return False


def _text_columns(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> dict[str, list[str]]:
    """Column name -> strings to show (numbers rounded, one line each, text
    :func:`~mlflow_ngraph.text.visible`): ``X [low-high]`` where ``X`` has a 95% interval
    (``X_ci_low``/``X_ci_high``), else ``X ± std``."""
    shown: dict[str, list[str]] = {}
    for column in frame.columns:
        if column in hidden or _companion(column, frame):
            continue
        if column in HIDDEN_IF_EMPTY and not frame[column].notna().any():
            continue
        text = _format_column(frame[column])
        std, low, high = f"{column}_std", f"{column}_ci_low", f"{column}_ci_high"
        spreads = frame[std].tolist() if std in frame else [None] * len(text)
        if low in frame and high in frame:
            ends = zip(_format_column(frame[low]), _format_column(frame[high]), strict=True)
            text = [
                f"{t} [{lo}-{hi}]" if MISSING not in (t, lo, hi) else _with_std(t, s)
                for t, (lo, hi), s in zip(text, ends, spreads, strict=True)
            ]
        elif std in frame:
            text = [_with_std(t, s) for t, s in zip(text, spreads, strict=True)]
        shown[visible(column)] = text
        low, high = f"{column}_rerun_low", f"{column}_rerun_high"
        if low in frame and high in frame and frame[low].notna().any():
            # where a re-run on this host is expected to land (beside this run's interval)
            ends = zip(_format_column(frame[low]), _format_column(frame[high]), strict=True)
            shown[visible(f"{column} re-run")] = [
                f"[{lo}-{hi}]" if MISSING not in (lo, hi) else MISSING for lo, hi in ends
            ]
    return shown


def _no_rerun(frame: pd.DataFrame) -> list[str]:
    """The legend's line where the table has room for a re-run interval but no row has one
    (``X re-run`` is then left out): why, in one line."""
    pairs = [
        (f"{c}_rerun_low", f"{c}_rerun_high")
        for c in frame.columns
        if f"{c}_rerun_low" in frame and f"{c}_rerun_high" in frame
    ]
    if not pairs or len(frame) == 0 or any(frame[low].notna().any() for low, _ in pairs):
        return []
    return [f"  re-run: {NO_RERUN}"]


def for_people(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> pd.DataFrame:
    """Strings to show: ``X ± std`` pairs merged, numbers rounded, hidden columns dropped."""
    shown = _text_columns(frame, hidden)
    return pd.DataFrame(shown, columns=list(shown), dtype=object)


def _with_std(text: str, std: object) -> str:
    if std is None:
        return text
    spread = format_number(std)
    return text if text == MISSING or spread == MISSING else f"{text} ± {spread}"


def _rows(shown: dict[str, list[str]]) -> list[tuple[str, ...]]:
    return list(zip(*shown.values(), strict=True))


def to_terminal(
    frame: pd.DataFrame,
    hidden: Sequence[str] = (),
    width: int | None = None,
    keep: int = 1,
    why_empty: str = "",
) -> str:
    """A fixed-width text table (the tool's one table printer); numbers right-aligned, a
    line under it per column that says what it means. With ``width``, a wider table wraps
    to fit, its first ``keep`` columns in every panel (and the legend's lines too)."""
    from mlflow_ngraph.table import format_table

    shown = _text_columns(frame, hidden)
    if frame.empty or not shown:
        return f"(no rows: {why_empty})" if why_empty else "(no rows)"
    numeric = [c in frame and pd.api.types.is_numeric_dtype(frame[c]) for c in shown]
    headers = [SHORT.get(c, c) for c in shown]
    table = format_table(headers, _rows(shown), numeric, width=width, keep=keep)
    lines = legend(headers)
    lines += _no_rerun(frame) if lines else []
    if width:
        lines = [
            textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False)
            for line in lines
        ]
    return "\n".join([table, *lines])


def _terminal_order(frame: pd.DataFrame, keep: int, first: Sequence[str]) -> pd.DataFrame:
    """The ``keep`` naming columns, then those that answer the question, then the rest."""
    keys = list(frame.columns[:keep])
    ahead = [c for c in first if c in frame and c not in keys]
    rest = [c for c in frame.columns if c not in keys and c not in ahead]
    return frame[[*keys, *ahead, *rest]]


def terminal_tables(
    tables: Mapping[str, pd.DataFrame], width: int, why_empty: Mapping[str, str] | None = None
) -> str:
    """Every table for a terminal ``width`` columns wide, each under its title; a device
    column of one value goes into the title."""
    parts = []
    for name, frame in tables.items():
        title, keep = TITLES[name], KEY_COLUMNS.get(name, 1)
        if "device" in frame and len(frame) and frame["device"].nunique(dropna=False) == 1:
            title += f"; device {visible(frame['device'].iloc[0])}"
            frame = frame.drop(columns=["device"])
            keep -= 1  # the device is one of the naming columns of every table that has it
        body = to_terminal(
            _terminal_order(frame, keep, FIRST.get(name, ())),
            HIDDEN.get(name, ()),
            width,
            keep,
            (why_empty or {}).get(name, ""),
        )
        parts.append(f"{textwrap.fill(title, width)}\n\n{body}")
    return "\n\n\n".join(parts) + "\n"


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(frame: pd.DataFrame, hidden: Sequence[str] = ()) -> str:
    """A GitHub-flavoured markdown table."""
    shown = _text_columns(frame, hidden)
    if frame.empty or not shown:
        return "(no rows)"
    lines = ["| " + " | ".join(_escape(c) for c in shown) + " |"]
    lines.append("|" + "|".join(" --- " for _ in shown) + "|")
    lines += ["| " + " | ".join(_escape(v) for v in row) + " |" for row in _rows(shown)]
    explained = [_legend_markdown(line) for line in [*legend(shown), *_no_rerun(frame)][1:]]
    return "\n".join(lines) + ("\n\n" + "  \n".join(explained) if explained else "")


def _legend_markdown(line: str) -> str:
    """A legend line as markdown: the column as code (its name may hold ``_`` and ``*``)."""
    header, _, text = line.strip().partition(": ")
    return f"`{header}`: {_escape(text)}"


def _markdown_or_why(frame: pd.DataFrame, hidden: Sequence[str], why_empty: str) -> str:
    text = to_markdown(frame, hidden)
    return f"(no rows: {why_empty})" if text == "(no rows)" and why_empty else text


def to_csv(frame: pd.DataFrame) -> str:
    """Every column, full precision, missing values empty; text shown
    :func:`~mlflow_ngraph.text.visible` (one line per row, whatever the store held)."""
    return _visible_text(frame).to_csv(index=False)  # floats as repr: the shortest exact form


def _visible_text(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` whose text values and column names are
    :func:`~mlflow_ngraph.text.visible`."""
    out = frame.copy()
    for i, dtype in enumerate(frame.dtypes):
        if pd.api.types.is_object_dtype(dtype) or isinstance(dtype, pd.StringDtype):
            column = frame.iloc[:, i].tolist()
            out.iloc[:, i] = [visible(v) if isinstance(v, str) else v for v in column]
    out.columns = [visible(c) for c in frame.columns]
    return out


def _plain(value: object) -> object:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    """One plain-Python dict per row (NaN -> ``None``)."""
    columns = {c: [_plain(v) for v in frame[c].tolist()] for c in frame.columns}
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _json(payload: list[dict] | dict[str, list[dict]]) -> str:
    """Indented by record: one record per line (fast for 50,000 records, still readable)."""
    if isinstance(payload, dict):
        parts = [f"{json.dumps(name)}: {_json(rows)}" for name, rows in payload.items()]
        return "{\n" + ",\n".join(parts) + "\n}"
    if not payload:
        return "[]"
    lines = [json.dumps(row, allow_nan=False) for row in payload]
    return "[\n" + ",\n".join(lines) + "\n]"


def render(
    tables: Mapping[str, pd.DataFrame],
    fmt: str,
    width: int | None = None,
    why_empty: Mapping[str, str] | None = None,
) -> str:
    """All ``tables`` in one format.

    One table: JSON is a list of records and CSV a plain file. Several tables: JSON is an
    object of table name -> records, and CSV holds each table after a ``# <name>`` line.
    A terminal's tables fit ``width`` columns (default: the terminal's); ``why_empty`` says,
    per table, why it has no rows.
    """
    if fmt == "json":
        body = {name: records(df) for name, df in tables.items()}
        return _json(next(iter(body.values())) if len(body) == 1 else body) + "\n"
    if fmt == "csv":
        if len(tables) == 1:
            return to_csv(next(iter(tables.values())))
        return "\n".join(f"# {name}\n{to_csv(df)}" for name, df in tables.items())
    if fmt == "markdown":
        why = why_empty or {}
        parts = [
            f"## {TITLES[n]}\n\n{_markdown_or_why(df, HIDDEN.get(n, ()), why.get(n, ''))}"
            for n, df in tables.items()
        ]
        return "\n\n".join(parts) + "\n"
    if fmt == "terminal":
        from mlflow_ngraph.table import terminal_width

        return terminal_tables(tables, width or terminal_width(), why_empty)
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
    parts += [f'<p class="note">{html.escape(visible(n))}</p>' for n in notes]
    for name, frame in tables.items():
        shown = for_people(frame.head(HTML_MAX_ROWS), HIDDEN.get(name, ()))
        parts.append(f"<h2>{html.escape(TITLES[name])}</h2>")
        if len(frame) > HTML_MAX_ROWS:
            cut = f"first {HTML_MAX_ROWS} of {len(frame)} rows; all rows: tables/{name}.csv"
            parts.append(f'<p class="note">{cut}</p>')
        parts.append(shown.to_html(index=False, escape=True, border=0))
        parts += [f'<p class="note">{html.escape(line)}</p>' for line in legend(shown)[1:]]
    if plots:
        parts.append("<h2>Figures</h2>")
        parts += [_image(path) for path in plots]
    body = "\n".join(parts)
    head = f"<meta charset='utf-8'><title>{html.escape(title)}</title><style>{_STYLE}</style>"
    return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n{body}\n</body></html>\n"
