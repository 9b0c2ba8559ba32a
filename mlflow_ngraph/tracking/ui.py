"""What the MLflow UI shows of a benchmark: a designed view, the descriptions, run colors.

At the end of an invocation the runner's store session writes:

- a shared view, the experiment tag ``mlflow.sharedViewState.<KEY>`` that MLflow 3.17's
  experiment page loads from ``#/experiments/<ID>/runs?viewStateShareKey=<KEY>``: the cells
  of this device, flat (nested runs are shown flat when sorted by a metric), sorted winner
  first, with the columns that answer (model, compiler, device, throughput and speedup at
  each batch size, stability, output check), and a chart set that answers first (throughput
  and speedup over batch size, speedup at the largest batch size per run); every flat
  ``<metric>.bs<b>`` copy is a deleted card of that set, so it never draws as a single dot;
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
import re
import time
import zlib
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlencode

from mlflow_ngraph.measure.legend import meaning
from mlflow_ngraph.measure.verdict import winners
from mlflow_ngraph.plan.cells import compiler_label, differing_flags
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

ANSWER_SECTION = "ngraph-answer"
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
def _column(kind: str, key: str) -> str:
    """A runs-table column as MLflow names it: ``metrics.`throughput.bs8```."""
    return f"{kind}.`{key}`"


def columns(batch_sizes: Sequence[int], sort_key: str | None = None) -> list[str]:
    """The runs table's columns, in this order: model and compiler, the answer at the
    sorted batch size (the sort key and its partner, throughput or speedup), the verdicts
    (stability, output check), the device, then throughput and speedup at every other batch
    size. The first ones fit beside the run's name on a laptop's screen."""
    pairs = [
        [_column("metrics", S.flat_key(name, b)) for name in (S.M_THROUGHPUT, S.M_SPEEDUP)]
        for b in batch_sizes
    ]
    chosen = _column("metrics", sort_key) if sort_key else None
    first = next((p for p in pairs if chosen in p), [])
    first = sorted(first, key=lambda column: column != chosen)
    out = [_column("params", S.P_MODEL), _column("params", S.P_COMPILER), *first]
    out += [_column("tags", S.T_STABILITY), _column("tags", S.T_STATUS)]
    out.append(_column("params", S.P_DEVICE))
    return out + [c for p in pairs for c in p if c not in first]


#: the runs table's column widths (px): the model's label and the run's name are long
WIDTHS = {"params.`model`": 120, "params.`compiler`": 110, "params.`device`": 70}
NAME_COLUMN = "attributes.`Run Name`"
NAME_WIDTH, METRIC_WIDTH, TAG_WIDTH = 250, 105, 105


def widths(selected: Sequence[str]) -> dict[str, int]:
    """The width of each selected column, and of the run's name."""
    out = {NAME_COLUMN: NAME_WIDTH}
    for column in selected:
        default = METRIC_WIDTH if column.startswith("metrics.") else TAG_WIDTH
        out[column] = WIDTHS.get(column, default)
    return out


def sort_metric(batch_sizes: Sequence[int], rows: Iterable[Any]) -> str:
    """The metric the table sorts on, highest first: the speedup at the largest batch size
    (comparable across models), the throughput where no speedup was measured."""
    largest = max(batch_sizes)
    has_speedup = any(
        getattr(r, "speedup", None) is not None and r.batch_size == largest for r in rows
    )
    return S.flat_key(S.M_SPEEDUP if has_speedup else S.M_THROUGHPUT, largest)


def _card(uuid: str, kind: str, metric: str, title: str, **more: Any) -> dict[str, Any]:
    """A chart of the answer's section, as MLflow's chart cards serialize."""
    return {
        "uuid": uuid,
        "type": kind,
        "metricSectionId": ANSWER_SECTION,
        "deleted": False,
        "isGenerated": False,
        "displayName": title,
        "metricKey": metric,
        **more,
    }


def _line(uuid: str, metric: str, title: str) -> dict[str, Any]:
    """A line chart of a stepped metric over its step (the batch size), one line per run."""
    return _card(
        uuid,
        "LINE",
        metric,
        title,
        runsCountToCompare=10,
        selectedMetricKeys=[metric],
        lineSmoothness=0,
        xAxisScaleType="linear",
        scaleType="linear",
        range={},
        xAxisKey="step",
        selectedXAxisMetricKey="",
        yAxisKey="metric",
        yAxisExpressions=[],
        displayPoints=True,
        ignoreOutliers=False,
        useGlobalXaxisKey=False,
        useGlobalLineSmoothing=False,
    )


def _bar(uuid: str, metric: str, title: str) -> dict[str, Any]:
    """A bar per run of one value (a flat key): runs side by side, not a single dot."""
    return _card(uuid, "BAR", metric, title, runsCountToCompare=50)


def answer_charts(batch_sizes: Sequence[int], sort_key: str) -> list[dict[str, Any]]:
    """The chart set that answers first."""
    largest = max(batch_sizes)
    charts = [
        _line("ngraph-throughput", S.M_THROUGHPUT, "throughput [samples/s] over batch size"),
        _line("ngraph-speedup", S.M_SPEEDUP, "speedup over identity over batch size"),
        _bar("ngraph-best", sort_key, f"{sort_key}: every run, winner first"),
    ]
    if sort_key != S.flat_key(S.M_THROUGHPUT, largest):
        title = f"throughput at batch size {largest} [samples/s]"
        charts.append(_bar("ngraph-best-throughput", S.flat_key(S.M_THROUGHPUT, largest), title))
    return charts


def hidden_charts(metric_keys: Iterable[str], shown: Iterable[str]) -> list[dict[str, Any]]:
    """A deleted card for every flat key not shown: MLflow adds a chart for every metric
    its chart set lacks, and a flat key (one value) would draw as a single dot."""
    keep = set(shown)
    return [
        {
            "uuid": f"ngraph-hidden-{i}",
            "type": "LINE",
            "metricSectionId": MORE_SECTION,
            "deleted": True,
            "isGenerated": True,
            "metricKey": key,
        }
        for i, key in enumerate(sorted(k for k in set(metric_keys) if S.parse_flat_key(k)))
        if key not in keep
    ]


def sections() -> list[dict[str, Any]]:
    """The answer open; MLflow's own section (the other stepped metrics) collapsed."""
    return [
        {
            "uuid": ANSWER_SECTION,
            "name": "Answer: throughput and speedup over batch size",
            "display": True,
            "isReordered": False,
            "deleted": False,
            "isGenerated": False,
        },
        {
            "uuid": MORE_SECTION,
            "name": MLFLOW_METRICS_SECTION,
            "display": False,
            "isReordered": False,
            "deleted": False,
            "isGenerated": False,
        },
    ]


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
    charts = answer_charts(batch_sizes, sort_key)
    shown = [c["metricKey"] for c in charts]
    device_literal = device.replace("'", "\\'")
    return {
        "searchFilter": f"params.{S.P_DEVICE} = '{device_literal}' and tags.`{S.T_ROLE}` = 'cell'",
        "orderByKey": _column("metrics", sort_key),
        "orderByAsc": False,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "datasetsFilter": [],
        "modelVersionFilter": "All Runs",
        "selectedColumns": columns(batch_sizes, sort_key),
        # MLflow groups columns by kind (metrics, params, tags): this order puts who first
        "columnOrder": columns(batch_sizes, sort_key),
        "columnWidths": widths(columns(batch_sizes, sort_key)),
        # dropped by MLflow 3.17's loader (the metric sort shows the runs flat anyway);
        # kept for the versions that read it
        "runsExpanded": {parent_id: True} if parent_id else {},
        "runsHiddenMode": "SHOW_ALL",
        "compareRunCharts": charts + hidden_charts(metric_keys, shown),
        "compareRunSections": sections(),
        "isAccordionReordered": False,
        "hideEmptyCharts": True,
        "useGroupedValuesInCharts": True,
        "groupBy": None,
        "globalLineChartConfig": {
            "xAxisKey": "step",
            "lineSmoothness": 0,
            "selectedXAxisMetricKey": "",
        },
    }


def encode_view(name: str, state: dict[str, Any], now_ms: int | None = None) -> str:
    """The tag value MLflow's loader reads: a saved-view envelope (listed by name among the
    experiment's saved views), its state deflated when the plain JSON would not fit, and
    without the hidden cards when even that would not."""
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
    return value


# --- the description ---------------------------------------------------------------------
def _fmt(value: float | None, digits: int, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


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
    """The summary's winners of ``rows`` (each row labelled as the summary labels it)."""
    settings = [(r.compiler, getattr(r, "flags", {}) or {}) for r in rows]
    for r, label in zip(rows, labels(settings), strict=True):
        r.label = getattr(r, "label", None) or label
    return winners(rows)


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
CELL_COLUMNS = ("batch", "samples/s", "95% CI", "re-run CI", "speedup", "status", "stable")


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
    lines = [
        "| " + " | ".join(WINNER_COLUMNS) + " |",
        "|---|---:|---|---:|---:|---|---:|---|---|",
    ]
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
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
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
) -> str:
    """The markdown section of one view: the verdict per model, where the view opens, the
    winners table (each winner linked to its run, ``links``), what UNSTABLE means; rows are
    cut to fit ``limit`` characters."""
    best = ranked(rows)
    head = [
        section_title(device, key),
        "",
        *(verdicts(best) or ["No valid compiled result yet."]),
        "",
        f"[Open the answer]({view_address('', experiment_id, key)}) · "
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
    lines = [
        "| " + " | ".join(CELL_COLUMNS) + " |",
        "|---:|---:|---|---|---:|---|---|",
    ]
    for r in sorted(rows, key=lambda r: r.batch_size):
        low, high = getattr(r, "ci_low", None), getattr(r, "ci_high", None)
        ci = "-" if low is None or high is None else f"{low:.1f}-{high:.1f}"
        low, high = getattr(r, "rerun_low", None), getattr(r, "rerun_high", None)
        rerun = "-" if low is None or high is None else f"{low:.1f}-{high:.1f}"
        stable = {True: "yes", False: "**UNSTABLE**", None: "-"}[getattr(r, "stable", None)]
        cells = [
            r.batch_size,
            _fmt(r.throughput, 1),
            ci,
            rerun,
            _fmt(r.speedup, 2, "x"),
            r.status,
            stable,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    won = [str(w["batch_size"]) for w in best]
    verdict = f"Fastest for its model at batch {', '.join(won)}. " if won else ""
    head = f"{verdict}[All cells, winner first]({view})"
    return "\n".join([head, "", *lines, "", legend_markdown(CELL_COLUMNS)])[:MAX_RUN_TAG]


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


def publish(
    client,
    experiment_id: str,
    parent_id: str,
    spec,
    device: str,
    rows: Sequence[Any],
    cells: dict[str, tuple[str, str, dict[str, Any]]],
) -> str:
    """Write the view, the descriptions and the run colors; returns the view's key.

    Args:
        cells: (model label, compiler, flags) of each cell run id of this invocation.
    """
    from mlflow_ngraph.tracking.mlflow_log import log_batch

    key = view_key(device, spec.spec_hash)
    view = view_address("", experiment_id, key)
    names = labels((compiler, flags) for _, compiler, flags in cells.values())
    best = ranked(rows)
    links: dict[tuple[str, str], str] = {}
    metric_keys: set[str] = set()
    for (run_id, (model, compiler, flags)), label in zip(cells.items(), names, strict=True):
        links[(model, label)] = run_address(experiment_id, run_id)
        metric_keys.update(client.get_run(run_id).data.metrics)
        own = [r for r in rows if (r.model, r.compiler, r.flags) == (model, compiler, flags)]
        won = [w for w in best if (w["model"], w["label"]) == (model, label)]
        note = cell_note(own, won, view)
        log_batch(client, run_id, tags={RUN_COLOR_TAG: run_color(compiler), NOTE_TAG: note})
    state = view_state(device, spec.batch_sizes, rows, metric_keys, parent_id)
    name = f"mlflow-ngraph: {device}, {', '.join(m.label for m in spec.models)[:80]}"
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, encode_view(name, state))
    experiment = client.get_experiment(experiment_id)
    half = MAX_EXPERIMENT_TAG // 2
    section = description(device, spec, rows, key, experiment_id, half, links)
    merged = merge_sections(
        (experiment.tags or {}).get(NOTE_TAG, ""), key, section, MAX_EXPERIMENT_TAG
    )
    client.set_experiment_tag(experiment_id, NOTE_TAG, merged)
    parent_note = description(device, spec, rows, key, experiment_id, MAX_RUN_TAG, links)
    log_batch(client, parent_id, tags={NOTE_TAG: parent_note})
    return key
