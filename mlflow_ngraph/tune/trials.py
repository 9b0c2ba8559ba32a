"""A tune's trials: what was asked, what was measured, and the tune's own journal.

Results are never copied here: a trial's figures are those of its cell at its batch size in
the benchmark journal (:mod:`mlflow_ngraph.tracking.journal`), the one source a resume and
the store read. The tune journal only records which configurations were asked, in which
group, and how long each group took; a ``kill -9`` loses at most the group in flight, and a
re-run measures only what the benchmark journal lacks of it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.tracking import schema as S


@dataclass
class Trial:
    """One configuration at one batch size, and (once measured) its figures."""

    number: int
    batch_size: int
    compiler: str
    flags: dict[str, Any]
    #: its Optuna params (``None``: a default outside the searched values)
    params: dict[str, Any] | None
    group: int
    stage: str = "search"  # search, or final (measured again to call the winner)
    cell_key: str = ""
    run_id: str | None = None
    status: str | None = None  # OK, INVALID, FAILED; None: not measured yet
    metrics: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    stable: bool | None = None
    #: the figure Optuna was told (one per objective)
    values: list[float] | None = None
    #: Optuna's constraint values (each <= 0 where met), the first one validity
    constraints: list[float] | None = None
    feasible: bool = False

    @property
    def label(self) -> str:
        return f"{self.compiler}{{{short_flags(self.flags, self.compiler)}}}"

    @property
    def speedup(self) -> float | None:
        return self.metrics.get(S.M_SPEEDUP_PAIRED)

    @property
    def interval(self) -> tuple[float, float] | None:
        low, high = self.metrics.get(S.M_SPEEDUP_CI_LOW), self.metrics.get(S.M_SPEEDUP_CI_HIGH)
        return (low, high) if low is not None and high is not None else None

    def config(self) -> tuple[str, str]:
        return self.compiler, json.dumps(self.flags, sort_keys=True, default=str)


def short_flags(flags: dict[str, Any], compiler: str) -> str:
    """The flags that differ from ``compiler``'s defaults (``defaults`` when none do)."""
    from mlflow_ngraph.compilers.registry import get_compiler

    defaults = get_compiler(compiler).resolve_flags({})
    items = [f"{k}={v}" for k, v in flags.items() if defaults.get(k) != v]
    return ",".join(items) or "defaults"


class TuneJournal:
    """Append-only JSON lines under the home: ``tunes/<key>.jsonl``."""

    def __init__(self, home: Path, key: str) -> None:
        self.path = Path(home) / "tunes" / f"{key}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, kind: str, **data: Any) -> None:
        line = json.dumps({"kind": kind, "time": time.time(), **data}, default=str) + "\n"
        with open(self.path, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line torn by a kill: its group is asked again
                continue
        return out

    def load(self) -> tuple[list[Trial], float, str | None]:
        """The trials asked so far, the seconds spent before, and the tune's run id."""
        trials: list[Trial] = []
        spent, run_id = 0.0, None
        for record in self.records():
            kind = record.get("kind")
            if kind == "trial":
                trials.append(
                    Trial(
                        number=record["number"],
                        batch_size=record["batch_size"],
                        compiler=record["compiler"],
                        flags=record["flags"],
                        params=record.get("params"),
                        group=record["group"],
                        stage=record.get("stage", "search"),
                    )
                )
            elif kind == "spent":
                spent += float(record["seconds"])
            elif kind == "run":
                run_id = record["run_id"]
        return trials, spent, run_id

    def references(self) -> dict[tuple[int, int], dict]:
        """(group, batch size) -> the identity reference measured with that group: what
        its trials' latency ratios and paybacks rest on after a resume."""
        return {
            (int(r["group"]), int(r["batch_size"])): {"metrics": r.get("metrics") or {}}
            for r in self.records()
            if r.get("kind") == "reference"
        }
