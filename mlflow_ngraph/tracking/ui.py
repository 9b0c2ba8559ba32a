"""What the MLflow UI shows of a benchmark: a designed view, the descriptions, run colors.

At the end of an invocation the runner's store session writes:

- a shared view, the experiment tag ``mlflow.sharedViewState.<KEY>`` that MLflow 3.17's
  experiment page loads from ``#/experiments/<ID>/runs?viewStateShareKey=<KEY>``: the cells
  of this device grouped by model (MLflow's run grouping on the run tag ``model``, the
  model as the summary names it), winner first in each group, with columns that answer
  (model, compiler, where it is the fastest, then per batch size its throughput, speedup,
  the speedup's interval, its lead and its own stability, rounded: run tags, as MLflow
  shows a metric unrounded), and a chart section per model (throughput and speedup over
  batch size, drawn from per-model copies of the figures, the UNSTABLE ones apart and
  outside the axis range); every flat ``<metric>.bs<b>`` copy is a deleted card of that
  set, so it never draws as a single dot;
- the verdict per model and the summary's winners table, with each row's stability, as
  the markdown description (``mlflow.note.content``) of the experiment (one section per
  view) and of the parent run; each cell run's description holds its own figures;
- a color per compiler (``mlflow.runColor``) on every cell run, the same in every chart.

The formats are MLflow's own (``mlflow/server/js``, 3.17): a saved-view envelope
``{name, createdAt, updatedAt, state}`` whose ``state`` is the view's JSON, or that JSON
zlib-deflated and base64-encoded behind ``deflate;`` when it is long. The loader keeps the
search facets (``searchFilter``, ``orderByKey``, ``orderByAsc``, ...) and the UI state
(``selectedColumns``, ``compareRunCharts``, ``compareRunSections``, ``runsHiddenMode``,
...) and drops ``runsExpanded``, ``runsPinned``, ``runsHidden`` and ``runsVisibilityMap``.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlencode

from mlflow_ngraph.measure.legend import meaning
from mlflow_ngraph.measure.verdict import NO_RERUN, shown_rerun, winners
from mlflow_ngraph.plan.cells import cell_run_name, compiler_label, differing_flags
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

VIEW_TAG_PREFIX = "mlflow.sharedViewState."  # MLflow's constant (experiment page)
VIEW_PARAM = "viewStateShareKey"
NOTE_TAG = "mlflow.note.content"  # the description of an experiment or a run
RUN_COLOR_TAG = "mlflow.runColor"
#: the experiment page opens in MLflow's model-training view with this address parameter;
#: MLflow 3.17 reads the workflow type from the address (else the browser's last choice,
#: GenAI by default), not from the experiment's ``mlflow.experimentKind`` tag
WORKFLOW = {"workflowType": "machine_learning"}
#: MLflow's limits: an experiment tag's value, a run tag's value
MAX_EXPERIMENT_TAG = 20000
MAX_RUN_TAG = 8000

MORE_SECTION = "ngraph-more"
#: MLflow puts every chart of a metric without a ``/`` in its name into the section of this
#: name: the stepped metrics it adds on its own land there, collapsed
MLFLOW_METRICS_SECTION = "Model metrics"

#: the colour of a compiler that declares none (each declares its own, ``Compiler.color``:
#: matplotlib's tab10, identity grey), the same in every chart
OTHER_COLOR = "#17becf"


def view_key(device: str, spec_hash: str) -> str:
    """``ngraph-cpu-1a2b3c4d``: the share key of a spec's view on a device."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", device).strip("-") or "device"
    return f"ngraph-{slug}-{spec_hash[:8]}"


def view_address(base: str, experiment_id: str, key: str, charts: bool = False) -> str:
    """The address of the view: ``<base>/#/experiments/<ID>/runs?viewStateShareKey=<KEY>``
    (``charts``: opened on the chart set rather than the table); relative to the page it is
    on (``#/experiments/...``) when ``base`` is empty."""
    query = {VIEW_PARAM: key, **WORKFLOW}
    if charts:
        query["compareRunsMode"] = "CHART"
    page = f"#/experiments/{experiment_id}/runs?{urlencode(query)}"
    return f"{base.rstrip('/')}/{page}" if base else page


# --- the view's state --------------------------------------------------------------------
#: a cell run's tag naming its model as the summary does (``mha_block d3 w256``; the param
#: ``model`` is the name alone): the table's model column and what the view groups on
MODEL_TAG = "model"
#: a cell run's tag: the batch sizes at which it is its model's fastest (``bs1, bs8``)
FASTEST_TAG = "fastest at"
#: a cell run's figures per batch size as the table shows them, rounded (MLflow 3.17's runs
#: table shows a metric as logged, ``1.76828984...``): tags ``bs8 samples/s``, ...
FIGURES = ("samples/s", "speedup", "speedup CI", "re-run CI", "lead", "stable")


def model_title(label: str) -> str:
    """``mha_block:depth=3,width=256`` -> ``mha_block d3 w256``, as the run names say it."""
    return cell_run_name(label, "", {}, ()).strip()


def metric_title(label: str) -> str:
    """The model's title as a metric key's part: what MLflow allows in one (letters, digits,
    ``_-. :``), ``image_size=32`` -> ``image_size32``."""
    return re.sub(r"[^\w.\- :]", "", model_title(label).replace("=", ""))


def figure_tag(batch_size: int, figure: str) -> str:
    """``8``, ``speedup`` -> ``bs8 speedup``: the tag (and column) of a figure."""
    return f"bs{batch_size} {figure}"


def _column(kind: str, key: str) -> str:
    """A runs-table column as MLflow names it: ``tags.`bs8 speedup```."""
    return f"{kind}.`{key}`"


def columns(batch_sizes: Sequence[int]) -> list[str]:
    """The runs table's columns, in this order: the model (as the summary names it), the
    compiler, where it is the fastest, then per batch size (smallest first) its throughput,
    speedup, the speedup's 95% interval (this run's), where a re-run is expected to land,
    its lead over the next-fastest row and its own stability, all rounded; the status and
    the device last."""
    out = [_column("tags", MODEL_TAG), _column("params", S.P_COMPILER)]
    out.append(_column("tags", FASTEST_TAG))
    for b in sorted(batch_sizes):
        out += [_column("tags", figure_tag(b, f)) for f in FIGURES]
    return out + [_column("tags", S.T_STATUS), _column("params", S.P_DEVICE)]


#: the runs table's column widths (px): the model's label and the run's name are long
WIDTHS = {
    _column("tags", MODEL_TAG): 150,
    _column("params", S.P_COMPILER): 100,
    _column("tags", FASTEST_TAG): 90,
    _column("params", S.P_DEVICE): 70,
    _column("tags", S.T_STATUS): 80,
}
NAME_COLUMN = "attributes.`Run Name`"
NAME_WIDTH, FIGURE_WIDTH = 230, 95
FIGURE_WIDTHS = {"speedup CI": 110, "re-run CI": 110, "stable": 90, "lead": 75}


def widths(selected: Sequence[str]) -> dict[str, int]:
    """The width of each selected column, and of the run's name."""
    out = {NAME_COLUMN: NAME_WIDTH}
    for column in selected:
        figure = column.rstrip("`").partition(" ")[2]
        out[column] = WIDTHS.get(column, FIGURE_WIDTHS.get(figure, FIGURE_WIDTH))
    return out


def group_by() -> dict[str, Any]:
    """MLflow's run grouping on the model tag: one group per model, its runs in the view's
    order (winner first) inside it, every group open."""
    return {"aggregateFunction": "max", "groupByKeys": [{"mode": "tag", "groupByData": MODEL_TAG}]}


def sort_metric(batch_sizes: Sequence[int], rows: Iterable[Any]) -> str:
    """The metric the table sorts on, highest first: the speedup at the largest batch size
    (comparable across models), the throughput where no speedup was measured."""
    largest = max(batch_sizes)
    has_speedup = any(
        getattr(r, "speedup", None) is not None and r.batch_size == largest for r in rows
    )
    return S.flat_key(S.M_SPEEDUP if has_speedup else S.M_THROUGHPUT, largest)


def _score(row: Any, paired: bool) -> float | None:
    if not paired:
        return row.throughput
    return 1.0 if row.compiler == "identity" else getattr(row, "speedup", None)


def leads(rows: Sequence[Any]) -> dict[int, float]:
    """Per row (by ``id``), its lead over the next-fastest valid row of its model and batch
    size, ranked as the winners are (the paired speedups where every valid row has one,
    else the throughputs); the slowest row has none."""
    groups: dict[tuple[str, int], list[Any]] = {}
    for r in rows:
        if r.status == S.STATUS_OK and r.throughput is not None:
            groups.setdefault((r.model, r.batch_size), []).append(r)
    out: dict[int, float] = {}
    for valid in groups.values():
        paired = all(_score(r, True) is not None for r in valid)
        ranked_rows = sorted(valid, key=lambda r: _score(r, paired), reverse=True)
        for a, b in zip(ranked_rows, ranked_rows[1:]):
            if _score(b, paired):
                out[id(a)] = _score(a, paired) / _score(b, paired)
    return out


def _rate(value: float | None) -> str:
    """A throughput rounded to what a reader compares: ``0.52``, ``38.4``, ``1234``."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def figure_tags(own: Sequence[Any], lead: dict[int, float], won: Sequence[int]) -> dict[str, str]:
    """A cell run's rounded figures per batch size (:data:`FIGURES`) and where it wins."""
    tags = {MODEL_TAG: model_title(own[0].model)} if own else {}
    tags[FASTEST_TAG] = ", ".join(f"bs{b}" for b in sorted(won)) or "-"
    for r in own:
        stable = {True: "STABLE", False: "UNSTABLE", None: "-"}[getattr(r, "stable", None)]
        values = [_rate(r.throughput), _fmt(r.speedup, 2, "x"), _ends(_speedup_ci(r), True)]
        low, high, speedup = shown_rerun(r)
        values += [_ends((low, high), speedup), _fmt(lead.get(id(r)), 2, "x"), stable]
        if r.status != S.STATUS_OK:
            values = [r.status] + ["-"] * (len(FIGURES) - 1)
        tags.update({figure_tag(r.batch_size, f): v for f, v in zip(FIGURES, values)})
    return tags


def _speedup_ci(r: Any) -> tuple[float | None, float | None]:
    """A row's speedup interval as the summary shows it (the one rule of
    :func:`mlflow_ngraph.measure.verdict.speedup_interval`, set by ``settle``), the paired
    rounds' where the row was not settled."""
    if hasattr(r, "speedup_interval"):
        return r.speedup_interval or (None, None)
    return getattr(r, "speedup_ci_low", None), getattr(r, "speedup_ci_high", None)


def _ends(interval: tuple[float | None, float | None] | None, speedup: bool) -> str:
    """``1.80-1.95`` (a speedup's, two decimals) or a throughput's ends rounded as
    :func:`_rate` rounds them; ``-`` where either end is missing."""
    low, high = interval or (None, None)
    if low is None or high is None:
        return "-"
    return f"{low:.2f}-{high:.2f}" if speedup else f"{_rate(low)}-{_rate(high)}"


def view_points(own: Sequence[Any]) -> list[tuple[str, float, int]]:
    """A cell run's per-model metrics (``S.view_metric``) at step = batch size: what the
    view's panel of its model draws, its UNSTABLE figures on their own line."""
    points = []
    for r in own:
        if r.status != S.STATUS_OK:
            continue
        for metric, value in ((S.M_THROUGHPUT, r.throughput), (S.M_SPEEDUP, r.speedup)):
            if value is not None and math.isfinite(value):
                key = S.view_metric(metric_title(r.model), metric, r.stable is not False)
                points.append((key, value, r.batch_size))
    return points


def _card(uuid: str, kind: str, metric: str, title: str, section: str, **more: Any):
    """A chart card as MLflow's chart set serializes it."""
    return {
        "uuid": uuid,
        "type": kind,
        "metricSectionId": section,
        "deleted": False,
        "isGenerated": False,
        "displayName": title,
        "metricKey": metric,
        **more,
    }


def axis(values: Iterable[float], log_from: float = 10.0) -> tuple[str, dict[str, float]]:
    """The scale (``log`` where the largest value is ``log_from`` times the smallest or
    more) and the range (in the axis's own units, log10 on a log axis, as Plotly takes it)
    that hold ``values`` with a margin; no range where there are none."""
    values = sorted(v for v in values if v is not None and math.isfinite(v) and v > 0)
    if not values:
        return "linear", {}
    low, high = values[0], values[-1]
    if high / low >= log_from:
        return "log", {"min": math.log10(low) - 0.1, "max": math.log10(high) + 0.15}
    pad = 0.12 * (high - low) or 0.1 * high
    return "linear", {"min": max(0.0, low - pad), "max": high + pad}


def _line(uuid: str, metric: str, title: str, section: str, figures, sizes) -> dict[str, Any]:
    """A model's panel of one metric over batch size (the step), one line per run: its
    STABLE figures (the axis range) and its UNSTABLE ones (a second, dashed line where the
    run has both, outside the range where they lie out of it). ``figures``: (value,
    stable) of every valid row; the scale is the STABLE ones', all of them where none is."""
    stable = [v for v, ok in figures if ok]
    scale, y = axis(stable)
    if not stable:
        scale = axis(v for v, _ in figures)[0]
    x_scale, x = axis(sizes, log_from=4.0)
    rng = {"yMin": y.get("min"), "yMax": y.get("max"), "xMin": x.get("min"), "xMax": x.get("max")}
    return _card(
        uuid,
        "LINE",
        metric,
        title,
        section,
        runsCountToCompare=50,
        selectedMetricKeys=[metric, metric + S.VIEW_UNSTABLE],
        lineSmoothness=0,
        xAxisScaleType=x_scale,
        scaleType=scale,
        range={k: v for k, v in rng.items() if v is not None},
        xAxisKey="step",
        selectedXAxisMetricKey="",
        yAxisKey="metric",
        yAxisExpressions=[],
        displayPoints=True,
        ignoreOutliers=False,
        useGlobalXaxisKey=False,
        useGlobalLineSmoothing=False,
    )


def _models(rows: Sequence[Any], batch_sizes: Sequence[int]) -> list[str]:
    """The model labels of ``rows`` in the table's order of its groups: by their best
    figure at the largest batch size (the sort metric's), highest first."""
    key = S.parse_flat_key(sort_metric(batch_sizes, rows))
    best: dict[str, float] = {}
    for r in rows:
        value = getattr(r, key[0]) if r.batch_size == key[1] and r.status == S.STATUS_OK else None
        best[r.model] = max(best.get(r.model, -math.inf), value if value is not None else -math.inf)
    return sorted(best, key=lambda label: -best[label])


def answer_charts(batch_sizes: Sequence[int], rows: Sequence[Any]) -> list[dict[str, Any]]:
    """One panel per model (its own section, named by the model): throughput and speedup
    over batch size, the axis range on its STABLE figures, a log axis where they span a
    factor of 10 (a log batch-size axis where the sizes span a factor of 4)."""
    sizes = ", ".join(str(b) for b in sorted(batch_sizes))
    charts = []
    for i, label in enumerate(_models(rows, batch_sizes)):
        own = [r for r in rows if r.model == label and r.status == S.STATUS_OK]
        for metric, unit in ((S.M_THROUGHPUT, "samples/s"), (S.M_SPEEDUP, "speedup")):
            figures = [(getattr(r, metric), r.stable is not False) for r in own]
            name = f"{unit} over batch size {sizes} (the step)"
            key = S.view_metric(metric_title(label), metric)
            card = _line(
                f"ngraph-{i}-{metric}", key, name, f"ngraph-model-{i}", figures, batch_sizes
            )
            charts.append(card)
    return charts


def hidden_charts(metric_keys: Iterable[str], shown: Iterable[str]) -> list[dict[str, Any]]:
    """A deleted card for every flat key and per-model copy not shown: MLflow adds a chart
    for every metric its chart set lacks, and a flat key (one value) would draw as a single
    dot, a per-model UNSTABLE line a second chart of what its panel draws."""
    keep = set(shown)
    hide = sorted(k for k in set(metric_keys) if S.parse_flat_key(k) or "/" in k)
    return [
        {
            "uuid": f"ngraph-hidden-{i}",
            "type": "LINE",
            "metricSectionId": MORE_SECTION,
            "deleted": True,
            "isGenerated": True,
            "metricKey": key,
        }
        for i, key in enumerate(hide)
        if key not in keep
    ]


def sections(rows: Sequence[Any] = (), batch_sizes: Sequence[int] = (1,)) -> list[dict[str, Any]]:
    """A section per model, open; MLflow's own (the other stepped metrics) collapsed."""

    def section(uuid: str, name: str, display: bool) -> dict[str, Any]:
        return {
            "uuid": uuid,
            "name": name,
            "display": display,
            "isReordered": False,
            "deleted": False,
            "isGenerated": False,
            # a model's two panels side by side, each half the width (MLflow's default: 3)
            "columns": 2,
            "cardHeight": 360,
        }

    models = enumerate(_models(rows, batch_sizes))
    out = [section(f"ngraph-model-{i}", model_title(label), True) for i, label in models]
    return [*out, section(MORE_SECTION, MLFLOW_METRICS_SECTION, False)]


def table_state(selected: Sequence[str]) -> dict[str, Any]:
    """A view's runs table: every active run of any time, these columns in this order."""
    return {
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": list(selected),
        # MLflow groups columns by kind (metrics, params, tags): this order puts who first
        "columnOrder": list(selected),
        "columnWidths": widths(selected),
    }


def view_state(
    device: str,
    batch_sizes: Sequence[int],
    rows: Sequence[Any],
    metric_keys: Iterable[str],
    parent_id: str | None = None,
) -> dict[str, Any]:
    """The shared view of a device's cells (see the module's docstring).

    Args:
        metric_keys: every metric key of the runs the view shows (their flat keys are
            hidden from the chart set).
    """
    sort_key = sort_metric(batch_sizes, rows)
    charts = answer_charts(batch_sizes, rows)
    shown = [c["metricKey"] for c in charts]
    device_literal = device.replace("'", "\\'")
    selected = columns(batch_sizes)
    return {
        "searchFilter": f"params.{S.P_DEVICE} = '{device_literal}' and tags.`{S.T_ROLE}` = 'cell'",
        "orderByKey": _column("metrics", sort_key),
        "orderByAsc": False,
        **table_state(selected),
        # dropped by MLflow 3.17's loader; kept for the versions that read it
        "runsExpanded": {parent_id: True} if parent_id else {},
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts + hidden_charts(metric_keys, shown),
        "compareRunSections": sections(rows, batch_sizes),
        # MLflow sorts the sections by name unless told they were ordered by hand: the
        # panels keep the order of the table's groups
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
        # the charts draw each run, not each group's aggregate
        "useGroupedValuesInCharts": False,
        "groupBy": group_by(),
        "groupsExpanded": {},
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
    }


def encode_view(name: str, state: dict[str, Any], now_ms: int | None = None) -> str:
    """The tag value MLflow's loader reads: a saved-view envelope (listed by name among the
    experiment's saved views), its state deflated when the plain JSON would not fit,
    without the hidden cards when even that would not, then with the columns of fewer
    batch sizes."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    text = json.dumps(state, separators=(",", ":"))

    def envelope(inner: str) -> str:
        return json.dumps({"name": name, "createdAt": now_ms, "updatedAt": now_ms, "state": inner})

    value = envelope(text)
    if len(value) > MAX_EXPERIMENT_TAG:
        value = envelope("deflate;" + base64.b64encode(zlib.compress(text.encode(), 9)).decode())
    if len(value) > MAX_EXPERIMENT_TAG and any(c["deleted"] for c in state["compareRunCharts"]):
        # too many flat keys to hide: MLflow then draws them in its own section, collapsed
        shown = [c for c in state["compareRunCharts"] if not c["deleted"]]
        return encode_view(name, {**state, "compareRunCharts": shown}, now_ms)
    if len(value) > MAX_EXPERIMENT_TAG and len(state["selectedColumns"]) > 8:
        # a batch size's columns each: the first ones (the smallest batch sizes) stay
        kept = state["selectedColumns"][: len(state["selectedColumns"]) // 2]
        cut = {"selectedColumns": kept, "columnOrder": kept, "columnWidths": widths(kept)}
        return encode_view(name, {**state, **cut}, now_ms)
    return value


# --- the description ---------------------------------------------------------------------
def _fmt(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(cells: Iterable[Any]) -> str:
    """A markdown table row whose cells keep a space on each side: MLflow's description
    renders a table without cell padding (``width=1281`` for ``width=128`` beside ``1``),
    and a plain space is trimmed away."""
    return "|" + "|".join(f"&nbsp;{_cell(c)}&nbsp;" for c in cells) + "|"


def _stable(w: dict[str, Any]) -> str:
    mark = {True: "yes", False: "**UNSTABLE**", None: "-"}[w["stable"]]
    return mark + (f" ({', '.join(w['unstable'])})" if w.get("unstable") else "")


def labels(settings: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """The compiler label of each (compiler, flags), as the summary names them."""
    settings = list(settings)
    differing = differing_flags(settings)
    return [compiler_label(c, flags, differing.get(c, ())) for c, flags in settings]


def run_address(experiment_id: str, run_id: str) -> str:
    """A run's page, relative, in MLflow's model-training view."""
    return f"#/experiments/{experiment_id}/runs/{run_id}?{urlencode(WORKFLOW)}"


def ranked(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The summary's winners of ``rows`` (each row labelled as the summary labels it), each
    model named as the run names say it (``mha_block d3 w256``)."""
    settings = [(r.compiler, getattr(r, "flags", {}) or {}) for r in rows]
    for r, label in zip(rows, labels(settings), strict=True):
        r.label = getattr(r, "label", None) or label
    return [{**w, "model": model_title(w["model"])} for w in winners(rows)]


def verdicts(best: Sequence[dict[str, Any]]) -> list[str]:
    """One markdown line per model: which compiler is fastest at which batch sizes, and
    where that is noise (UNSTABLE)."""
    by_model: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for w in best:
        by_model.setdefault(w["model"], {}).setdefault(w["label"], []).append(w)
    lines = []
    for model, per_label in by_model.items():
        parts = []
        for label, won in per_label.items():
            batches = ", ".join(str(w["batch_size"]) for w in won)
            unstable = [str(w["batch_size"]) for w in won if w["stable"] is False]
            note = f" (**UNSTABLE** at {', '.join(unstable)})" if unstable else ""
            parts.append(f"**{label}** at batch {batches}{note}")
        lines.append(f"- {_cell(model)}: fastest " + "; ".join(parts))
    return lines


#: the winners table's columns in a description
WINNER_COLUMNS = ("model", "batch", "fastest", "samples/s", "speedup", "next", "lead", "noise",
                  "stable")  # fmt: skip
#: a cell run's table of its batch sizes
CELL_COLUMNS = ("batch", "samples/s", "95% CI", "throughput re-run", "speedup", "speedup CI",
                "speedup re-run", "status", "stable")  # fmt: skip


def legend_markdown(columns: Sequence[str]) -> str:
    """One line per column of a description's table (:mod:`mlflow_ngraph.measure.legend`),
    as one markdown paragraph with a line break after each."""
    lines = [f"*{c}*: {meaning(c)}" for c in columns if meaning(c)]
    return "  \n".join(lines)


def winners_markdown(
    best: Sequence[dict[str, Any]], links: dict[tuple[str, str], str] | None = None
) -> list[str]:
    """The summary's winners table as markdown lines (empty when there is no winner); a
    winner whose (model, compiler label) is in ``links`` links to that address."""
    if not best:
        return []
    lines = [_row(WINNER_COLUMNS), "|---|---:|---|---:|---:|---|---:|---|---|"]
    for w in best:
        cells = [
            w["model"],
            w["batch_size"],
            _linked(w, links or {}),
            _fmt(w["throughput"], 1),
            _fmt(w["speedup"], 2, "x"),
            w["next"] or "-",
            _fmt(w["lead"], 2, "x"),
            w["noise"],
            _stable(w),
        ]
        lines.append(_row(cells))
    return lines


def _linked(winner: dict[str, Any], links: dict[tuple[str, str], str]) -> str:
    address = links.get((winner["model"], winner["label"]))
    label = winner["label"].replace("[", "\\[").replace("]", "\\]")
    return f"**[{label}]({address})**" if address else f"**{label}**"


def section_title(device: str, key: str) -> str:
    return f"### {device}: fastest valid compiler per model and batch size (view {key})"


def description(
    device: str,
    spec,
    rows: Sequence[Any],
    key: str,
    experiment_id: str,
    limit: int,
    links: dict[tuple[str, str], str] | None = None,
    report: str | None = None,
) -> str:
    """The markdown section of one view: the verdict per model, where the view opens (and
    the HTML report, ``report``'s address), the winners table (each winner linked to its
    run, ``links``), what UNSTABLE means; rows are cut to fit ``limit`` characters."""
    best = ranked(rows)
    opened = f"**[The report (HTML)]({report})** · " if report else ""
    head = [
        section_title(device, key),
        "",
        *(verdicts(best) or ["No valid compiled result yet."]),
        "",
        f"{opened}[Open the answer]({view_address('', experiment_id, key)}) · "
        f"[charts]({view_address('', experiment_id, key, charts=True)}) · scenario "
        f"{spec.measure.scenario}, batch sizes {', '.join(str(b) for b in spec.batch_sizes)}",
        "",
    ]
    table = winners_markdown(best, links)
    tail = [
        "",
        legend_markdown(WINNER_COLUMNS),
        "",
        "**UNSTABLE**: measure it again on a quiet host. All rows: `mlflow-ngraph compare`.",
        "",
        "*The view*: the cells grouped by model, each batch size's figures rounded with their "
        "own stability; a chart panel per model over the measured batch sizes (the step), "
        "UNSTABLE figures on a line of their own, outside the axis range. A run opened from "
        "the table's run name follows the browser's GenAI / Model training switch (top "
        "left; GenAI by default): set it to Model training once.",
    ]
    text = "\n".join(head + table + tail)
    while len(text) > limit and len(table) > 3:
        table = table[:-1]
        cut = [*table, "| ... rows cut to fit MLflow's limit: `mlflow-ngraph compare` |" + " |" * 8]
        text = "\n".join(head + cut + tail)
    return text[:limit]


def cell_note(rows: Sequence[Any], best: Sequence[dict[str, Any]], view: str) -> str:
    """A cell run's description: its figures per batch size, where it is the fastest, and
    the way to the view of all cells."""
    lines = [_row(CELL_COLUMNS), "|---:|---:|---|---|---:|---|---|---|---|"]
    rerun = False
    for r in sorted(rows, key=lambda r: r.batch_size):
        stable = {True: "yes", False: "**UNSTABLE**", None: "-"}[getattr(r, "stable", None)]
        low, high = getattr(r, "speedup_rerun_low", None), getattr(r, "speedup_rerun_high", None)
        ends = {
            "ci": (getattr(r, "ci_low", None), getattr(r, "ci_high", None)),
            "rerun": (getattr(r, "rerun_low", None), getattr(r, "rerun_high", None)),
        }
        rerun = rerun or None not in ends["rerun"] or None not in (low, high)
        cells = [r.batch_size, _fmt(r.throughput, 1), _ends(ends["ci"], False)]
        cells += [_ends(ends["rerun"], False), _fmt(r.speedup, 2, "x")]
        cells += [_ends(_speedup_ci(r), True), _ends((low, high), True), r.status, stable]
        lines.append(_row(cells))
    won = [str(w["batch_size"]) for w in best]
    verdict = f"Fastest for its model at batch {', '.join(won)}. " if won else ""
    head = f"{verdict}[All cells, winner first]({view})"
    legend = legend_markdown(CELL_COLUMNS)
    if not rerun and rows:
        legend += f"  \n*re-run*: {NO_RERUN}"
    return "\n".join([head, "", *lines, "", legend])[:MAX_RUN_TAG]


def merge_sections(existing: str, key: str, section: str, limit: int) -> str:
    """The experiment's description with this view's section replaced (or added first);
    text written by hand before the first section stays, the oldest sections go first
    when the whole would not fit."""
    pattern = re.compile(r"^### .*\(view [^)]+\)$", re.MULTILINE)
    starts = [m.start() for m in pattern.finditer(existing or "")]
    if not starts:
        own, parts = (existing or "").strip(), []
    else:
        own = existing[: starts[0]].strip()
        bounds = [*starts, len(existing)]
        parts = [existing[a:b].strip() for a, b in zip(bounds, bounds[1:])]
    parts = [p for p in parts if not p.splitlines()[0].endswith(f"(view {key})")]
    kept = [section, *parts]
    while True:
        text = "\n\n".join(p for p in [own, *kept] if p)
        if len(text) <= limit or len(kept) == 1:
            return text[:limit]
        kept.pop()


# --- writing it ----------------------------------------------------------------------------
def run_color(compiler: str) -> str:
    from mlflow_ngraph.compilers.registry import declared

    found = declared(compiler)
    return (found.color if found is not None else None) or OTHER_COLOR


#: the HTML report's artifact path on the parent run (report/html.py), linked at the top
REPORT_ARTIFACT = "report.html"


def report_address(experiment_id: str, parent_id: str) -> str:
    """The parent run's HTML report in MLflow's artifact viewer. The command logs it once
    the run's cells are done, after this view is written: the link is made before the
    file exists (a report that could not be made is said in the terminal)."""
    return f"#/experiments/{experiment_id}/runs/{parent_id}/artifacts/{REPORT_ARTIFACT}"


def new_points(client, run_id: str, points: Sequence[tuple[str, float, int]]) -> list:
    """The ``points`` a run's metric history lacks: a view written again (a re-run that
    measured nothing new) adds no second point at a step."""
    histories: dict[str, set[tuple[int, float]]] = {}
    out = []
    for key, value, step in points:
        if key not in histories:
            histories[key] = {(m.step, m.value) for m in client.get_metric_history(run_id, key)}
        if (step, value) not in histories[key]:
            out.append((key, value, step))
    return out


def publish(
    client,
    experiment_id: str,
    parent_id: str,
    spec,
    device: str,
    rows: Sequence[Any],
    cells: dict[str, tuple[str, str, dict[str, Any]]],
) -> str:
    """Write the view, the descriptions, the run colors and each cell run's rounded figures
    and per-model metrics; returns the view's key.

    Args:
        cells: (model label, compiler, flags) of each cell run id of this invocation.
    """
    from mlflow_ngraph.tracking.mlflow_log import log_batch

    key = view_key(device, spec.spec_hash)
    view = view_address("", experiment_id, key)
    names = labels((compiler, flags) for _, compiler, flags in cells.values())
    best = ranked(rows)
    lead = leads(rows)
    links: dict[tuple[str, str], str] = {}
    metric_keys: set[str] = set()
    for (run_id, (model, compiler, flags)), label in zip(cells.items(), names, strict=True):
        links[(model_title(model), label)] = run_address(experiment_id, run_id)
        own = [r for r in rows if (r.model, r.compiler, r.flags) == (model, compiler, flags)]
        won = [w for w in best if (w["model"], w["label"]) == (model_title(model), label)]
        tags = {RUN_COLOR_TAG: run_color(compiler), NOTE_TAG: cell_note(own, won, view)}
        tags.update(figure_tags(own, lead, [w["batch_size"] for w in won]))
        points = new_points(client, run_id, view_points(own))
        log_batch(client, run_id, metrics=points, tags=tags)
        metric_keys.update(client.get_run(run_id).data.metrics)
    state = view_state(device, spec.batch_sizes, rows, metric_keys, parent_id)
    name = f"mlflow-ngraph: {device}, {', '.join(m.label for m in spec.models)[:80]}"
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, encode_view(name, state))
    experiment = client.get_experiment(experiment_id)
    report = report_address(experiment_id, parent_id)
    half = MAX_EXPERIMENT_TAG // 2
    section = description(device, spec, rows, key, experiment_id, half, links, report)
    merged = merge_sections(
        (experiment.tags or {}).get(NOTE_TAG, ""), key, section, MAX_EXPERIMENT_TAG
    )
    client.set_experiment_tag(experiment_id, NOTE_TAG, merged)
    parent_note = description(device, spec, rows, key, experiment_id, MAX_RUN_TAG, links, report)
    log_batch(client, parent_id, tags={NOTE_TAG: parent_note})
    return key
