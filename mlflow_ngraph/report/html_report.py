"""The HTML report: one self-contained page of a benchmark's (or a compare's) results that a
person would rather look at than a terminal table.

Per model: throughput and speedup over batch size with their 95% interval bands (this
run's, and the re-run interval where the host has measured its spread between sittings),
UNSTABLE points drawn hollow and named with their reason; the winners table (the summary's
rows and verdicts, :func:`~mlflow_ngraph.measure.verdict.winners`); every figure with the
paper's metrics (RTR, ASE, BSR); then the environment of the runs. It is built from the
frame ``compare`` builds (:mod:`.query`, :func:`.tables.prepare`), so a benchmark's page and
a compare's agree. The figures are Plotly's, its JavaScript inlined once: the page needs no
network, in a browser or in MLflow's artifact viewer. Text from the store is data: escaped.
"""

from __future__ import annotations

import html
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from mlflow_ngraph.measure.verdict import winners
from mlflow_ngraph.report import render
from mlflow_ngraph.report.summary import winner_cells
from mlflow_ngraph.text import visible
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

#: the artifact's name on the parent run (MLflow's artifact viewer shows it as a page)
ARTIFACT = "report.html"
#: the colour of a compiler that declares none
OTHER_COLOR = "#17becf"
#: line styles telling apart several settings of one compiler (one colour per compiler)
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
#: the frame's columns the page reads (others are dropped first: the frame has hundreds)
COLUMNS = (
    "section", "model_label", "device", "scenario", "compiler", "compiler_label", "batch_size",
    "status", "stability", "stability_reason", "moved", "parent_run_id", "start_time",
    S.M_THROUGHPUT, S.M_THROUGHPUT_CI_LOW, S.M_THROUGHPUT_CI_HIGH, S.M_THROUGHPUT_RERUN_LOW,
    S.M_THROUGHPUT_RERUN_HIGH, "speedup", "speedup_ci_low", "speedup_ci_high",
    S.M_SPEEDUP_RERUN_LOW, S.M_SPEEDUP_RERUN_HIGH, "rtr", "ase", "bsr",
)  # fmt: skip
#: an UNSTABLE point further than this factor beyond the STABLE points' span is left off
#: the axis (an arrow at its edge says its figure)
OUTLIER = 3.0
#: a throughput panel spanning more than this ratio is drawn on a log axis
LOG_RATIO = 20.0
#: Plotly's options for every figure: no logo, no link to its cloud editor
CONFIG = {"displaylogo": False, "responsive": True}
#: light grid lines on a white plot
GRID = {"gridcolor": "#e5e5e5", "linecolor": "#999", "zeroline": False}


def esc(text: object) -> str:
    """Store text for the page: one visible line (:func:`~mlflow_ngraph.text.visible`),
    HTML-escaped (Plotly renders its labels as HTML too)."""
    return html.escape(visible(text))


def _number(value: object) -> float | None:
    """A float, ``None`` for a missing value (NaN, None, pandas' NA)."""
    if value is None or value is pd.NA:
        return None
    number = float(value)
    return None if math.isnan(number) else number


# --- the rows the verdict reads ---------------------------------------------------------
def keyed(frame: pd.DataFrame) -> list[dict]:
    """The measured rows as records of the columns the page reads, each with its
    ``section`` (the model, with the device and the scenario where the frame holds
    several), sorted by section, compiler label and batch size."""
    part = frame[frame["batch_size"].notna()]
    part = part.reindex(columns=[c for c in COLUMNS if c != "section"])  # absent: NaN
    section = part["model_label"].astype(str)
    if part["device"].nunique(dropna=False) > 1:
        section = section + " on " + part["device"].astype(str)
    if part["scenario"].nunique(dropna=False) > 1:
        section = section + " (" + part["scenario"].astype(str) + ")"
    part = part.assign(section=section, batch_size=part["batch_size"].astype(int))
    part = part.sort_values(["section", "compiler_label", "batch_size"], kind="stable")
    records = part.astype(object).where(part.notna(), None).to_dict("records")
    for r in records:
        r["stability"] = r["stability"] or ""
        r["stability_reason"] = r["stability_reason"] or ""
        r["moved"] = r["moved"] or ""
    return records


def verdict_rows(part: list[dict]) -> list[SimpleNamespace]:
    """The rows of :func:`keyed` as the rows :func:`~mlflow_ngraph.measure.verdict.winners`
    judges (a benchmark's summary rows have the same attributes)."""
    stable = {S.STABILITY_STABLE: True, S.STABILITY_UNSTABLE: False}
    names = {
        "throughput": S.M_THROUGHPUT,
        "speedup": "speedup",
        "ci_low": S.M_THROUGHPUT_CI_LOW,
        "ci_high": S.M_THROUGHPUT_CI_HIGH,
        "rerun_low": S.M_THROUGHPUT_RERUN_LOW,
        "rerun_high": S.M_THROUGHPUT_RERUN_HIGH,
        "speedup_ci_low": "speedup_ci_low",
        "speedup_ci_high": "speedup_ci_high",
        "speedup_rerun_low": S.M_SPEEDUP_RERUN_LOW,
        "speedup_rerun_high": S.M_SPEEDUP_RERUN_HIGH,
    }
    rows = []
    for record in part:
        figures = {attr: _number(record.get(column)) for attr, column in names.items()}
        rows.append(
            SimpleNamespace(
                model=record["section"],
                compiler=record["compiler"],
                label=record["compiler_label"],
                batch_size=int(record["batch_size"]),
                status=record["status"],
                stable=stable.get(record.get("stability")),
                **figures,
            )
        )
    return rows


# --- figures ----------------------------------------------------------------------------
def _color(compiler: str, cache: dict[str, str]) -> str:
    if compiler not in cache:
        from mlflow_ngraph.compilers.registry import declared

        found = declared(compiler)
        cache[compiler] = (found.color if found is not None else None) or OTHER_COLOR
    return cache[compiler]


def _hover(r: Mapping, value: str, low: str, high: str, unit: str) -> str:
    """One point's hover text: what it is, its figure and intervals, its marks."""
    lines = [f"<b>{esc(r['compiler_label'])}</b>, batch {r['batch_size']}"]
    figure = _number(r.get(value))
    interval = _pair(r.get(low), r.get(high))
    lines.append(f"{render.format_number(figure)} {unit}" + (f" [{interval}]" if interval else ""))
    rerun = _pair(r.get(f"{value}_rerun_low"), r.get(f"{value}_rerun_high"))
    if rerun:
        lines.append(f"re-run: [{rerun}]")
    if r.get("stability") == S.STABILITY_UNSTABLE:
        reason = r.get("stability_reason") or "reason not recorded"
        lines.append(f"<b>UNSTABLE</b>: {esc(reason)}")
    elif r.get("moved"):  # an UNSTABLE one names the move in its reason
        lines.append(f"<b>moved</b>: {esc(r['moved'])}")
    if r.get("status") != S.STATUS_OK:
        lines.append(f"status {esc(r.get('status'))}")
    return "<br>".join(lines)


def _pair(low: object, high: object) -> str:
    low, high = _number(low), _number(high)
    if low is None or high is None:
        return ""
    return f"{render.format_number(low)}-{render.format_number(high)}"


def _band(x: list, low: list, high: list, color: str, axes: tuple[str, str], group: str,
          dotted: bool) -> dict | None:  # fmt: skip
    """A closed polygon between the interval's ends over the batch sizes that have both:
    this run's filled, the re-run interval as a dotted outline."""
    kept = [(b, lo, hi) for b, lo, hi in zip(x, low, high, strict=True)
            if lo is not None and hi is not None]  # fmt: skip
    if not kept:
        return None
    xs = [b for b, _, _ in kept] + [b for b, _, _ in reversed(kept)]
    ys = [hi for _, _, hi in kept] + [lo for _, lo, _ in reversed(kept)]
    band = {"type": "scatter", "x": xs, "y": ys, "xaxis": axes[0], "yaxis": axes[1],
            "mode": "lines", "fill": "toself", "legendgroup": group, "showlegend": False,
            "hoverinfo": "skip", "line": {"width": 0, "color": color}, "opacity": 0.18}  # fmt: skip
    if dotted:
        band.update(fill="none", opacity=0.7, line={"width": 1, "color": color, "dash": "dot"})
    return band


def _error_bars(rows: list[dict], panel: str, low: str, high: str, color: str) -> dict:
    """This run's 95% interval on each point (the band joins them; a lone point has only
    its bar)."""
    up, down = [], []
    for r in rows:
        value, lo, hi = _number(r[panel]), _number(r.get(low)), _number(r.get(high))
        whole = None not in (value, lo, hi)
        up.append(hi - value if whole else None)
        down.append(value - lo if whole else None)
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down,
            "thickness": 1, "width": 4, "color": color}  # fmt: skip


def _traces(rows: list[dict], panel: str, style: dict, group: str, legend: bool) -> list[dict]:
    """One compiler setting's line on one panel (``throughput`` or ``speedup``), its bands,
    and its points: UNSTABLE hollow."""
    axes = ("x", "y") if panel == "throughput" else ("x2", "y2")
    low, high = (S.M_THROUGHPUT_CI_LOW, S.M_THROUGHPUT_CI_HIGH) if panel == "throughput" else (
        "speedup_ci_low", "speedup_ci_high")  # fmt: skip
    unit = "samples/s" if panel == "throughput" else "x eager"
    rows = [r for r in rows if _number(r.get(panel)) is not None]
    if not rows:
        return []
    x = [r["batch_size"] for r in rows]
    out = [
        _band(x, [_number(r.get(low)) for r in rows], [_number(r.get(high)) for r in rows],
              style["color"], axes, group, dotted=False),
        _band(x, [_number(r.get(f"{panel}_rerun_low")) for r in rows],
              [_number(r.get(f"{panel}_rerun_high")) for r in rows], style["color"], axes,
              group, dotted=True),
    ]  # fmt: skip
    unstable = [r.get("stability") == S.STABILITY_UNSTABLE for r in rows]
    out.append({
        "type": "scatter", "mode": "lines+markers", "name": esc(group), "legendgroup": group,
        "showlegend": legend, "x": x, "y": [_number(r[panel]) for r in rows],
        "xaxis": axes[0], "yaxis": axes[1], "line": {"color": style["color"],
        "dash": style["dash"]}, "marker": {"size": 9, "color": style["color"],
        "symbol": ["circle-open" if u else "circle" for u in unstable],
        "line": {"width": 2, "color": style["color"]}},
        "error_y": _error_bars(rows, panel, low, high, style["color"]),
        "hovertemplate": "%{text}<extra></extra>",
        "text": [_hover(r, panel, low, high, unit) for r in rows],
    })  # fmt: skip
    return [t for t in out if t is not None]


def _styles(part: list[dict]) -> dict[str, dict]:
    """Trace label -> colour (the compiler's, as in the MLflow view) and dash (which of
    that compiler's settings)."""
    colors: dict[str, str] = {}
    seen: dict[str, int] = {}
    out = {}
    for label, compiler in dict.fromkeys((r["compiler_label"], r["compiler"]) for r in part):
        index = seen.get(compiler, 0)
        seen[compiler] = index + 1
        out[label] = {"color": _color(compiler, colors), "dash": DASHES[index % len(DASHES)]}
    return out


def _range(part: list[dict], panel: str, low: str, high: str) -> tuple[list | None, list]:
    """The panel's y range: its STABLE points and their intervals (1 always in a speedup's),
    widened to the UNSTABLE points within :data:`OUTLIER` times that span; and the UNSTABLE
    points left outside it: one noise point far off would flatten every real figure.
    ``None`` (Plotly's own range) when no point is STABLE."""
    drawn = [r for r in part if _number(r[panel]) is not None]
    stable = [r for r in drawn if r["stability"] != S.STABILITY_UNSTABLE]
    ends = [v for r in stable for k in (panel, low, high) if (v := _number(r[k])) is not None]
    if not ends:
        return None, []
    top, bottom = max(ends), min(ends)
    if panel == "speedup":
        top, bottom = max(top, 1.0), min(bottom, 1.0)
    noisy = [r for r in drawn if r["stability"] == S.STABILITY_UNSTABLE]
    near = [r[panel] for r in noisy if bottom / OUTLIER <= r[panel] <= top * OUTLIER]
    top, bottom = max([top, *near]), min([bottom, *near])
    pad = 0.08 * (top - bottom) or 0.1 * abs(top) or 1.0
    top, bottom = top + pad, max(bottom - pad, 0.0)
    return [bottom, top], [r for r in noisy if not bottom <= r[panel] <= top]


def _off_axis(points: list[dict], panel: str, axes: tuple[str, str], span: list,
              sizes: list[int], log_x: bool) -> list[dict]:  # fmt: skip
    """An arrow at the edge of the axis for each UNSTABLE point beyond it, with its figure
    (``sizes``: the axis' batch sizes; on a log axis Plotly places an annotation in powers
    of ten). Plotly hides an arrow whose head is off the axis: it points from just inside."""
    inside = 0.01 * (span[1] - span[0])
    ends = {sizes[0]: "left", sizes[-1]: "right"} if len(sizes) > 1 else {}
    out = []
    for r in points:
        above, b = r[panel] > span[1], r["batch_size"]
        out.append({
            "x": math.log10(b) if log_x else b, "xref": axes[0], "xanchor": ends.get(b, "center"),
            "y": span[1] - inside if above else span[0] + inside, "yref": axes[1],
            "text": f"{render.format_number(r[panel])} UNSTABLE ({esc(r['compiler_label'])})",
            "showarrow": True, "ax": 0, "ay": 30 if above else -30, "arrowhead": 2,
            "bgcolor": "white", "font": {"size": 11, "color": "#b00020"},
            "arrowcolor": "#b00020",
        })  # fmt: skip
    return out


def _wide(part: list[dict], panel: str, span: list | None) -> bool:
    """Whether the panel's figures (those on its range) span more than :data:`LOG_RATIO`:
    a log axis then, else the small ones lie flat on zero."""
    values = [v for r in part if (v := _number(r[panel])) is not None]
    kept = [v for v in values if span is None or span[0] <= v <= span[1]]
    return bool(kept) and min(kept) > 0 and max(kept) / min(kept) > LOG_RATIO


def _x_range(sizes: list[int], log: bool) -> list[float]:
    """The batch-size axis' range, a margin either side (fixed: an arrow's label at its
    edge would otherwise widen it); a log axis' range is in powers of ten."""
    ends = [math.log10(max(sizes[0], 1)), math.log10(max(sizes[-1], 1))] if log else sizes
    low, high = ends[0], ends[-1]
    pad = 0.06 * (high - low) or 0.5
    return [low - pad, high + pad]


def _axes(part: list[dict]) -> dict:
    """The layout's axes (batch size on x at the measured sizes, log where they span a
    wide range), with an arrow for each UNSTABLE point left off its range."""
    sizes = sorted({r["batch_size"] for r in part})
    log_x = len(sizes) > 1 and sizes[-1] / max(sizes[0], 1) >= 8
    x = {
        "title": {"text": "batch size"},
        "tickvals": sizes,
        "type": "log" if log_x else "linear",
        "range": _x_range(sizes, log_x),
        **GRID,
    }
    layout: dict = {"xaxis": {**x, "domain": [0, 0.45]}, "annotations": [],
                    "xaxis2": {**x, "domain": [0.55, 1], "anchor": "y2"}}  # fmt: skip
    panels = (("throughput", "yaxis", S.M_THROUGHPUT_CI_LOW, S.M_THROUGHPUT_CI_HIGH,
               "throughput [samples/s]"),
              ("speedup", "yaxis2", "speedup_ci_low", "speedup_ci_high",
               "speedup over eager PyTorch [x]"))  # fmt: skip
    for panel, name, low, high, title in panels:
        axis: dict = {"title": {"text": title}, "rangemode": "tozero", **GRID}
        if name == "yaxis2":
            axis["anchor"] = "x2"
        span, off = _range(part, panel, low, high)
        if _wide(part, panel, span):
            axis.update(type="log", dtick=1)  # a label per power of ten
        elif span is not None:
            axis["range"] = span
            axes = ("x", "y") if name == "yaxis" else ("x2", "y2")
            layout["annotations"] += _off_axis(off, panel, axes, span, sizes, log_x)
        layout[name] = axis
    return layout


def model_figure(part: list[dict]) -> dict:
    """One model's figure (throughput and speedup over batch size, a line per compiler
    setting; the identity on the throughput panel only, its speedup being 1 by definition)
    as Plotly's JSON."""
    styles = _styles(part)
    data: list[dict] = []
    for label in styles:
        records = [r for r in part if r["compiler_label"] == label]
        data += _traces(records, "throughput", styles[label], str(label), legend=True)
        if records[0]["compiler"] != "identity":
            data += _traces(records, "speedup", styles[label], str(label), legend=False)
    layout = _axes(part)
    layout.update(
        height=380, margin={"l": 60, "r": 20, "t": 30, "b": 50}, hovermode="closest",
        legend={"orientation": "h", "y": -0.22}, plot_bgcolor="white",
        shapes=[{"type": "line", "xref": "x2 domain", "x0": 0, "x1": 1, "yref": "y2",
                 "y0": 1, "y1": 1, "line": {"color": "#888", "width": 1, "dash": "dash"}}],
    )  # fmt: skip
    return {"data": data, "layout": layout}


# --- tables -----------------------------------------------------------------------------
#: joins a stability mark and the guard's word on a move (``ngraph.moved.bs<b>``)
MOVED = "; moved: "


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], css: str = "") -> str:
    """An HTML table of already formatted cells, every cell escaped; a cell reading
    UNSTABLE is marked, and one a move was said of."""
    marks = {i for i, h in enumerate(headers) if h == "stable"}  # words, read from the left
    head = "".join(
        f'<th class="mark">{html.escape(h)}</th>' if i in marks else f"<th>{html.escape(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = esc(cell)
            if text.startswith("UNSTABLE"):  # the mark first, its reason smaller beside it
                mark, _, why = text.partition(": ")
                why = f'<span class="why">{why}</span>' if why else ""
                cells.append(f'<td class="unstable"><b>{mark}</b>{why}</td>')
            elif MOVED in text:  # STABLE, but the guard said it moved against an earlier run
                mark, _, why = text.partition(MOVED)
                cells.append(f'<td class="moved">{mark}<span class="why">moved: {why}</span></td>')
            else:
                cells.append(f'<td class="mark">{text}</td>' if i in marks else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


#: the figures table of a model: a column per figure, the paper's metrics among them
FIGURE_HEADERS = ["compiler", "bs", "samples/s [95% CI]", "re-run CI", "speedup [95% CI]",
                  "speedup re-run CI", "RTR", "ASE", "BSR", "status", "stable"]  # fmt: skip
FIGURE_LEGEND = (
    "95% CI: this run's interval; re-run CI: where a re-run on this host is expected to land "
    "(once the host has measured its spread between sittings). RTR: throughput at batch b "
    "over batch 1; ASE: RTR / b (1 = perfect batching); BSR: the compiler's ASE over eager's. "
    "A hollow point is UNSTABLE: noise on this host, measure it again on a quiet host. "
    "moved: the figure is further from the same engine measured earlier on this host than "
    "its intervals allow: the host's speed for it changed between the two."
)


def _with_interval(value: object, low: object, high: object) -> str:
    text = render.format_number(_number(value))
    interval = _pair(low, high)
    return f"{text} [{interval}]" if interval and text != render.MISSING else text


def _stable_text(r: Mapping) -> str:
    mark = r.get("stability")
    if mark == S.STABILITY_UNSTABLE:
        reason = r.get("stability_reason")
        return f"UNSTABLE: {reason}" if reason else "UNSTABLE"
    text = {S.STABILITY_STABLE: "yes"}.get(mark, "-")
    return f"{text}{MOVED}{r['moved']}" if r.get("moved") else text


def figures_table(part: list[dict]) -> str:
    """Every figure of one model: compiler setting x batch size."""
    rows = []
    for r in part:
        rows.append([
            r["compiler_label"], r["batch_size"],
            _with_interval(r[S.M_THROUGHPUT], r[S.M_THROUGHPUT_CI_LOW], r[S.M_THROUGHPUT_CI_HIGH]),
            _pair(r[S.M_THROUGHPUT_RERUN_LOW], r[S.M_THROUGHPUT_RERUN_HIGH]) or "-",
            _with_interval(r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"]),
            _pair(r[S.M_SPEEDUP_RERUN_LOW], r[S.M_SPEEDUP_RERUN_HIGH]) or "-",
            *(render.format_number(_number(r[m])) for m in ("rtr", "ase", "bsr")),
            r["status"], _stable_text(r),
        ])  # fmt: skip
    return _table(FIGURE_HEADERS, rows, "figures")


WINNERS_LEGEND = (
    "lead: over the next-fastest valid row; beyond noise when the two re-run intervals "
    "separate (a lead a re-run keeps); beyond this run's noise when this host has no spread "
    "between sittings yet (mlflow-ngraph calibrate measures it) and this run's 95% intervals "
    "separate; stable: the winner's own mark."
)


def winners_table(best: list[dict]) -> str:
    """The summary's winners table (:func:`~mlflow_ngraph.report.summary.winner_cells`)."""
    headers, rows = winner_cells(best)
    return _table(headers, rows, "winners")


def environment_table(environments: Sequence[Mapping[str, str]]) -> str:
    """The environment of the runs: a column per parent run, a row per key any has."""
    if not environments:
        return "<p class='note'>No parent run found: the environment is unknown.</p>"
    keys = list(dict.fromkeys(k for env in environments for k in env))
    rows = [[key, *(env.get(key, "-") for env in environments)] for key in keys]
    headers = ["", *(f"run {i + 1}" for i in range(len(environments)))]
    return _table(headers, rows, "environment")


def parent_environment(run) -> dict[str, str]:
    """What a parent run says of where it measured (an MLflow ``Run``): device, host,
    scenario, batch sizes, and every ``env.*`` tag (versions, CPU, threads, ...)."""
    params, tags = run.data.params, run.data.tags
    out = {
        "run": run.info.run_id,
        "device": _device(run) or "-",
        "device kind": params.get("device_kind", "-"),
        "host": tags.get(S.T_HOST, "-"),
        "scenario": params.get(S.P_SCENARIO, "-"),
        "batch sizes": params.get("batch_sizes", "-"),
        "compilers": params.get("compilers", "-"),
    }
    out.update({k[len("env.") :]: v for k, v in sorted(tags.items()) if k.startswith("env.")})
    return out


# --- the page ---------------------------------------------------------------------------
_STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em 2em;max-width:110em;color:#222}
h1{font-size:1.5em;margin-bottom:.2em}
h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 .3em}
th,td{border:1px solid #ddd;padding:4px 10px;text-align:right;white-space:nowrap}
th{background:#f5f5f5}td:first-child,th:first-child{text-align:left}
table.environment td{text-align:left;white-space:normal}
td.unstable{color:#b00020;white-space:normal;text-align:left;min-width:14em}
td.unstable .why{display:block;font-size:11px;color:#7a2a36;max-width:40em}
td.mark,th.mark{text-align:left}
td.moved{color:#8a5a00;white-space:normal;text-align:left;min-width:14em}
td.moved .why{display:block;font-size:11px;max-width:40em}
.note,.legend{color:#555;font-size:13px;max-width:70em}nav li{margin:.15em 0}"""


def _verdict(section: str, best: list[dict]) -> str:
    """One line of the contents: the model, linked, and which compiler wins where."""
    won: dict[str, list[str]] = {}
    for w in best:
        mark = "" if w["stable"] is not False else " (UNSTABLE)"
        won.setdefault(w["label"], []).append(f"{w['batch_size']}{mark}")
    text = "; ".join(f"<b>{esc(label)}</b> at batch {', '.join(b)}" for label, b in won.items())
    return text and f"fastest {text}" or "no valid compiled result"


def _section(index: int, section: str, part: list[dict], best: list[dict], first: bool) -> str:
    """One model's part of the page: its figure, its winners, its figures."""
    import plotly.io as pio

    figure = model_figure(part)
    div = pio.to_html(figure, include_plotlyjs=first, full_html=False, config=CONFIG,
                      validate=False, default_height="380px")  # fmt: skip
    out = [f'<section id="m{index}"><h2>{esc(section)}</h2>', div]
    if best:
        out += ["<h3>Fastest valid compiler per batch size</h3>", winners_table(best)]
    out += ["<h3>Every figure</h3>", figures_table(part), "</section>"]
    return "\n".join(out)


def _counts(part: list[dict]) -> str:
    unstable = sum(1 for r in part if r["stability"] == S.STABILITY_UNSTABLE)
    statuses: dict[str, int] = {}
    for r in part:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    status = ", ".join(f"{n} {esc(s)}" for s, n in sorted(statuses.items()))
    models = len({r["section"] for r in part})
    return (f"{len(part)} measurement(s) of {models} model(s): {status}; "
            f"{unstable} UNSTABLE (drawn hollow).")  # fmt: skip


def page(
    frame: pd.DataFrame,
    title: str,
    environments: Sequence[Mapping[str, str]] = (),
    notes: Sequence[str] = (),
) -> str:
    """The whole page of ``frame`` (prepared by :func:`.tables.prepare`): the contents with
    each model's verdict, a section per model, the environment of ``environments`` (a
    mapping per parent run, :func:`parent_environment`), ``notes`` said at the top."""
    part = keyed(frame)
    best = winners(verdict_rows(part))
    sections = list(dict.fromkeys(r["section"] for r in part))
    by_section = {s: [w for w in best if w["model"] == s] for s in sections}
    body = [f"<h1>{esc(title)}</h1>", f'<p class="note">{_counts(part)}</p>']
    body += [f'<p class="note">{esc(n)}</p>' for n in notes]
    items = [f'<li><a href="#m{i}">{esc(s)}</a>: {_verdict(s, by_section[s])}</li>'
             for i, s in enumerate(sections)]  # fmt: skip
    body.append(f"<nav><ul>{''.join(items)}</ul></nav>")
    body.append(f'<p class="legend">{html.escape(WINNERS_LEGEND)}</p>')
    body.append(f'<p class="legend">{html.escape(FIGURE_LEGEND)}</p>')
    groups: dict[str, list[dict]] = {}
    for r in part:
        groups.setdefault(r["section"], []).append(r)
    for i, section in enumerate(sections):
        body.append(_section(i, section, groups[section], by_section[section], first=i == 0))
    body += ["<h2>Environment</h2>", environment_table(environments)]
    head = f"<meta charset='utf-8'><title>{esc(title)}</title><style>{_STYLE}</style>"
    return f"<!DOCTYPE html>\n<html><head>{head}</head><body>\n{''.join(body)}\n</body></html>\n"


# --- where the page goes ----------------------------------------------------------------
def report_path(tracking_uri: str, name: str) -> Path:
    """Where the page is written: next to a local store (beside its sqlite file, beside its
    folder), in the current directory for a server's."""
    from mlflow_ngraph.tracking.mlflow_log import local_sqlite

    file_name = re.sub(r"[^A-Za-z0-9_.-]+", "-", visible(name)).strip("-.") + ".html"
    database = local_sqlite(tracking_uri)
    if database is not None:
        return database.resolve().parent / file_name
    if tracking_uri.startswith("file:") or "://" not in tracking_uri:
        folder = Path(tracking_uri.removeprefix("file://").removeprefix("file:"))
        return folder.resolve().parent / file_name
    return Path.cwd() / file_name


def _device(parent) -> str:
    """The device a benchmark's parent run measured on (its param, else its tag)."""
    return parent.data.params.get(S.P_DEVICE) or parent.data.tags.get(S.T_DEVICE, "")


def invocation_frame(client, tracking_uri: str, parent) -> pd.DataFrame:
    """The frame ``compare -e <experiment> --device <device>`` builds, cut to the cells of
    the benchmark run ``parent`` (its results index) and their identity baselines, at its
    batch sizes."""
    from mlflow_ngraph.report import tables
    from mlflow_ngraph.report.query import RunQuery, fetch_cells
    from mlflow_ngraph.tracking import index

    device = _device(parent)
    query = RunQuery(experiments=(parent.info.experiment_id,), devices=(device,))
    frame, _ = tables.prepare(fetch_cells(client, query, tracking_uri, tables.READ_METRICS))
    records = index.read(client, parent.info.run_id, parent.info.artifact_uri)
    own = {record["run_id"] for record in records}
    mine = frame["run_id"].isin(own)
    keys = set(frame.loc[mine, "baseline_key"])
    keep = mine | ((frame["compiler"] == tables.IDENTITY) & frame["baseline_key"].isin(keys))
    sizes = [int(b) for b in parent.data.params.get("batch_sizes", "").split(",") if b.isdigit()]
    return tables.select(frame[keep].reset_index(drop=True), batch_sizes=sizes)


def benchmark_report(client, tracking_uri: str, parent_id: str) -> Path:
    """The page of the benchmark run ``parent_id``: written next to the store and logged on
    the run as ``report.html``; returns the file's path.

    Raises:
        the store's errors, OSError (the folder cannot be written): the caller says them
        in one line, the run's results stand.
    """
    parent = client.get_run(parent_id)
    experiment = client.get_experiment(parent.info.experiment_id).name
    device = _device(parent)
    reading = logging.getLogger("mlflow_ngraph.report.query")
    level = reading.level
    reading.setLevel(logging.WARNING)  # what compare says of its reading, not a run's line
    try:
        frame = invocation_frame(client, tracking_uri, parent)
    finally:
        reading.setLevel(level)
    title = f"mlflow-ngraph benchmark: experiment {experiment}, device {device}"
    text = page(frame, title, [parent_environment(parent)])
    path = report_path(tracking_uri, f"ngraph-report-{experiment}-{device}")
    path.write_text(text, encoding="utf-8")
    client.log_text(parent_id, text, ARTIFACT)
    return path


#: parent runs whose environment a compare's page shows (the newest first)
MAX_ENVIRONMENTS = 8


def environments(client, frame: pd.DataFrame) -> list[dict[str, str]]:
    """The environment of each parent run of ``frame``'s cells, the newest first (at most
    :data:`MAX_ENVIRONMENTS`); a parent that cannot be read is left out."""
    newest = frame.sort_values("start_time", ascending=False, kind="stable")
    parents = [p for p in dict.fromkeys(newest["parent_run_id"]) if isinstance(p, str) and p]
    out = []
    for run_id in parents[:MAX_ENVIRONMENTS]:
        try:
            out.append(parent_environment(client.get_run(run_id)))
        except Exception as exc:  # deleted, or another store's: the page does without it
            log.info("parent run %s not read for the report: %s", run_id, exc)
    return out


def compare_report(client, tracking_uri: str, frame: pd.DataFrame, scope: str,
                   notes: Sequence[str]) -> tuple[str, Path]:  # fmt: skip
    """A compare's page (of its selected rows ``frame``), written next to the store;
    returns the page and the file's path."""
    title = f"mlflow-ngraph compare: {scope}"
    text = page(frame, title, environments(client, frame), notes)
    path = report_path(tracking_uri, "ngraph-compare-report")
    path.write_text(text, encoding="utf-8")
    return text, path
