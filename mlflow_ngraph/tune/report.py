"""A tune's end: its table, the winner line, the Pareto front, and the tune run in MLflow
(params, the winner's tags, the front as a plot, the trials, the winner as a spec, a
description the run page shows first, and the results index ``compare`` and ``pull`` read)."""

from __future__ import annotations

import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

from mlflow_ngraph.measure.verdict import NO_RERUN
from mlflow_ngraph.table import format_table, terminal_width
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.choose import Verdict, best_per_compiler, flag_text, pareto_front
from mlflow_ngraph.tune.search import Tune
from mlflow_ngraph.tune.settings import OBJECTIVES
from mlflow_ngraph.tune.trials import Trial

log = logging.getLogger(__name__)

T_WINNER = "ngraph.tune.winner"
T_WINNER_RUN = "ngraph.tune.winner_run"
T_WINNER_BATCH = "ngraph.tune.winner_batch_size"
T_LEAD = "ngraph.tune.lead"
T_STOP = "ngraph.tune.stop_reason"
T_UNREACHED = "ngraph.tune.unreached"

#: why the search stopped, as the end of "stopped by ..."
STOP_REASONS = {
    "budget": "the budget",
    "trials": "--trials",
    "no_improvement": "--patience",
    "space_exhausted": "convergence: Optuna proposed only configurations measured already",
}


def _num(value: float | None, digits: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if math.isinf(value):
        return "never"
    return format(value, digits)


def _speedup(t: Trial) -> str:
    if t.speedup is None:
        return "-"
    text = f"{t.speedup:.2f}x"
    if t.interval:
        text += f" [{t.interval[0]:.2f}-{t.interval[1]:.2f}]"
    return text


def _rerun(t: Trial) -> str:
    """Where a re-run of the trial's speedup on this host is expected to land."""
    ends = t.rerun_interval
    return "-" if t.speedup is None or not ends else f"[{ends[0]:.2f}-{ends[1]:.2f}]"


def stability(t: Trial) -> str:
    """A row's stability mark: STABLE, UNSTABLE, or "-" where its record has none."""
    return {True: "STABLE", False: "UNSTABLE"}.get(t.stable, "-")


def _phase(tune: Tune, t: Trial) -> tuple[str, str]:
    """A row's phase (``finalist`` where its configuration was measured in the final
    round, else ``search``) and a note on a finalist shown by its search figures."""
    final = next(
        (
            f
            for f in tune.trials
            if f.stage == "final" and f.batch_size == t.batch_size and f.config() == t.config()
        ),
        None,
    )
    if final is None:
        return "search", ""
    if t.stage == "final":
        return "finalist", ""
    return "finalist", f"final round {final.status or 'not measured'}: search figures"


def _limit_note(t: Trial) -> str:
    """Why a row shown was not in the running for the winner ("": it was)."""
    if t.feasible:
        return ""
    return "no paired figure" if not t.values else "misses a limit"


def best_table(tune: Tune, width: int | None = None) -> str:
    """The best configuration per compiler and batch size."""
    higher = OBJECTIVES[tune.settings.objectives[0]] == "maximize"
    counts: dict[tuple[str, int], int] = {}
    for t in tune.trials:
        if t.stage == "search":
            counts[(t.compiler, t.batch_size)] = counts.get((t.compiler, t.batch_size), 0) + 1
    rows = []
    for t in best_per_compiler(tune.trials, higher):
        phase, note = _phase(tune, t)
        notes = [n for n in (note, _limit_note(t)) if n]
        rows.append(
            [
                t.batch_size,
                t.compiler,
                flag_text(t),
                _speedup(t),
                _rerun(t),
                stability(t),
                _num(t.metrics.get(S.M_THROUGHPUT), ".1f"),
                _num(t.metrics.get(S.M_LATENCY_P99), ".3g"),
                _num(t.metrics.get(S.M_COMPILE), ".1f"),
                _num(tune.payback(t), ".3g"),
                counts.get((t.compiler, t.batch_size), 0),
                phase,
                "; ".join(notes),
            ]
        )
    headers = [
        "bs", "compiler", "flags", "speedup [95%]", "re-run", "stability", "throughput", "p99_ms",
        "compile_s", "payback", "trials", "phase", "note",
    ]  # fmt: skip
    table = format_table(headers, rows, width=width or terminal_width(), keep=2)
    if rows and all(r[4] == "-" for r in rows):
        table += f"\nre-run: {NO_RERUN}"
    return table


def failures_table(tune: Tune) -> str | None:
    rows = [
        [t.number, t.batch_size, t.label, t.status, (t.reason or "")[:90]]
        for t in tune.trials
        if t.status in (S.STATUS_FAILED, S.STATUS_INVALID)
    ]
    if not rows:
        return None
    return format_table(["trial", "bs", "configuration", "status", "why"], rows)


def front(tune: Tune) -> list[tuple[float, float, Trial]]:
    """The Pareto front of throughput against p99 latency over every valid trial (the
    final measurement of a configuration stands for its search trial, as in the table):
    the points no other beats on both axes."""
    latest: dict[tuple, Trial] = {}
    for t in tune.trials:
        if t.status != S.STATUS_OK:
            continue
        key = (*t.config(), t.batch_size)
        if key not in latest or t.stage == "final":
            latest[key] = t
    points = [
        (t.metrics[S.M_THROUGHPUT], t.metrics[S.M_LATENCY_P99], t)
        for t in latest.values()
        if t.metrics.get(S.M_THROUGHPUT) is not None and t.metrics.get(S.M_LATENCY_P99) is not None
    ]
    return pareto_front(points)


def front_table(tune: Tune) -> str:
    rows = [
        [f"{thr:.1f}", f"{p99:.3g}", t.batch_size, t.label, _speedup(t), stability(t)]
        for thr, p99, t in front(tune)
    ]
    headers = ["throughput", "p99_ms", "bs", "configuration", "speedup", "stability"]
    return format_table(headers, rows)


def unreached(tune: Tune) -> dict[int, str]:
    """The batch sizes asked for that the tune has no answer at, each with why: never
    searched (and what stopped the search first), its trials not measured, every one of
    them failed or invalid, none within the constraints, or no finalist measured valid."""
    out: dict[int, str] = {}
    for b in tune.settings.batch_sizes:
        asked = [t for t in tune.trials if t.batch_size == b and t.stage == "search"]
        measured = [t for t in asked if t.status is not None]
        if not asked:
            out[b] = f"never searched: {_stopped_first(tune)}"
        elif not measured:
            out[b] = f"its {len(asked)} trial(s) were asked but not measured (interrupted)"
        elif not any(t.status == S.STATUS_OK for t in measured):
            out[b] = f"every one of its {len(measured)} trial(s) FAILED or was INVALID"
        elif not any(t.feasible for t in measured):
            out[b] = f"none of its {len(measured)} trial(s) met the constraints"
        elif not any(t.stage == "final" and t.batch_size == b and t.feasible for t in tune.trials):
            out[b] = "no finalist was measured valid in the final round"
    return out


def _stopped_first(tune: Tune) -> str:
    """What ended the search before a batch size's first group."""
    groups = {t.group for t in tune.trials if t.stage == "search"}
    done = f"after {len(groups)} group(s) at other batch sizes"
    if tune.stop_reason == "budget":
        budget = tune.settings.budget_s
        spent = f" ({budget / 60:.3g} min)" if budget else ""
        return f"the budget{spent} was spent {done} (a larger --budget reaches it)"
    if tune.stop_reason == "trials":
        return f"--trials was reached {done}"
    if tune.stop_reason == "no_improvement":
        return f"--patience stopped the search {done}"
    return f"the search ended {done}"


def stop_lines(tune: Tune) -> list[str]:
    """Why the search stopped, then a line per batch size with no answer and why."""
    reason = STOP_REASONS.get(tune.stop_reason, "the end of the search")
    if tune.stop_reason == "no_improvement":
        reason += f" ({tune.settings.patience} trials without improvement)"
    lines = [f"stopped by {reason}"]
    for b, why in unreached(tune).items():
        lines.append(f"bs{b} not reached: {why}")
    return lines


def plot_front(tune: Tune, path: Path) -> Path | None:
    """Throughput against p99 latency of every valid trial, the front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [
        (t.metrics[S.M_LATENCY_P99], t.metrics[S.M_THROUGHPUT], t)
        for t in tune.trials
        if t.status == S.STATUS_OK
        and t.metrics.get(S.M_THROUGHPUT)
        and t.metrics.get(S.M_LATENCY_P99)
    ]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    compilers = sorted({t.compiler for *_, t in points})
    for i, name in enumerate(compilers):
        xs = [p for p, _, t in points if t.compiler == name]
        ys = [q for _, q, t in points if t.compiler == name]
        ax.scatter(xs, ys, s=22, alpha=0.7, label=name, color=f"C{i}")
    line = front(tune)
    ax.plot([p for _, p, _ in line], [q for q, _, _ in line], "k--", lw=1, label="Pareto front")
    for thr, p99, t in line:
        ax.annotate(f"bs{t.batch_size}", (p99, thr), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    ax.set_xlabel("p99 latency of a request (ms)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title(
        f"tune of {tune.settings.model.label} on {tune.settings.device}: every valid trial"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def description(tune: Tune, verdict: Verdict | None, miss: str | None) -> str:
    """The tune run's description (the first thing its page shows)."""
    s = tune.settings
    head = f"**Tune of {s.model.label} on {s.device}** ({', '.join(s.objectives)})\n\n"
    stops = [f"- {line}" for line in stop_lines(tune)]
    if verdict is None:
        return head + (miss or "no winner") + "\n\n" + "\n".join(stops) + "\n"
    w = verdict.winner
    lines = [
        head + verdict.sentence() + ".",
        "",
        f"- flags: `{json.dumps({k: v for k, v in w.flags.items() if v is not None})}`",
        f"- throughput {w.metrics.get(S.M_THROUGHPUT, float('nan')):.1f} samples/s, p99 "
        f"{w.metrics.get(S.M_LATENCY_P99, float('nan')):.3g} ms ({stability(w)})",
        f"- {sum(t.stage == 'search' for t in tune.trials)} trials; every trial is a child "
        "run; `winner.yaml` is the winner as a spec for `mlflow-ngraph benchmark --spec`",
        *stops,
    ]
    return "\n".join(lines) + "\n"


def log_tune(tune: Tune, verdict: Verdict | None, miss: str | None, fragment: str | None) -> None:
    """Write the tune's conclusion to its run and end it FINISHED, with the index of every
    trial's cell run (what ``compare`` and ``pull`` read)."""
    from mlflow_ngraph.tracking import index
    from mlflow_ngraph.tracking import mlflow_log as ml

    client, run_id = tune.client, tune.run_id
    searched = [t for t in tune.trials if t.stage == "search"]
    metrics: dict[str, float] = {
        "trials": float(len(searched)),
        "trials_failed": float(sum(t.status == S.STATUS_FAILED for t in searched)),
        "trials_invalid": float(sum(t.status == S.STATUS_INVALID for t in searched)),
        "tune_s": tune.spent(),
    }
    tags = {T_STOP: tune.stop_reason or "done"}
    missing = unreached(tune)
    if missing:
        tags[T_UNREACHED] = "; ".join(f"bs{b}: {why}" for b, why in missing.items())
    if verdict is not None:
        w = verdict.winner
        metrics.update(
            {
                "winner_speedup": w.speedup or float("nan"),
                "winner_throughput": w.metrics.get(S.M_THROUGHPUT, float("nan")),
                "winner_latency_p99_ms": w.metrics.get(S.M_LATENCY_P99, float("nan")),
            }
        )
        tags.update(
            {
                T_WINNER: w.label,
                T_WINNER_BATCH: str(w.batch_size),
                T_LEAD: verdict.lead(),
            }
        )
        if w.run_id:
            tags[T_WINNER_RUN] = w.run_id
    desc = description(tune, verdict, miss)
    tags["mlflow.note.content"] = desc
    metric_list = [(k, v, 0) for k, v in metrics.items() if v == v]
    ml.log_batch(client, run_id, metrics=metric_list, tags=tags)
    _log_files(tune, fragment)
    index.write(client, run_id, index.snapshot(client, tune.cell_runs()))
    ml.finish(client, run_id, "FINISHED")


def _log_files(tune: Tune, fragment: str | None) -> None:
    """The tune run's files: its trials, its tables, the winner as a spec (``fragment``)
    and the Pareto front's plot."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        trials = [_trial_record(tune, t) for t in tune.trials]
        (folder / "trials.json").write_text(json.dumps(trials, indent=1, default=str))
        (folder / "summary.txt").write_text(
            best_table(tune, width=200) + "\n\n" + front_table(tune)
        )
        if fragment:
            (folder / "winner.yaml").write_text(fragment)
        plot_front(tune, folder / "pareto_front.png")
        for path in folder.iterdir():
            tune.client.log_artifact(tune.run_id, str(path))


def _trial_record(tune: Tune, t: Trial) -> dict[str, Any]:
    return {
        "number": t.number,
        "stage": t.stage,
        "group": t.group,
        "batch_size": t.batch_size,
        "compiler": t.compiler,
        "flags": t.flags,
        "status": t.status,
        "reason": t.reason,
        "feasible": t.feasible,
        "stable": t.stable,
        "values": t.values,
        "speedup": t.speedup,
        "speedup_interval": t.interval,
        "speedup_rerun_interval": t.rerun_interval,
        "throughput": t.metrics.get(S.M_THROUGHPUT),
        "latency_p99_ms": t.metrics.get(S.M_LATENCY_P99),
        "compile_s": t.metrics.get(S.M_COMPILE),
        "payback_inferences": tune.payback(t),
        "run_id": t.run_id,
    }
