"""One gate, start to end: the two sides resolved, their workers started (each in its own
environment where told), the outputs compared, both measured in the same rounds, the
verdict recorded in MLflow, on a registered challenger, and (``--promote``) on the alias."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.gate import record, rounds
from mlflow_ngraph.gate.rounds import CHALLENGER, CHAMPION
from mlflow_ngraph.gate.sides import Context, resolve
from mlflow_ngraph.gate.verdict import EXIT_STATUS, TOLERANCE, UNSURE, on_a_busy_host
from mlflow_ngraph.variables import ENV_GATE_PLANTED_DELAY

#: the default seconds of rounds before an unsure gate stops measuring
BUDGET_S = 60.0


@dataclass(frozen=True)
class GateSettings:
    """A gate's settings, validated once (``mlflow-ngraph gate``'s options)."""

    champion: str
    challenger: str
    tracking_uri: str
    home: Path
    champion_python: str | None = None
    challenger_python: str | None = None
    batch_size: int | None = None
    tolerance: float = TOLERANCE
    budget_s: float = BUDGET_S
    output_tolerance: float = 1e-3
    device: str = "cpu"
    experiment: str = record.EXPERIMENT
    promote: bool = False
    rerun_sd: float | None = None
    trusted_keys: str | None = None
    allow_unsigned: bool | None = None
    trust_code: bool | None = None
    #: the look at the host before anything is built or measured (``--wait-quiet``,
    #: ``--busy-ok``; :class:`~mlflow_ngraph.measure.quiet.HostCheck`), None: no look
    host_check: Any = None

    def __post_init__(self) -> None:
        if not 0 < self.tolerance < 1:
            raise NgraphError(
                f"--tolerance must be between 0 and 1 (0.03: +-3%), got {self.tolerance}"
            )
        if not self.budget_s > 0:
            raise NgraphError(f"--budget must be more than 0 s, got {self.budget_s:g}")
        if self.batch_size is not None and self.batch_size < 1:
            raise NgraphError(f"--batch-size must be 1 or more, got {self.batch_size}")


class HostBusy(NgraphError):
    """The host stayed busy (``--wait-quiet``): no verdict could be measured, so the gate
    ends ``unsure`` (exit status 2), as a gate whose interval stayed too wide does: a CI
    job tries again on a quieter runner rather than reading an error in the change."""

    exit_code = EXIT_STATUS[UNSURE]


def look_at_host(check) -> str | None:
    """The benchmark's look at the host before the gate builds or measures anything: other
    processes over ``--max-other-cpu`` make a gate read ``unsure`` after its whole budget.
    Returns the host's load in words where it was busy and the gate measures anyway
    (``--busy-ok``), else None.

    Raises:
        HostBusy: the host stayed busy for ``--wait-quiet`` seconds."""
    if check is None:
        return None
    try:
        load = check.run()
    except NgraphError as exc:
        raise HostBusy(f"no verdict: {exc}") from None
    return load.said() if check.busy(load) else None


def planted_delay() -> float:
    """The test-only planted delay (:data:`ENV_GATE_PLANTED_DELAY`), 0 where unset."""
    text = os.environ.get(ENV_GATE_PLANTED_DELAY, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise NgraphError(f"{ENV_GATE_PLANTED_DELAY}={text!r} is not a number: unset it") from None
    if not 0 <= value < 10:
        raise NgraphError(f"{ENV_GATE_PLANTED_DELAY}={text!r} is out of range: unset it")
    return value


def check_outputs(workers, shapes, tolerance: float):
    """Both engines run on the same fresh input; the challenger's outputs checked against
    the champion's as ``benchmark`` checks an engine against eager."""
    import numpy as np

    from mlflow_ngraph.run.worker import CHECK_SEED, compare_outputs

    shape, dtype = shapes[CHAMPION]
    x = np.random.default_rng(CHECK_SEED + shape[0]).standard_normal(shape).astype(dtype)
    reference = workers[CHAMPION].ask("outputs", x)
    return compare_outputs(workers[CHALLENGER].ask("outputs", x), reference, tolerance)


def _shapes(workers) -> dict[str, tuple]:
    shapes = {r: (tuple(w.info["input_shape"]), w.info["dtype"]) for r, w in workers.items()}
    if shapes[CHAMPION][0] != shapes[CHALLENGER][0]:
        raise NgraphError(
            f"the champion takes input {shapes[CHAMPION][0]} and the challenger "
            f"{shapes[CHALLENGER][0]}: a gate compares two engines of one model at one batch size"
        )
    return shapes


def _spread(settings: GateSettings):
    """The host's spread between sittings of a ratio, where known (``--rerun-sd``, else
    the home's history of speedups: a ratio of two engines measured in rounds): that of one
    sitting on another occasion, both of its components together."""
    from mlflow_ngraph.measure.history import given_or_measured, kind_of

    kind = kind_of(settings.device)
    spread = given_or_measured(settings.home, "speedup", None, settings.rerun_sd, kind)
    return spread.of_mean(1) if spread is not None else None


def _side(side, info: dict, throughput: float | None) -> dict[str, Any]:
    versions = info.get("versions") or {}
    return {
        "label": side.label,
        "kind": side.kind,
        "throughput": throughput,
        "runtime": versions.get("runtime", ""),
        "python": f"{versions.get('python', '')} {versions.get('prefix', '')}".strip(),
        "versions": versions,
        "batch_size": side.task.get("batch_size"),
    }


def _result(settings, sides, workers, check, outcome, delay) -> dict[str, Any]:
    infos = {r: w.info for r, w in workers.items()}
    tp = outcome.throughput if outcome else {}
    interval = outcome.interval if outcome else None
    result = {
        "verdict": "invalid" if not check.valid else outcome.verdict,
        "ratio": outcome.ratio if outcome else None,
        "low": interval.low if interval else None,
        "high": interval.high if interval else None,
        "sitting_low": outcome.sitting[0] if outcome and outcome.sitting else None,
        "sitting_high": outcome.sitting[1] if outcome and outcome.sitting else None,
        "interval_kind": interval.kind if interval else None,
        "interval_source": interval.source if interval else None,
        "tolerance": settings.tolerance,
        "budget_s": settings.budget_s,
        "rounds": outcome.rounds if outcome else 0,
        "seconds": outcome.seconds if outcome else 0.0,
        "outputs": {
            "valid": check.valid,
            "max_abs_error": check.max_abs_error,
            "cosine": check.cosine,
            "reason": check.reason,
        },
        "planted_delay": delay or None,
        "notes": [],
    }
    for role in (CHAMPION, CHALLENGER):
        result[role] = _side(sides[role], infos[role], tp.get(role))
    return result


def run_gate(settings: GateSettings, say: Callable[[str], None]) -> dict[str, Any]:
    """The gate: returns its result (:mod:`mlflow_ngraph.gate.report` renders it).

    Raises:
        NgraphError: a side that cannot be had or measured, said in one line."""
    from mlflow_ngraph.scratch import work_folder
    from mlflow_ngraph.tracking.mlflow_log import connect

    delay = planted_delay()
    client = connect(settings.tracking_uri)
    with work_folder(None, "ngraph-gate-") as work:
        ctx = Context(
            settings.tracking_uri,
            settings.home,
            work,
            settings.batch_size,
            settings.device,
            trusted_keys=settings.trusted_keys,
            allow_unsigned=settings.allow_unsigned,
            trust_code=settings.trust_code,
        )
        sides = {
            CHAMPION: resolve(CHAMPION, settings.champion, ctx, client),
            CHALLENGER: resolve(CHALLENGER, settings.challenger, ctx, client),
        }
        if settings.promote:
            record.check_promotable(sides[CHAMPION], sides[CHALLENGER])
        busy = look_at_host(settings.host_check)
        sides[CHALLENGER].task["delay"] = delay
        result = _measured(settings, sides, work, delay, say)
    if busy:
        result["verdict"], note = on_a_busy_host(result["verdict"], result["high"], busy)
        if note:
            result["notes"].append(note)
    run_id = record.log_gate(
        client, settings.experiment, sides, result["infos"], result, settings.home
    )
    result.pop("infos")
    result["run_id"] = run_id
    result["experiment"] = settings.experiment
    record.tag_version(client, sides[CHALLENGER], result, run_id)
    if settings.promote:
        result["notes"].append(
            record.promote(client, sides[CHAMPION], sides[CHALLENGER], result["verdict"])
        )
    return result


def _measured(settings, sides, work: Path, delay: float, say) -> dict[str, Any]:
    """Both workers started, the outputs checked, the rounds measured; the result."""
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    tasks = {role: side.task for role, side in sides.items()}
    pythons = {CHAMPION: settings.champion_python, CHALLENGER: settings.challenger_python}
    say(f"gate: {sides[CHAMPION].label} (champion) against {sides[CHALLENGER].label} (challenger)")
    workers = rounds.start(tasks, pythons, logs, say)
    try:
        check = check_outputs(workers, _shapes(workers), settings.output_tolerance)
        outcome = None
        if check.valid:

            def progress(chunk, ratio, interval, verdict, spent):
                if interval is not None and verdict == "unsure" and spent < settings.budget_s:
                    say(f"gate: unsure after {spent:.0f} s ({ratio:.3f}, 95% CI "
                        f"{interval.low:.3f}..{interval.high:.3f}): measuring longer")  # fmt: skip

            outcome = rounds.measure(workers, settings.tolerance, settings.budget_s,
                                     _spread(settings), progress)  # fmt: skip
    finally:
        for worker in workers.values():
            worker.close()
    result = _result(settings, sides, workers, check, outcome, delay)
    result["infos"] = {r: w.info for r, w in workers.items()}
    if outcome is not None and outcome.ratio is not None and not math.isfinite(outcome.ratio):
        result["ratio"] = None
    return result
