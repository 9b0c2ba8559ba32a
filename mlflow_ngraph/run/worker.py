"""The measurement step of one cell: build the model, compute the reference outputs, get
each batch size's engine, check its outputs, run it once, measure it.

It returns plain-dict records (one per batch size) through ``emit`` and writes nothing to
MLflow or the journal; metric names come from :mod:`mlflow_ngraph.tracking.schema`. The
runner calls :func:`measure_cell` in its own process (``--isolation none``) or in a spawned
worker process (:mod:`mlflow_ngraph.run.isolation`).

Events passed to ``emit(kind, payload)``:

- ``("model", info)``: the model was built; ``info`` holds what the cell's params need.
- ``("phase", (batch_size, phase))``: ``build``, ``reference``, ``engine``, ``check``,
  ``measure``.
- ``("record", (batch_size, record))``: a batch size measured (status OK or INVALID).
- ``("failed", (batch_size, reason))``: a batch size failed; the rest go on.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mlflow_ngraph.console import DETAIL
from mlflow_ngraph.errors import CompileFailed
from mlflow_ngraph.measure.rounds import WINDOW_S
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.plan.config import RunPolicy
from mlflow_ngraph.redaction import redact_text
from mlflow_ngraph.tracking import schema as S

log = logging.getLogger(__name__)

#: seed of the output-check input, distinct from the measured input (seed 0) so the check
#: runs on a fresh random batch the engine has not seen.
CHECK_SEED = 1234

#: every per-batch metric the schema names: a field of the harness's measurement whose key
#: is one of these is logged, so a new measured quantity needs no runner change
SCHEMA_METRICS = S.METRICS

Emit = Callable[[str, Any], None]
Measurer = Callable[..., tuple[Any, Any, int]]


@dataclass
class CellTask:
    """Everything a worker needs to measure one cell: plain, picklable data."""

    name: str
    model_name: str
    model_params: dict[str, Any]
    compiler: str
    flags: dict[str, Any]
    batch_sizes: list[int]  # the pending ones
    device: str
    device_kind: str
    home: str
    measure: MeasureSettings
    tolerance: float
    log_file: str | None = None  # process isolation: the worker's stdout/stderr go here
    atol: float | None = None  # None: tolerance x the output's largest reference magnitude
    rtol: float = 0.0
    #: how the run judges this measurement and how far it goes to make it hold; in one of
    #: several sittings, that sitting's (RunPolicy.per_sitting)
    run: RunPolicy = field(default_factory=RunPolicy)
    window_s: float = WINDOW_S
    #: the arithmetic every compiler runs (compilers/precision.py)
    math: str = "fp32"
    extra: dict[str, Any] = field(default_factory=dict)

    def policy(self):
        """The rounds' policy: the run's target and limit, the default cap on an engine's
        seconds shared among the sittings."""
        from mlflow_ngraph.measure.rounds import MAX_S, RoundPolicy

        m, run = self.measure, self.run
        max_s = None
        if run.sittings > 1 and m.max_duration_s is None:
            max_s = max(MAX_S, 2 * m.min_duration_s) / run.sittings
        return RoundPolicy(
            window_s=self.window_s,
            precision=run.precision,
            max_s=max_s,
            enough=run.max_interval,
            screen=self.device_kind != "cuda",
        )


def measure_cell(
    task: CellTask,
    emit: Emit,
    measurer: Measurer | None = None,
    gate: Callable[[int], bool] | None = None,
) -> None:
    """Measure every pending batch size of ``task``; failures become ``failed`` events.

    ``measurer(task, engine, b)`` measures a prepared engine and returns (measurement,
    stability, attempts): :func:`measure_alone` by default; a worker of an interleaved
    group passes one that takes its windows from the group's coordinator
    (:mod:`mlflow_ngraph.run.isolation`). ``gate(b)``, when given, is asked before each batch
    size's work starts (the group's coordinator lets every worker prepare at once, never
    while another measures); ``False`` stops the cell there."""
    measurer = measurer or measure_alone
    from mlflow_ngraph.measure.memory import keep_freed_memory
    from mlflow_ngraph.run.supply import EngineSupply

    keep_freed_memory()  # a spawned worker did at its start; ``--isolation none`` does here

    pending = list(task.batch_sizes)
    built = _build(task, pending, emit)
    if built is None:
        return
    model, compiler = built
    supply = EngineSupply(
        task.home, task.device, task.device_kind, task.measure.scenario, task.math
    )
    engine = None
    for b in pending:
        if engine is not None and not compiler.batch_agnostic:
            engine.close()
            engine = None
        if gate is not None and not gate(b):
            break
        try:
            engine, record = _measure_batch(
                task, supply, compiler, model, b, engine, emit, measurer
            )
        except Exception as exc:  # one failing batch size never stops the others
            _failed(task, b, exc, engine, emit)
            engine = None
            continue
        emit("record", (b, record))
    if engine is not None:
        engine.close()


def _failed(task: CellTask, b: int, exc: Exception, engine, emit: Emit) -> None:
    """Batch size ``b`` failed with ``exc``: said, its engine (if any) closed, and a
    ``failed`` event sent."""
    reason = one_line(exc)
    log.log(DETAIL, "%s bs%d FAILED: %s", task.name, b, reason)  # the cell's line says it
    if engine is not None:
        engine.close()
    emit("failed", (b, reason))


def _build(task: CellTask, pending: list[int], emit: Emit):
    """The cell's model (built, or kept from the cell before) and compiler, the model said
    in a ``model`` event; ``None`` when either cannot be had: every batch size failed."""
    from mlflow_ngraph.compilers.registry import get_compiler

    try:
        emit("phase", (pending[0], "build"))
        model = load_cell_model(task.model_name, task.model_params)
        emit("model", model_info(model))
        return model, get_compiler(task.compiler)
    except Exception as exc:  # the model or compiler cannot be had: every batch fails
        reason = one_line(exc)
        for b in pending:
            emit("failed", (b, reason))
        return None


def _engine(task: CellTask, supply, compiler, model, b: int, engine):
    """The engine of batch size ``b`` as (engine, compile seconds, cache hit, engine
    directory): from the supply, or ``engine`` when it serves every batch size."""
    if engine is None:
        got = supply.get(compiler, task.flags, model, b, task.name)
        return got.engine, got.compile_s, got.cache_hit, got.engine_dir
    # a batch-agnostic engine (eager) serves this batch too: its own manifest
    return engine, 0.0, False, supply.save(compiler, task.flags, model, engine, b, 0.0)


def _measure_batch(task, supply, compiler, model, b: int, engine, emit: Emit, measurer):
    """Batch size ``b`` of the cell: its reference outputs, its engine, the output check, a
    first inference and the measurement. Returns (the engine, the batch size's record)."""
    emit("phase", (b, "reference"))
    x_ref, y_ref, reference = reference_outputs(model, supply, b)
    emit("phase", (b, "engine"))
    engine, compile_s, cache_hit, engine_dir = _engine(task, supply, compiler, model, b, engine)
    emit("phase", (b, "check"))
    check = compare_outputs(engine.outputs(x_ref), y_ref, task.tolerance, task.atol, task.rtol)
    engine.prepare(model.random_input(b))
    t0 = time.perf_counter()
    engine.infer()
    first_ms = 1000 * (time.perf_counter() - t0)
    emit("phase", (b, "measure"))
    task.extra.setdefault("family", model.family)
    result, stability, attempts = measurer(task, engine, b)
    remembered = _remember(task, result, stability, result.speedup_paired is not None)
    record = {
        "metrics": {
            **measurement_metrics(result),
            S.M_COMPILE: compile_s,
            S.M_CACHE_HIT: float(cache_hit),
            S.M_FIRST_INFERENCE: first_ms,
            **check.metrics(),
            S.M_PARALLEL_REQUESTS: float(engine.parallel_requests),
            **_named(engine.compile_metrics()),
        },
        "status": S.STATUS_OK if check.valid else S.STATUS_INVALID,
        "note": check.reason,
        "stop_reason": result.stop_reason,
        "reference": reference,
        "runtime": {k: str(v) for k, v in engine.runtime_settings().items()},
        "engine_dir": str(engine_dir) if engine_dir else None,
        "stability": _stability_record(stability, attempts),
        **remembered,
    }
    if getattr(result, "times_ms", None):  # the paper protocol keeps every t_i
        record["times_ms"] = result.times_ms
    if engine_dir is not None:
        from mlflow_ngraph.tracking.engines import engine_bytes, read_manifest

        manifest = read_manifest(engine_dir) or {}
        record["metrics"][S.M_ENGINE_SIZE] = engine_bytes(manifest) / 2**20
    return engine, record


def _stability_record(stability, attempts: int) -> dict[str, Any]:
    """What a record keeps of its judgement: with a gross move against this host's history
    (what it said, now over then), which the unpaired speedups divided by this figure carry
    (:meth:`CellWork.baseline_moved`)."""
    return {
        "stable": stability.stable,
        "reason": stability.reason,
        "attempts": attempts,
        "own_only": getattr(stability, "own_only", False),
        "history": getattr(stability, "history", None),
        "history_ratio": getattr(stability, "history_ratio", None),
    }


#: seconds to wait before measuring an unstable batch size again (a burst of other work
#: may pass)
RETRY_PAUSE_S = 2.0


def judge(task: CellTask, result, baseline_paired: bool, baseline_moved=None):
    """The stability of a measurement, on the figure the user compares: its speedup when it
    was paired with the baseline, else its throughput; and against the same engine measured
    earlier on this host (:mod:`mlflow_ngraph.measure.history`): a gross move marks it.

    ``baseline_moved``: (what it said, now over then) of the gross move that marked the
    baseline this figure's speedup is divided by: of the same rounds, or, unpaired, the
    identity measured before it (``--isolation none``, the paper protocol). A speedup
    divided by a baseline out of the state its history knows moves with it (eager PyTorch
    21-30% slower in one run while the compiled engines were not: their speedups rose
    14-28%, STABLE), so it marks the speedup too; not where this engine's own throughput
    moved in step (:func:`_in_step`): the whole host moved, and the pairing (or the ratio
    of two figures that moved alike) cancels that."""
    from mlflow_ngraph.measure.stability import THROUGHPUT_WIDER, assess

    paired = baseline_paired and result.speedup_halfwidth is not None
    move = _moved(task, result, paired)
    said = [move.text] if move is not None and move.gross else []
    # the caller hands a move only to a figure whose speedup is divided by that baseline
    if baseline_moved and not _in_step(task, result, baseline_moved[1]):
        said.append(baseline_moved[0])
    stability = assess(
        result.speedup_halfwidth if paired else result.throughput_halfwidth,
        result.host_other_cpu_percent,
        result.speedup_moved if paired else None,
        task.run.max_interval if paired else THROUGHPUT_WIDER * task.run.max_interval,
        task.run.max_other_cpu,
        what="speedup" if paired else "throughput",
        stretched=getattr(result, "stretched", False),
        disturbed=(getattr(result, "windows_disturbed", 0), getattr(result, "windows", 0)),
        history="; ".join(said) or None,
        screen_moved=_screen_moved(result, paired),
        state=_state_moved(result),
    )
    if move is not None and move.gross:
        stability = replace(stability, history_ratio=move.ratio)
    return stability


def _state_moved(result) -> tuple[float, int, int, str] | None:
    """(change, slow rounds, rounds read, the probe's kind) where the figure parted between
    the host's two states (measure/hostprobe.py), else None."""
    moved = getattr(result, "host_state_moved", None)
    if moved is None:
        return None
    kind = "memory" if getattr(result, "memory_speed_gbs", None) is not None else "join"
    return moved, result.host_slow_rounds or 0, result.host_state_rounds or 0, kind


def remeasure_if_it_settles(task: CellTask, result, paired: bool, stability, earlier):
    """The verdict of an UNSTABLE sitting of several (``--sittings N``), with its retry kept
    only where measuring it again can change what is judged: the sittings' combined verdict
    (:mod:`mlflow_ngraph.measure.sittings`). Not when an earlier sitting was UNSTABLE for
    what the host did (the combined verdict is UNSTABLE whatever this one gives); and for a
    sitting UNSTABLE only for its own interval or its own screen's move, not when the mean
    is STABLE with this sitting as it is, the sittings to come counted at their target, nor
    when even this sitting at its own target would leave the mean UNSTABLE. ``earlier``:
    the earlier sittings and the number to come
    (:class:`~mlflow_ngraph.measure.sittings.Earlier`; ``None``: a single sitting)."""
    from mlflow_ngraph.measure.sittings import Sitting, mean_settles
    from mlflow_ngraph.measure.stability import THROUGHPUT_WIDER

    if earlier is None or stability.stable or not stability.retry:
        return stability
    if earlier.host_unstable:
        said = f"the sittings' combined verdict, UNSTABLE for {earlier.host_unstable}"
        return _not_again(task, result, stability, said)
    if not stability.own_only:
        return stability
    # the figure the sittings' mean is judged on (measure/sittings.py: combine): a speedup
    # without an interval has none in the mean either, which a re-measure may give
    what = "speedup" if paired and result.speedup_paired else "throughput"
    if what not in earlier.figures:
        return stability
    now = Sitting.of({"metrics": _figures_of(result, what)}, what)
    wider = 1.0 if what == "speedup" else THROUGHPUT_WIDER
    limit = wider * task.run.max_interval / math.sqrt(task.run.sittings)
    best = wider * task.run.precision
    if mean_settles(earlier.figures[what], now, earlier.to_come, limit, best, what):
        return stability
    n = len(earlier.figures[what]) + 1 + earlier.to_come
    return _not_again(task, result, stability, f"the verdict on the {n} sittings' mean")


def _not_again(task: CellTask, result, stability, why: str):
    """``stability`` without its retry, the log saying ``why`` measuring this sitting
    again cannot change the combined verdict."""
    log.log(
        DETAIL,
        "%s bs%d: this sitting alone is UNSTABLE (%s), but measuring it again cannot change "
        "%s: not measured again",
        task.name, result.batch_size, stability.reason.removesuffix(": measure on a quiet host"),
        why,
    )  # fmt: skip
    return replace(stability, retry=False)


def _figures_of(result, what: str) -> dict[str, Any]:
    """The metrics of ``result`` a sitting's ``what`` is judged on, by their record names."""
    from mlflow_ngraph.measure.sittings import FIELDS

    name, ends, _, _ = FIELDS[what]
    return {
        key: getattr(result, key, None)
        for key in (name, *ends, f"{what}_unscreened", S.M_WINDOWS, S.M_WINDOWS_DISTURBED)
    }


def baseline_move(label: str, said: str, ratio: float) -> tuple[str, float]:
    """What a figure whose speedup is divided by a baseline that moved grossly carries
    (:func:`judge`'s ``baseline_moved``): the baseline's word, as the reason says it, and
    its move (now over then)."""
    return f"its baseline {label}: {said}", ratio


def _in_step(task: CellTask, result, baseline_ratio: float | None) -> bool:
    """Whether this engine's own throughput moved with its baseline's (``baseline_ratio``,
    now over then) against this host's history: the same way, by at least half as much
    (in log) and beyond what the intervals and the spread allow."""
    if not baseline_ratio or baseline_ratio <= 0:
        return False
    own = _moved(task, result, False)
    if own is None or not own.beyond or own.what != "throughput" or own.ratio <= 0:
        return False
    mine, theirs = math.log(own.ratio), math.log(baseline_ratio)
    return mine * theirs > 0 and abs(mine) >= 0.5 * abs(theirs)


def _screen_moved(result, paired: bool) -> float | None:
    """The relative change the screen made to the figure the user compares (the disturbed
    windows left out) where the figure rests on its judgement
    (:func:`mlflow_ngraph.measure.stability.screen_move`); else None."""
    from mlflow_ngraph.measure.stability import screen_move

    what = "speedup" if paired else "throughput"
    value = getattr(result, "speedup_paired" if paired else "throughput", None)
    unscreened = getattr(result, f"{what}_unscreened", None)
    h = getattr(result, f"{what}_halfwidth", None)
    if not value or not unscreened or h is None:
        return None
    disturbed, windows = getattr(result, "windows_disturbed", 0), getattr(result, "windows", 0)
    return screen_move(math.log(value / unscreened), math.log1p(h), disturbed, windows)


def _history_entry(task: CellTask, result, paired: bool, stability=None):
    from mlflow_ngraph.measure.history import Entry

    def log_h(value, low, high):
        if not value or low is None or high is None or low <= 0:
            return None
        return max(math.log(high / value), math.log(value / low))

    other = result.host_other_cpu_percent
    steal = getattr(result, "host_steal_percent", None)
    contended = (other is not None and other > task.run.max_other_cpu) or (
        steal is not None and steal > STEAL_CONTENDED
    )
    speedup = result.speedup_paired if paired else None
    return Entry(
        time=time.time(),
        family=task.extra.get("family", ""),
        throughput=result.throughput,
        throughput_h=log_h(result.throughput, result.throughput_ci_low, result.throughput_ci_high),
        speedup=speedup,
        speedup_h=log_h(speedup, result.speedup_ci_low, result.speedup_ci_high)
        if speedup
        else None,
        contended=bool(contended),
        stable=stability is None or stability.stable,
        other_cpu=other,
        load=result.host_load_avg,
        occasion=task.extra.get("occasion", ""),
        group=_history_key(task, result.batch_size, group=True),
        memory=getattr(result, "memory_speed_gbs", None),
        join=getattr(result, "host_join_rate", None),
    )


#: hypervisor steal (percent of all cores) beyond which a measurement's host was contended
STEAL_CONTENDED = 10.0


def _history_key(task: CellTask, b: int, group: bool = False) -> str:
    """The name of the engine's history at batch size ``b`` (``group``: of the group of
    engines it is measured with, every compiler's of the model at ``b``)."""
    from mlflow_ngraph.measure.history import engine_key, group_key

    # another arithmetic is another engine (an fp32 key is the one earlier runs wrote): an
    # fp16 engine was once judged against the tf32 one measured a minute before
    device = task.device if task.math == "fp32" else f"{task.device}/{task.math}"
    if task.measure.protocol != "rounds":  # another figure (the mean of b / t_i)
        device = f"{device}/{task.measure.protocol}"
    if group:
        return group_key(task.model_name, task.model_params, task.measure.scenario, device, b)
    return engine_key(
        task.model_name, task.model_params, task.compiler, task.flags, task.measure.scenario,
        device, b,
    )  # fmt: skip


def _moved(task: CellTask, result, paired: bool, key: str | None = None):
    """The move of this measurement against the same engine measured earlier on this host
    (history ``key``, the engine's when not given), if it moved beyond what the intervals
    and the host's spread allow (else None)."""
    from mlflow_ngraph.measure import history

    try:
        key = key or _history_key(task, result.batch_size)
        kind = task.device_kind
        entries = history.earlier(task.home, key, kind)
        if not entries:
            return None
        spread = history.spread(task.home, "speedup" if paired else "throughput", None, kind)
        run = task.run
        sd = spread.of_mean(1).sd if spread else None
        sd = run.rerun_sd if run.rerun_sd is not None else sd
        return history.check(entries, _history_entry(task, result, paired), sd, run.max_other_cpu)
    except Exception as exc:  # noqa: BLE001 - the history is a check, never the measurement
        log.debug("history check skipped: %s", exc)
        return None


def _remember(task: CellTask, result, stability, paired: bool) -> dict[str, Any]:
    """After the kept attempt: the re-run intervals from the host's spread between
    sittings, the move against earlier measurements (said), and this measurement added to
    the host's history. Returns what the record carries of it."""
    from mlflow_ngraph.measure import history

    out: dict[str, Any] = {}
    try:
        family, kind = task.extra.get("family"), task.device_kind
        spreads = {}
        for what in ("throughput", "speedup"):
            spreads[what] = history.given_or_measured(
                task.home, what, family, task.run.rerun_sd, kind
            )
        entry = _history_entry(task, result, paired, stability)
        for what, value, h in (
            ("throughput", entry.throughput, entry.throughput_h),
            ("speedup", entry.speedup, entry.speedup_h),
        ):
            interval = history.rerun_interval(value, h, spreads[what])
            if interval is not None:
                setattr(result, f"{what}_rerun_low", interval[0])
                setattr(result, f"{what}_rerun_high", interval[1])
        chosen = spreads["speedup" if paired else "throughput"]
        if chosen is not None:
            one = chosen.of_mean(1)
            result.rerun_sd, result.rerun_df = one.sd, float(min(one.df, 10**6))
            out["rerun"] = chosen.words()
        else:
            out["rerun"] = (
                "none: this host has no spread between sittings yet (a figure enters it once "
                "the same engine was measured in two runs; or give --rerun-sd)"
            )
        key = _history_key(task, result.batch_size)
        move = _moved(task, result, paired, key)
        if move is not None:
            out["moved"] = move.text
        history.append(task.home, key, entry, kind)
    except Exception as exc:  # noqa: BLE001 - the history is a check, never the measurement
        log.debug("history skipped: %s", exc)
    return out


def measure_alone(task: CellTask, engine, b: int):
    """Measure one engine without interleaving (``--isolation none``): windows back to
    back; while UNSTABLE and attempts are left, pause and measure again. The last attempt
    is kept: choosing the steadiest would select on luck. The paper protocol measures
    exactly once, as the paper did (:mod:`mlflow_ngraph.measure.paper`)."""
    from mlflow_ngraph.measure.harness import measure

    gpu = task.device_kind == "cuda"
    # the baseline's gross move, where this engine's speedup is divided by it
    moved = (task.extra.get("baseline_moved") or {}).get(b)
    if task.measure.protocol == "paper":
        from mlflow_ngraph.measure.paper import measure_paper

        result = measure_paper(engine, b, task.measure, gpu=gpu)
        return result, judge(task, result, False, moved), 1
    attempts = 1
    result = measure(engine, b, task.measure, gpu=gpu, policy=task.policy())
    stability = judge(task, result, False)
    while not stability.stable and stability.retry and attempts <= task.run.stable_retries:
        log.log(
            DETAIL,
            "%s bs%d UNSTABLE (%s): measuring again, attempt %d of %d",
            task.name,
            b,
            stability.reason.split(":")[0],
            attempts + 1,
            task.run.stable_retries + 1,
        )
        time.sleep(RETRY_PAUSE_S)
        result = measure(engine, b, task.measure, gpu=gpu, policy=task.policy())
        attempts += 1
        stability = judge(task, result, False)
    if moved:  # the kept attempt: measuring this engine again cannot settle its baseline
        stability = judge(task, result, False, moved)
    return result, stability, attempts


def measurement_metrics(result) -> dict[str, float]:
    """Every numeric field of the measurement that the schema names, plus GPU samples."""
    out = {}
    for key, value in result.to_dict().items():
        if key in SCHEMA_METRICS and _is_number(value):
            out[key] = float(value)
    out.update({k: float(v) for k, v in (result.gpu or {}).items()})
    out.update({k: float(v) for k, v in (getattr(result, "energy", None) or {}).items()})
    return out


def _named(metrics: dict[str, float]) -> dict[str, float]:
    """An engine's compile metrics, those the schema names (a new one is named there first:
    an unnamed key is dropped with a warning rather than logged under a name no reader
    knows)."""
    out = {}
    for key, value in metrics.items():
        if S.is_schema_metric(key):
            out[key] = value
        else:
            log.warning("compile metric %r is not named in tracking/schema.py: not logged", key)
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


# --- the model and its reference outputs, kept while consecutive cells share them ---------
_MODEL: dict[str, Any] = {}
_REFERENCES: dict[tuple[str, int], tuple[np.ndarray, Any, str]] = {}


def load_cell_model(name: str, params: dict[str, Any]):
    """The model, built once for consecutive cells of the same model in one process (and
    by a spare worker before its cell's task comes)."""
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.plan.config import ModelSpec

    label = ModelSpec(name, params).label
    if _MODEL.get("label") != label:
        _MODEL.clear()
        _REFERENCES.clear()
        log.debug("building %s", label)  # every worker of a model does: once per cell
        _MODEL.update(label=label, model=load_model(name, params))
    return _MODEL["model"]


def reference_outputs(model, supply, b: int):
    """(input, the reference engine's outputs, what the reference is) on a fresh random
    input of batch size ``b``.

    The outputs are deterministic (the model's content, the batch size and the seed fix
    them), so they are kept in the home's ``references`` folder: each cell's worker reads
    them instead of running the reference engine again. An entry that cannot be read, or
    whose input differs from the one drawn now, is ignored and written anew.
    """
    from mlflow_ngraph.compilers.registry import reference_compiler

    key = (model.content_hash, b)
    if key not in _REFERENCES:
        compiler, flags, label = reference_compiler(model)
        seed = CHECK_SEED + b
        x = model.random_input(b, seed=seed)
        path = _reference_path(supply.home, model, b, seed, label, compiler.version())
        outputs = _read_reference(path, x)
        if outputs is None:
            from mlflow_ngraph.compilers.precision import strict_fp32

            # strict FP32 whatever the run's --math: the check measures what it changes
            with strict_fp32():
                engine = compiler.compile(model, flags, supply.context(b, math="fp32"))
                try:
                    outputs = engine.outputs(x)
                finally:
                    engine.close()
            _write_reference(path, x, outputs)
        _REFERENCES[key] = (x, outputs, label)
    return _REFERENCES[key]


def _reference_path(home, model, b: int, seed: int, label: str, version: str):
    import hashlib
    from pathlib import Path

    key = f"{model.content_hash}|{b}|{seed}|{label}|{version}"
    return Path(home) / "references" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"


def _digest(x: np.ndarray) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def _read_reference(path, x: np.ndarray):
    """The outputs stored at ``path`` for input ``x``, or ``None`` (missing, unreadable, or
    stored for another input)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            if str(data["input_sha256"]) != _digest(x):
                log.log(DETAIL, "reference outputs %s stored for another input: ignored", path.name)
                return None
            outputs = [data[f"output_{i}"] for i in range(int(data["count"]))]
            is_list = bool(data["is_list"])
        from mlflow_ngraph.cache import touch

        touch(path)  # its last use: a prune beside this run keeps it
        return tuple(outputs) if is_list else outputs[0]
    except Exception as exc:  # a torn or foreign file: computed again and rewritten
        why = one_line(exc)
        log.log(DETAIL, "reference outputs %s unreadable (%s): computed again", path.name, why)
        return None


def _write_reference(path, x: np.ndarray, outputs) -> None:
    """Store ``outputs`` atomically (a concurrent reader sees the old file or the new one);
    a failure to write only costs the next worker a recomputation."""
    import os
    import tempfile

    arrays, tmp = _as_list(outputs), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".npz")
        with os.fdopen(fd, "wb") as handle:
            np.savez(
                handle,
                input_sha256=np.array(_digest(x)),
                count=np.array(len(arrays)),
                is_list=np.array(isinstance(outputs, (tuple, list))),
                **{f"output_{i}": a for i, a in enumerate(arrays)},
            )
        os.replace(tmp, path)
    except OSError as exc:
        log.debug("reference outputs not cached (%s)", exc)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def model_info(model) -> dict[str, Any]:
    """What the cell's params say about its model."""
    return {
        "name": model.name,
        "family": model.family,
        "parameter_count": model.parameter_count,
        "content_hash": model.content_hash,
        "params": dict(model.params),
        "is_torch": model.is_torch,
    }


# --- the output check ---------------------------------------------------------------------
@dataclass
class OutputCheck:
    """The check of every output; the errors are the worst over outputs."""

    max_abs_error: float
    max_rel_error: float
    cosine: float
    valid: bool
    reason: str = ""
    #: per output: (max abs error, max rel error, cosine), when there are several
    per_output: list[tuple[float, float, float]] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        out = {
            S.M_MAX_ABS_ERROR: self.max_abs_error,
            S.M_MAX_REL_ERROR: self.max_rel_error,
            S.M_COSINE: self.cosine,
            S.M_VALID: float(self.valid),
            S.M_OUTPUTS_CHECKED: float(max(1, len(self.per_output))),
        }
        if len(self.per_output) > 1:
            for i, (abs_err, rel_err, cos) in enumerate(self.per_output):
                out[S.output_key(S.M_MAX_ABS_ERROR, i)] = abs_err
                out[S.output_key(S.M_MAX_REL_ERROR, i)] = rel_err
                out[S.output_key(S.M_COSINE, i)] = cos
        return out


def _as_list(outputs) -> list[np.ndarray]:
    if isinstance(outputs, (tuple, list)):
        return [np.asarray(o) for o in outputs]
    return [np.asarray(outputs)]


def compare_outputs(
    outputs, references, tolerance: float, atol: float | None = None, rtol: float = 0.0
) -> OutputCheck:
    """Check every output of an engine against the reference's, as Polygraphy does:
    elementwise ``|out - ref| <= atol + rtol * |ref|``, and a cosine similarity of at least
    ``1 - tolerance``.

    ``atol`` defaults to ``tolerance`` times the output's largest reference magnitude (with
    ``rtol`` 0 that is the check of ``--tolerance`` alone). ``max_rel_error`` is the largest
    absolute difference over the reference's largest magnitude (element-wise relative error
    explodes on outputs near zero). Outputs may be one array or a tuple/list of them.
    """
    outs, refs = _as_list(outputs), _as_list(references)
    if len(outs) != len(refs):
        return OutputCheck(
            float("inf"),
            float("inf"),
            0.0,
            False,
            f"{len(outs)} output(s) where the reference has {len(refs)}",
        )
    per_output, failures = [], []
    for i, (output, reference) in enumerate(zip(outs, refs)):
        name = f"output {i}" if len(outs) > 1 else "output"
        errors, failure = _check_output(name, output, reference, tolerance, atol, rtol)
        per_output.append(errors)
        if failure is not None:
            failures.append(failure)
    settings = f"tolerance {tolerance:g}" + (f", atol {atol:g}" if atol is not None else "")
    settings += f", rtol {rtol:g}" if rtol else ""
    return OutputCheck(
        max(p[0] for p in per_output),
        max(p[1] for p in per_output),
        min(p[2] for p in per_output),
        not failures,
        "; ".join(failures) + f" ({settings})" if failures else "",
        per_output if len(per_output) > 1 else [],
    )


def _check_output(name: str, output, reference, tolerance: float, atol: float | None, rtol: float):
    """One output against the reference's (:func:`compare_outputs`). Returns its (max abs
    error, max rel error, cosine), and why it fails the check (``None``: it passes)."""
    if output.size != reference.size:
        return (float("inf"), float("inf"), 0.0), (
            f"{name} shape {output.shape} != reference {reference.shape}"
        )
    out = output.astype(np.float64).ravel()
    ref = reference.astype(np.float64).ravel()
    if not np.all(np.isfinite(out)):
        return (float("inf"), float("inf"), 0.0), f"{name} has NaN or Inf"
    diff = np.abs(out - ref)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    max_abs = float(np.max(diff)) if out.size else 0.0
    max_rel = max_abs / max(scale, 1e-12)
    norms = float(np.linalg.norm(out) * np.linalg.norm(ref))
    cosine = float(np.dot(out, ref) / norms) if norms > 0 else float(max_abs == 0)
    bound = (tolerance * scale if atol is None else atol) + rtol * np.abs(ref)
    within = bool(np.all(diff <= bound)) if out.size else True
    if not within or cosine < 1 - tolerance:
        return (max_abs, max_rel, cosine), (
            f"{name} differs from the reference: max abs error {max_abs:.2e}, max rel "
            f"error {max_rel:.2e}, cosine {cosine:.6f}"
        )
    return (max_abs, max_rel, cosine), None


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and first line (a compile failure's own text),
    redacted (an error of the tracking store repeats its URI)."""
    text = redact_text(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:1000] if not isinstance(exc, CompileFailed) else first


def relog(payload: tuple) -> None:
    """A record a worker process forwarded (``("log", (level, message, logger))``), logged
    here under the worker's own logger: the run's log file holds it, and the terminal as its
    level says (the machinery's lines only with ``-v``)."""
    level, message, *name = payload
    logging.getLogger(name[0] if name else __name__).log(level, "%s", message)
