"""The cell recorder: the one MLflow writer of a cell run.

It opens (or finds again) the cell's run and writes its params, tags, per-batch metrics,
engine and log artifacts, relative metrics and final status. It decides nothing about what
was measured: the runner hands it plain records (as the journal holds them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S


class CellRecorder:
    """Writes one cell's run; ``run_id`` is known once :meth:`open` returned."""

    def __init__(self, client, experiment_id: str, parent_id: str, log_engines: bool) -> None:
        self.client = client
        self.experiment_id = experiment_id
        self.parent_id = parent_id
        self.log_engines = log_engines

    def open(self, cell_key: str, name: str, known_run: str | None) -> str:
        return ml.cell_run(
            self.client, self.experiment_id, self.parent_id, cell_key, name, known_run
        )

    def params(self, run_id: str, params: dict[str, Any]) -> None:
        ml.log_params_once(self.client, run_id, params)

    def tags(self, run_id: str, tags: dict[str, str]) -> None:
        ml.log_batch(self.client, run_id, tags=tags)

    def record(self, run_id: str, b: int, record: dict) -> None:
        """One measured batch size: its metrics, status tags, runtime params and engine."""
        tags = {f"{S.T_STATUS}.bs{b}": record["status"], S.T_LAST_PARENT: self.parent_id}
        if record.get("note"):
            tags[f"ngraph.note.bs{b}"] = record["note"]
        if record.get("reference"):
            tags[S.T_REFERENCE] = record["reference"]
        stability = record.get("stability")
        if stability:
            tags[f"{S.T_STABILITY}.bs{b}"] = (
                S.STABILITY_STABLE if stability["stable"] else S.STABILITY_UNSTABLE
            )
            if stability.get("reason"):
                tags[f"{S.T_STABILITY_REASON}.bs{b}"] = stability["reason"][:5000]
            tags[f"{S.T_ATTEMPTS}.bs{b}"] = str(stability.get("attempts", 1))
        ml.log_batch(self.client, run_id, metrics=ml.batch_metrics(record["metrics"], b), tags=tags)
        runtime = record.get("runtime", {})
        # what the runtime chose, per batch size (``runtime.bs<b>.<key>``); ``runtime.<key>``
        # keeps the first batch size's value (params are written once)
        ml.log_params_once(
            self.client,
            run_id,
            {
                **{f"runtime.{k}": v for k, v in runtime.items()},
                **{S.runtime_key(k, b): v for k, v in runtime.items()},
            },
        )
        if record.get("engine_dir") and self.log_engines and Path(record["engine_dir"]).is_dir():
            ml.log_engine(self.client, run_id, Path(record["engine_dir"]), b)

    def failed(self, run_id: str, b: int, reason: str) -> None:
        ml.log_batch(
            self.client,
            run_id,
            tags={f"{S.T_STATUS}.bs{b}": S.STATUS_FAILED, f"{S.T_ERROR}.bs{b}": reason[:5000]},
        )

    def relative(self, run_id: str, values: list[ml.MetricValue], has_baseline: bool) -> None:
        """Relative metrics (speedup, RTR, ASE, BSR); a resume re-logs none the run holds."""
        logged = self.client.get_run(run_id).data.metrics
        changed = [
            (key, value, step)
            for key, value, step in values
            if logged.get(S.flat_key(key.split(".bs")[0], step)) != value
        ]
        note = (
            "identity baseline of this device and model"
            if has_baseline
            else "no identity baseline for this device and model: speedup and BSR not logged"
        )
        ml.log_batch(self.client, run_id, metrics=changed, tags={"ngraph.relative": note})

    def log_file(self, run_id: str, path: Path, artifact_path: str) -> None:
        if path.is_file() and path.stat().st_size:
            self.client.log_artifact(run_id, str(path), artifact_path=artifact_path)

    def finish(
        self,
        run_id: str,
        status: str,
        error: str,
        any_measured: bool,
        stable: bool | None = None,
    ) -> None:
        tags = {S.T_STATUS: status}
        if stable is not None:
            tags[S.T_STABILITY] = S.STABILITY_STABLE if stable else S.STABILITY_UNSTABLE
        if error:
            tags[S.T_ERROR] = error[:5000]
        ml.log_batch(self.client, run_id, tags=tags)
        ml.finish(
            self.client,
            run_id,
            "FAILED" if status == S.STATUS_FAILED and not any_measured else "FINISHED",
        )
