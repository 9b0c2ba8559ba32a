"""Signing again what this home measured before results were signed.

Only results this home's journals hold as measured here (never ones it took from the
store), of runs that still exist, are signed, with the figures the journal holds (the store's
may have been rewritten since); a result with an engine only when the engine's manifest in
the store is still the one its run pinned (``engine.bs<b>.manifest_sha256``, write-once).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking.engines import MANIFEST, engine_param, file_sha256
from mlflow_ngraph.tracking.journal import Journal
from mlflow_ngraph.tracking.provenance import Producer


@dataclass
class Resigned:
    signed: int = 0
    skipped: list[str] = field(default_factory=list)  # why, one per result left unsigned


def resign_journal(client, journal: Journal, experiment_id: str, producer: Producer) -> Resigned:
    """Sign every result of ``journal`` (one of this home's) in ``experiment_id``."""
    done = Resigned()
    for state in journal.cells.values():
        if state.run_id is None or state.description is None:
            continue
        try:
            run = client.get_run(state.run_id)
        except Exception as exc:  # MLflow raises its own and requests' errors for a gone run
            done.skipped.append(f"run {state.run_id}: not in the store ({type(exc).__name__})")
            continue
        if run.info.lifecycle_stage != "active" or str(run.info.experiment_id) != experiment_id:
            continue
        for b, record in sorted(state.measured.items()):
            if record.get("from_store"):
                done.skipped.append(f"run {state.run_id} bs{b}: measured elsewhere")
                continue
            if b in state.settling:  # the run still holds the interval first logged
                done.skipped.append(
                    f"run {state.run_id} bs{b}: its settled re-run interval is not in the "
                    "store yet (run 'mlflow-ngraph sync' or the benchmark again, which sign it)"
                )
                continue
            try:
                digest = _pinned_engine(client, run, b)
            except NgraphError as exc:
                done.skipped.append(f"run {state.run_id} bs{b}: {exc}")
                continue
            record = {**record, "engine_dir": None}
            producer.sign(client, state.run_id, experiment_id, b, record, state.description,
                          digest)  # fmt: skip
            done.signed += 1
    return done


def _pinned_engine(client, run, b: int) -> str | None:
    """The sha256 of the run's engine manifest at ``b`` when the stored manifest is still
    the pinned one (None: no engine logged).

    Raises:
        NgraphError: the stored manifest is not the pinned one."""
    pinned = run.data.params.get(engine_param(b))
    if not pinned:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            name = f"engines/bs{b}/{MANIFEST}"
            path = Path(client.download_artifacts(run.info.run_id, name, tmp))
        except Exception:  # any failure to fetch it: said, and the result left unsigned
            raise NgraphError("its engine's manifest cannot be read from the store") from None
        if file_sha256(path) != pinned:
            raise NgraphError("its engine's manifest is not the one its run pinned (altered)")
    return pinned
