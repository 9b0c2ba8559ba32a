"""What a tune concludes: the winner and its lead, the best per compiler and batch size, the
Pareto front of throughput against p99 latency, and the winner as a spec fragment."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from mlflow_ngraph.measure.verdict import RERUN, SITTING, noise_text
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tune.trials import Trial, short_flags


@dataclass
class Verdict:
    """The winner of a tune, the runner-up it was measured against (the next finalist on the
    ranking the winner was chosen on), and whether its lead is beyond noise (their speedup
    intervals, from the same rounds, do not overlap). A lead is judged only between two
    figures that are both STABLE: where either is UNSTABLE, ``beyond_noise`` is False and
    the lead reads "not judged: UNSTABLE"."""

    winner: Trial
    runner_up: Trial | None
    beyond_noise: bool
    #: a tie in which the finalist with the lower estimate was chosen: its interval's low
    #: end is the higher (the surer figure)
    surer: bool = False
    #: what the finalists at the winner's batch size were ranked on
    ranked_on: str = "throughput"
    #: which intervals judged the lead: the re-run intervals (RERUN) or, where the host has
    #: no spread between sittings yet, the sitting's (SITTING)
    judged_on: str | None = RERUN

    @property
    def unstable(self) -> list[Trial]:
        """The winner and the runner-up, those of them whose figures are UNSTABLE."""
        return [t for t in (self.winner, self.runner_up) if t is not None and t.stable is False]

    @property
    def noise(self) -> str:
        """The lead's verdict in the words every output uses (:func:`noise_text`)."""
        roles = tuple("own" if t is self.winner else "next" for t in self.unstable)
        return noise_text(self.beyond_noise if self.runner_up else None, roles, self.judged_on)

    def lead(self) -> str:
        """The lead in a few words: what the ``ngraph.tune.lead`` tag says."""
        if self.runner_up is None:
            return "no other finalist"
        return "tie within noise" if self.noise == "within noise" else self.noise

    def sentence(self) -> str:
        w = self.winner
        head = f"winner: {w.label} at bs{w.batch_size}: {_figure(w)} over eager"
        if self.runner_up is None:
            return head + " (no other finalist at its batch size)" + self._unstable_note()
        r = self.runner_up
        nxt = f"{r.label} ({_figure(r)}), the next finalist on the {self.ranked_on}"
        if self.unstable:
            return head + f"; its lead over {nxt}, is {self.noise}" + self._unstable_note()
        if self.beyond_noise:
            return head + f"; its lead over {nxt}, is {self.noise}"
        text = head + f"; a tie within noise with {nxt}: {self._overlap()}, so either is as good"
        text += " on this host"
        if self.surer:
            text += (
                f" ({w.label} is chosen: its interval's low end is the higher, the surer figure)"
            )
        return text

    def _overlap(self) -> str:
        """Which intervals overlap: the re-run intervals, shown, where they judged the lead
        (the sitting intervals printed beside each figure may not overlap then)."""
        w, r = self.winner, self.runner_up
        if self.judged_on == RERUN and w.rerun_interval and r.rerun_interval:
            ends = (w.rerun_interval, r.rerun_interval)
            shown = " and ".join(f"[{a:.2f}-{b:.2f}]" for a, b in ends)
            return f"their re-run intervals ({shown}: where a re-run on this host lands) overlap"
        return "their intervals overlap"

    def _unstable_note(self) -> str:
        """What an UNSTABLE winner or runner-up means for the answer ("": none is)."""
        if not self.unstable:
            return ""
        whose = " and ".join(
            "the winner's" if t is self.winner else "the runner-up's" for t in self.unstable
        )
        return (
            f": {whose} figures are UNSTABLE, so neither figure nor ranking can be trusted: "
            "measure again on a quiet host (the same tune with --remeasure unstable)"
        )


def _figure(t: Trial) -> str:
    text = f"{t.speedup:.2f}x" if t.speedup is not None else "-"
    if t.interval:
        text += f" [{t.interval[0]:.2f}-{t.interval[1]:.2f}]"
    if t.stable is False:
        text += " UNSTABLE"
    return text


def judge_lead(winner: Trial, other: Trial) -> tuple[bool, str | None]:
    """Whether ``winner``'s speedup interval clears ``other``'s (the direction of the
    objective: for a latency to minimize the winner's speedup is still the higher), and on
    which intervals: their re-run intervals where the host has measured its spread between
    sittings (a lead a re-run keeps, RERUN), else this sitting's (SITTING). Never between
    figures either of which is UNSTABLE: their intervals do not hold the host's noise."""
    if winner.stable is False or other.stable is False:
        return False, None
    a, b = winner.rerun_interval, other.rerun_interval
    if a is not None and b is not None:
        return a[0] > b[1], RERUN
    a, b = winner.interval, other.interval
    if a is None or b is None:
        return False, None
    return a[0] > b[1], SITTING


def verdict(finals: Sequence[Trial], value, higher: bool, paired: bool = False) -> Verdict | None:
    """The winner among feasible finalists, and its lead over the next finalist at the same
    batch size on the same ranking (the runner-up).

    The batch size is the one whose best finalist is best by ``value(trial)`` (the
    objective's own metric: only an absolute figure compares batch sizes). Within it, with
    ``paired`` (a throughput objective) and every finalist holding a paired speedup, the
    finalists are ranked on those speedups: they come from the same rounds (the host's drift
    cancels) and are what the lead's "beyond noise" is judged on, where the throughputs'
    order may say the opposite (windows of different lengths weigh the host's slow spells
    differently). Where the first two tie within noise (both STABLE), the one whose
    interval's low end is the higher is chosen: the surer figure (an engine with few, long
    windows can read a high estimate with a wide interval)."""
    pool = [t for t in finals if t.feasible and value(t) is not None]
    if not pool:
        return None
    pool.sort(key=value, reverse=higher)
    same_b = [t for t in pool if t.batch_size == pool[0].batch_size]
    ranked_on = "throughput" if higher else "latency"
    if paired and all(t.speedup is not None for t in same_b):
        same_b.sort(key=lambda t: t.speedup, reverse=True)
        ranked_on = "paired speedups"
    winner = same_b[0]
    runner_up = same_b[1] if len(same_b) > 1 else None
    beyond, on = judge_lead(winner, runner_up) if runner_up is not None else (False, None)
    surer = False
    stable = winner.stable is not False and (runner_up is None or runner_up.stable is not False)
    if (
        paired
        and runner_up is not None
        and stable
        and not beyond
        and winner.interval
        and (runner_up.interval)
    ):
        # a tie: the figure a deployment can count on is the interval's low end
        if runner_up.interval[0] > winner.interval[0]:
            winner, runner_up, surer = runner_up, winner, True
    return Verdict(winner, runner_up, beyond and stable, surer, ranked_on, on)


def closest_miss(trials: Sequence[Trial], constraints) -> str:
    """The one line for a tune where nothing met the constraints: the candidate that
    missed by the least, and by how much."""
    misses = []
    for trial in trials:
        if trial.status != S.STATUS_OK:
            continue
        miss = constraints.miss(trial.metrics)
        if miss is not None:
            misses.append((miss[0], trial, miss[1]))
    if not misses:
        return "no configuration was measured valid: see the FAILED and INVALID trials above"
    share, trial, text = min(misses, key=lambda m: m[0])
    return (
        f"no configuration meets the constraints: the closest, {trial.label} at "
        f"bs{trial.batch_size}, has {text}"
    )


def pareto_front(points: Sequence[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The points no other dominates, by throughput descending (then p99 ascending).
    ``points``: ``(throughput, p99 ms, payload)``; higher throughput and lower p99 are
    better. A point is dominated when another is at least as good on both axes and better
    on one: two points equal on both are both on the front. A point without a finite
    figure on both axes is left out (it cannot be placed)."""
    placed = [p for p in points if math.isfinite(p[0]) and math.isfinite(p[1])]
    front = [p for p in placed if not any(_dominates(q, p) for q in placed)]
    return sorted(front, key=lambda p: (-p[0], p[1]))


def _dominates(q: tuple[float, float, Any], p: tuple[float, float, Any]) -> bool:
    """Whether ``q`` is at least as good as ``p`` on both axes and better on one."""
    return q[0] >= p[0] and q[1] <= p[1] and (q[0] > p[0] or q[1] < p[1])


def best_per_compiler(trials: Sequence[Trial], higher: bool) -> list[Trial]:
    """The trial shown for each (compiler, batch size): its best finalist measured valid in
    the final round (the figure the winner was called on, with a paired figure or not),
    else its best valid search trial, by the paired figure."""
    best: dict[tuple[str, int], Trial] = {}
    for trial in trials:
        if trial.status != S.STATUS_OK or (trial.stage != "final" and not trial.values):
            continue
        key = (trial.compiler, trial.batch_size)
        held = best.get(key)
        if held is None or _rank(trial, higher) < _rank(held, higher):
            best[key] = trial
    return sorted(best.values(), key=lambda t: (t.batch_size, t.compiler))


def _rank(trial: Trial, higher: bool) -> tuple[bool, bool, float]:
    """Lower is better: a finalist first, one with a paired figure first, the best figure."""
    value = trial.values[0] if trial.values else 0.0
    return (trial.stage != "final", not trial.values, -value if higher else value)


def spec_fragment(winner: Trial, model_label: str, model_name: str, params: dict) -> str:
    """The winner as a spec ``benchmark --spec`` accepts."""
    from mlflow_ngraph.compilers.registry import get_compiler

    defaults = get_compiler(winner.compiler).resolve_flags({})
    flags = {k: v for k, v in winner.flags.items() if v is not None and defaults.get(k) != v}
    model: Any = {"name": model_name, "params": dict(params)} if params else model_name
    compiler: Any = {"name": winner.compiler, "flags": flags} if flags else winner.compiler
    data = {
        "models": [model],
        "compilers": [compiler],
        "batch_sizes": [winner.batch_size],
    }
    head = (
        f"# the tune's winner for {model_label}: {winner.label} at batch size {winner.batch_size}\n"
    )
    return head + yaml.safe_dump(data, sort_keys=False)


def flag_text(trial: Trial) -> str:
    return short_flags(trial.flags, trial.compiler)
