"""A tune's trials: what was asked, what was measured, and the tune's own journal.

Results are never copied here: a trial's figures are those of its cell at its batch size in
the benchmark journal (:mod:`mlflow_ngraph.tracking.journal`), the one source a resume and
the store read. The tune journal only records which configurations were asked, in which
group, and how long each group took; a ``kill -9`` loses at most the group in flight, and a
re-run measures only what the benchmark journal lacks of it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import JournalLock, checksum

log = logging.getLogger(__name__)


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

    @property
    def rerun_interval(self) -> tuple[float, float] | None:
        """Where a re-run of its speedup on this host is expected to land (None: the host has
        no measured spread between sittings yet)."""
        low = self.metrics.get(S.M_SPEEDUP_RERUN_LOW)
        high = self.metrics.get(S.M_SPEEDUP_RERUN_HIGH)
        return (low, high) if low is not None and high is not None else None

    def config(self) -> tuple[str, str]:
        return self.compiler, flags_key(self.flags)


def flags_key(flags: dict[str, Any]) -> str:
    """The flags as one comparable string: a configuration is ``(compiler, flags_key)``."""
    return json.dumps(flags, sort_keys=True, default=str)


def short_flags(flags: dict[str, Any], compiler: str) -> str:
    """The flags that differ from ``compiler``'s defaults (``defaults`` when none do)."""
    from mlflow_ngraph.compilers.registry import get_compiler

    defaults = get_compiler(compiler).resolve_flags({})
    items = [f"{k}={v}" for k, v in flags.items() if defaults.get(k) != v]
    return ",".join(items) or "defaults"


class TuneJournal:
    """Append-only JSON lines under the home: ``tunes/<name>.jsonl``, one per tune (what it
    searches, :meth:`TuneSettings.key`) and store (:meth:`name_for`).

    Every line carries a checksum, as the benchmark journal's do: a damaged line (torn by a
    kill, garbled by a disk) is skipped with a warning, and what it asked is asked again. A
    trial's number, a group's seconds and its reference are read once however often they
    were written (a journal two copies of one tune wrote before the tune had a lock)."""

    def __init__(self, home: Path, name: str) -> None:
        self.path = Path(home) / "tunes" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._warned = False

    @staticmethod
    def name_for(key: str, tracking_uri: str) -> str:
        """The journal of the tune ``key`` into the store at ``tracking_uri``: the same
        search into another store is another tune (its runs and results are there)."""
        store = hashlib.sha256(tracking_uri.encode()).hexdigest()[:8]
        return f"{key}-{store}"

    def lock(self) -> JournalLock:
        """The tune's lock (``tunes/<name>.lock``): one invocation of a tune at a time."""
        return JournalLock(self.path)

    def append(self, kind: str, **data: Any) -> None:
        record = json.loads(json.dumps({"kind": kind, "time": time.time(), **data}, default=str))
        record["crc"] = checksum(record)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def record(self, trial: Trial) -> None:
        """The line of an asked trial, written before it is measured (:meth:`load` reads
        it back)."""
        self.append(
            "trial",
            number=trial.number,
            batch_size=trial.batch_size,
            compiler=trial.compiler,
            flags=trial.flags,
            params=trial.params,
            group=trial.group,
            stage=trial.stage,
        )

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out, damaged = [], 0
        for line in self.path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line torn by a kill: its group is asked again
                damaged += 1
                continue
            if not isinstance(record, dict) or (
                "crc" in record and record["crc"] != checksum(record)
            ):
                damaged += 1
                continue
            out.append(record)
        if damaged and not self._warned:
            self._warned = True
            log.warning(
                "tune journal %s: %d damaged line(s) skipped (what they asked is asked again)",
                self.path,
                damaged,
            )
        return out

    def load(self) -> tuple[list[Trial], float, str | None]:
        """The trials asked so far (each number once: the first word on it), the seconds
        the search groups took (each group once: its last word), and the tune's run id."""
        trials: dict[int, Trial] = {}
        run_id = None
        for record in self.records():
            kind = record.get("kind")
            try:
                if kind == "trial":
                    number = int(record["number"])
                    if number in trials:
                        continue
                    trials[number] = Trial(
                        number=number,
                        batch_size=int(record["batch_size"]),
                        compiler=record["compiler"],
                        flags=record["flags"],
                        params=record.get("params"),
                        group=int(record["group"]),
                        stage=record.get("stage", "search"),
                    )
                elif kind == "run":
                    run_id = record["run_id"]
            except (KeyError, TypeError, ValueError):  # a record of another shape: skipped
                continue
        spent = sum(self.group_seconds().values())
        return sorted(trials.values(), key=lambda t: t.number), spent, run_id

    def group_seconds(self) -> dict[Any, float]:
        """Group -> the seconds it took (its last word; a line of an older journal without
        its group counts on its own)."""
        out: dict[Any, float] = {}
        for i, record in enumerate(self.records()):
            if record.get("kind") == "spent":
                try:
                    out[record.get("group", ("line", i))] = float(record["seconds"])
                except (KeyError, TypeError, ValueError):
                    continue
        return out

    def references(self) -> dict[tuple[int, int], dict]:
        """(group, batch size) -> the identity reference measured with that group: what
        its trials' latency ratios and paybacks rest on after a resume."""
        return {
            (int(r["group"]), int(r["batch_size"])): {"metrics": r.get("metrics") or {}}
            for r in self.records()
            if r.get("kind") == "reference"
        }
