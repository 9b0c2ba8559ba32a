"""Which engine to deploy: the best valid cell of a device and model, and why.

Cells are read as ``compare`` reads them (the benchmarks' results indexes, a live search
where an index is missing or stale), latest run per cell. Every (cell, batch size) is a
candidate; the ones that cannot be deployed are set aside with the reason, the rest ranked
by the metric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure.verdict import NO_RERUN, RERUN, SITTING, noise_text
from mlflow_ngraph.tracking import schema as S

#: why an UNSTABLE candidate is set aside (``--allow-unstable`` keeps it)
UNSTABLE_REASON = "UNSTABLE: its figure is noise on this host (--allow-unstable to include it)"

#: metric -> True when higher is better
METRICS = {S.M_THROUGHPUT: True, S.M_LATENCY_P50: False, S.M_LATENCY_P99: False}


@dataclass
class Candidate:
    run_id: str
    experiment_id: str
    device: str
    model: str  # the model's label (name and init params)
    compiler: str
    flags: str
    batch_size: int
    metrics: dict[str, float] = field(default_factory=dict)
    status: str = ""
    reason: str = ""  # why it cannot be deployed (empty: it can)
    stability: str = ""  # STABLE, UNSTABLE, or "" (not judged: an older record)
    signer: str = ""  # the trusted producer whose signed record it is ("" : not verified)
    signed: Any = None  # that record (``tracking.provenance.Signed``)
    unsigned: str = ""  # why it is not verified, where unsigned engines are allowed
    trust_problem: str = ""  # why it is not trusted (set aside)
    server: Any = None  # the Server result it held (``deploy.bound.Bound``), where looked up
    bound_problem: str = ""  # why it does not meet --min-qps / --latency-bound (set aside)

    def value(self, metric: str) -> float:
        return self.metrics.get(metric, math.nan)

    @property
    def label(self) -> str:
        """``resnet18 openvino[PERFORMANCE_HINT=LATENCY] bs8``: the flags set away from the
        compiler's defaults only (all of them are in the run's params)."""
        flags = _non_default(self.compiler, self.flags)
        batch = f"bs{self.batch_size}" if self.batch_size else "(no batch size measured)"
        mark = " (UNSIGNED)" if self.unsigned else ""
        return f"{self.model} {self.compiler}{f'[{flags}]' if flags else ''} {batch}{mark}"


def _writes_engine(compiler: str, flags: str) -> bool:
    from mlflow_ngraph.compilers.registry import get_compiler

    try:
        spec = get_compiler(compiler)
        given = dict(item.partition("=")[::2] for item in flags.split(",") if item)
        given = {k: v for k, v in given.items() if k in spec.flags and v not in ("None", "default")}
        return spec.writes_engine(spec.resolve_flags(given))
    except NgraphError:
        return True  # a compiler this installation does not know: let the pull decide


def _non_default(compiler: str, flags: str) -> str:
    from mlflow_ngraph.compilers.registry import get_compiler

    try:
        defaults = get_compiler(compiler).resolve_flags({})
    except NgraphError:
        return flags
    items = [item.partition("=") for item in flags.split(",") if item]
    return ",".join(
        f"{k}={v}"
        for k, _, v in items
        if str(defaults.get(k)) != v and v not in ("None", "", "default")
    )


@dataclass
class Selection:
    metric: str
    ranked: list[Candidate]  # deployable, best first
    excluded: list[Candidate]  # with their reasons


def model_label(text: str) -> str:
    """``conv_block:width=64,depth=3`` -> ``conv_block:depth=3,width=64`` (params sorted, as
    runs record them); a bare name stays as it is."""
    name, _, params = text.partition(":")
    if not params:
        return name
    return f"{name}:{','.join(sorted(p.strip() for p in params.split(',') if p.strip()))}"


def candidates(
    client,
    tracking_uri: str,
    experiment: str,
    device: str,
    model: str,
    compiler: str | None = None,
    batch_size: int | None = None,
    run_id: str | None = None,
    live: bool = False,
    exclude: frozenset[str] = frozenset(),
) -> list[Candidate]:
    """Every (cell, batch size) of ``experiment`` matching the filters; the runs of
    ``exclude`` (refused by :func:`confirm`) are left out before the latest run of each cell
    is taken, so that a refused record cannot hide the genuine run of its cell.

    Raises:
        NgraphError: no such experiment, or nothing matching (naming the filter).
    """
    from mlflow_ngraph.report.query import RunQuery, fetch_cells
    from mlflow_ngraph.report.tables import prepare

    query = RunQuery(
        experiments=(experiment,),
        devices=(device,),
        models=(model.partition(":")[0],),
        compilers=(compiler,) if compiler else (),
    )
    cells = fetch_cells(client, query, tracking_uri, None, live=live)
    if exclude:
        cells = cells[~cells["run_id"].isin(exclude)]
        if cells.empty:
            raise NgraphError(f"every run of {model!r} on {device!r} was refused (see above)")
    frame, _ = prepare(cells)
    frame = _narrowed(frame, device, model, run_id, batch_size)
    return [_candidate(row) for row in frame.to_dict("records")]


def _narrowed(frame, device: str, model: str, run_id: str | None, batch_size: int | None):
    """The rows of the model's exact params, the run and the batch size asked for.

    Raises:
        NgraphError: nothing left after one of them (naming it)."""
    if ":" in model:
        frame = frame[frame["model_label"] == model_label(model)]
        if frame.empty:
            raise NgraphError(f"no cell of model {model_label(model)!r} on device {device!r}")
    if run_id:
        frame = frame[frame["run_id"] == run_id]
        if frame.empty:
            raise NgraphError(f"run {run_id} is not a cell of {model!r} on device {device!r}")
    if batch_size is not None:
        sizes = sorted({int(b) for b in frame["batch_size"].dropna()})
        frame = frame[frame["batch_size"] == batch_size]
        if frame.empty:
            raise NgraphError(
                f"no cell measured at batch size {batch_size} (measured: "
                f"{', '.join(map(str, sizes)) or 'none'})"
            )
    return frame


#: the figures a candidate carries (its ranking metric among them)
KEPT_METRICS = frozenset(
    (
        *METRICS,
        S.M_THROUGHPUT,
        S.M_CV,
        S.M_VALID,
        S.M_LATENCY_P99,
        S.M_LATENCY_P50,
        S.M_THROUGHPUT_CI_LOW,
        S.M_THROUGHPUT_CI_HIGH,
        S.M_THROUGHPUT_RERUN_LOW,
        S.M_THROUGHPUT_RERUN_HIGH,
    )
)


def _candidate(row: dict) -> Candidate:
    """One (cell, batch size) row of compare's frame as a candidate. A cell that failed
    before measuring any batch size has no per-batch row: it is listed (batch size 0) so
    that the reason it was set aside is shown."""
    import pandas as pd

    batch = row.get("batch_size")
    batch = 0 if batch is None or pd.isna(batch) else int(batch)
    metrics = {k: float(row[k]) for k in KEPT_METRICS if k in row and not pd.isna(row[k])}
    return Candidate(
        run_id=row["run_id"],
        experiment_id=str(row.get("experiment_id", "")),
        device=str(row["device"]),
        model=str(row["model_label"]),
        compiler=str(row["compiler"]),
        flags=str(row.get("flags") or ""),
        batch_size=batch,
        metrics=metrics,
        status=str(row.get("status") or ""),
        reason=str(row.get("error") or ""),
        stability=str(row.get("stability") or ""),
    )


def rank(
    found: list[Candidate],
    metric: str = S.M_THROUGHPUT,
    max_latency_ms: float | None = None,
    allow_unstable: bool = False,
) -> Selection:
    """Set aside what cannot be deployed (with the reason) and rank the rest by ``metric``.

    Raises:
        NgraphError: an unknown metric.
    """
    if metric not in METRICS:
        raise NgraphError(f"unknown metric {metric!r}: use one of {', '.join(METRICS)}")
    ranked, excluded = [], []
    for c in found:
        error, c.reason = c.reason, ""
        if not _writes_engine(c.compiler, c.flags):
            c.reason = (
                "identity is PyTorch eager: no compiled engine to deploy"
                if c.compiler == "identity"
                else f"{c.compiler} with these flags compiles in-process only: no engine files"
            )
        elif c.trust_problem:
            c.reason = c.trust_problem
        elif math.isnan(c.value(S.M_THROUGHPUT)):
            c.reason = "FAILED" + (f": {error[:120]}" if error else "")
        elif c.value(S.M_VALID) != 1.0:
            c.reason = "INVALID: its outputs did not match the reference"
        elif math.isnan(c.value(metric)):
            c.reason = f"no {metric} logged"
        elif c.stability == S.STABILITY_UNSTABLE and not allow_unstable:
            c.reason = UNSTABLE_REASON
        elif c.bound_problem:
            c.reason = c.bound_problem
        elif max_latency_ms is not None:
            latency = c.value(S.M_LATENCY_P99)
            which = "p99"
            if math.isnan(latency):
                latency, which = c.value(S.M_LATENCY_P50), "p50"
            if math.isnan(latency) or latency > max_latency_ms:
                c.reason = f"{which} latency {latency:.2f} ms over the cap of {max_latency_ms:g} ms"
        (excluded if c.reason else ranked).append(c)
    ranked.sort(key=lambda c: c.value(metric), reverse=METRICS[metric])
    return Selection(metric, ranked, excluded)


def describe(selection: Selection, top: int = 5) -> str:
    """The top candidates and the reasons the others were set aside, as printed (every value
    from the store shown :func:`~mlflow_ngraph.text.visible`)."""
    from mlflow_ngraph.table import format_table
    from mlflow_ngraph.text import visible

    metric = selection.metric
    lines = [f"candidates by {metric} (best first):"]
    rows = [
        [
            i + 1,
            c.label,
            f"{c.value(metric):.4g}",
            _interval(c),
            _interval(c, S.M_THROUGHPUT_RERUN_LOW, S.M_THROUGHPUT_RERUN_HIGH),
            c.status or "OK",
            c.stability or "-",
            c.signer or ("UNSIGNED" if c.unsigned else "-"),
        ]
        for i, c in enumerate(selection.ranked[:top])
    ]
    headers = ["#", "cell", metric, "95% CI", "re-run CI", "status", "stable", "signed by"]
    lines.append(format_table(headers, rows) if rows else "  none")
    if rows and all(r[4] == "-" for r in rows):
        lines.append(f"re-run CI: {NO_RERUN}")
    said = lead(selection)
    if said:
        lines.append(visible(said))
    unstable = sum(c.reason == UNSTABLE_REASON for c in selection.excluded)
    if unstable:
        lines.append(
            f"{unstable} UNSTABLE candidate(s) set aside: their figures are noise on the host "
            "that measured them (--allow-unstable to include them)"
        )
    if selection.excluded:
        lines.append(f"set aside ({len(selection.excluded)}):")
        for c in selection.excluded[:12]:
            lines.append(f"  {visible(c.label)}: {visible(c.reason)}")
        if len(selection.excluded) > 12:
            lines.append(f"  ... and {len(selection.excluded) - 12} more")
    return "\n".join(lines)


def lead(selection: Selection) -> str | None:
    """One line: the first candidate's lead over the second, judged as the winners are
    (:func:`mlflow_ngraph.measure.verdict.noise_text`): on the throughputs' re-run intervals
    where both have one (a lead a re-run keeps), else on their 95% intervals of the runs
    that measured them; not judged where either is UNSTABLE. ``None`` with fewer than two
    candidates."""
    if len(selection.ranked) < 2:
        return None
    first, second = selection.ranked[:2]
    metric = selection.metric
    a, b = first.value(metric), second.value(metric)
    ratio = a / b if METRICS[metric] else b / a
    head = f"#1 leads #2 ({second.label}) by {ratio:.2f}x in {metric}"
    if metric != S.M_THROUGHPUT:
        return f"{head}: not judged (no interval of {metric} is kept with the results)"
    beyond, on = None, None
    for low, high, which in (
        (S.M_THROUGHPUT_RERUN_LOW, S.M_THROUGHPUT_RERUN_HIGH, RERUN),
        (S.M_THROUGHPUT_CI_LOW, S.M_THROUGHPUT_CI_HIGH, SITTING),
    ):
        ends = (first.value(low), first.value(high), second.value(low), second.value(high))
        if not any(math.isnan(v) for v in ends):
            beyond, on = ends[0] > ends[3], which
            break
    unstable = [
        role
        for role, c in (("own", first), ("next", second))
        if c.stability == S.STABILITY_UNSTABLE
    ]
    words = noise_text(beyond, unstable, on)
    if beyond is None and not unstable:
        words = "noise unknown (no interval of the throughput is kept with the results)"
    if beyond is False and not unstable:
        words += ": a re-run may rank #2 first"
    return f"{head}: {words}"


def _interval(c: Candidate, low_name=S.M_THROUGHPUT_CI_LOW, high_name=S.M_THROUGHPUT_CI_HIGH):
    """The throughput's interval as shown: this run's, or (``*_rerun_*``) where a re-run on
    the host that measured it is expected to land; ``-`` where not logged."""
    low, high = c.value(low_name), c.value(high_name)
    return "-" if math.isnan(low) or math.isnan(high) else f"{low:.4g}-{high:.4g}"


def best(selection: Selection, what: str) -> list[Candidate]:
    """The deployable candidates, best first.

    Raises:
        NgraphError: none is left, saying what set each kind aside.
    """
    if selection.ranked:
        return selection.ranked
    reasons = sorted({c.reason.split(":")[0] for c in selection.excluded})
    raise NgraphError(
        f"no deployable engine for {what}: every cell was set aside ({'; '.join(reasons)})"
    )


def _record_problem(c: Candidate, run, experiment_ids: set[str]) -> str:
    """Why the run does not back the index's record of ``c`` ("" when it does)."""
    if run.info.lifecycle_stage != "active":
        return "the run is deleted"
    if experiment_ids and str(run.info.experiment_id) not in experiment_ids:
        return f"the run belongs to experiment {run.info.experiment_id}, not this one"
    if not run.data.metrics:
        return "the run holds no metrics at all"
    if run.data.tags.get(S.T_ROLE) != "cell":
        return "it is not a cell run of a benchmark"
    params = run.data.params
    for key, value in (
        (S.P_COMPILER, c.compiler),
        (S.P_DEVICE, c.device),
        (S.P_MODEL, c.model.partition(":")[0]),
    ):
        if params.get(key) != value:
            return f"the index says {key} {value!r}, the run recorded {params.get(key)!r}"
    if c.signer:  # its figures are the signed ones; the run's may have been rewritten
        return ""
    for name, value in sorted(c.metrics.items()):
        key = S.flat_key(name, c.batch_size)
        held = run.data.metrics.get(key)
        if held is None:
            return f"the index says {key} = {value:.6g}, the run holds none"
        if not math.isclose(held, value, rel_tol=1e-9, abs_tol=1e-12):
            return f"the index says {key} = {value:.6g}, the run holds {held:.6g}"
    if not c.metrics:
        return "the index gives no metrics for it"
    return ""


def confirm(
    client, ranked: list[Candidate], experiment_ids: set[str], say, refused: set[str]
) -> tuple:
    """The first of ``ranked`` (best first) whose own run backs its results-index record:
    same experiment, a cell run, its params (compiler, device, model) and its metrics at the
    batch size (a run without metrics is never chosen). Each one that does not is refused in
    one line through ``say`` and its run id added to ``refused``. Returns (candidate, its
    MLflow run), or (None, None) when none is backed by its run.
    """
    from mlflow.exceptions import MlflowException

    for c in ranked:
        try:
            run = client.get_run(c.run_id)
        except MlflowException:
            say(f"refused {c.label} (run {c.run_id}): the run does not exist in this store")
            refused.add(c.run_id)
            continue
        problem = _record_problem(c, run, experiment_ids)
        if problem:
            say(
                f"refused {c.label} (run {c.run_id}, logged by {creator(run)}): {problem}: "
                "the results index does not match the run (altered, or stale)"
            )
            refused.add(c.run_id)
            continue
        return c, run
    return None, None


def creator(run) -> str:
    """Who created a run: MLflow's ``user_id`` of it, set when the run was created (never
    its ``mlflow.user`` tag, which any writer of the experiment can set afterwards). What
    the creating client said, not a proof."""
    user = run.info.user_id
    return user if user and user != "unknown" else "an unknown user"
