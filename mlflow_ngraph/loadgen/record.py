"""A loadgen invocation's record: a journal first (every LoadGen result is on disk before
MLflow hears of it, so a killed run resumes with what it finished), then one MLflow run per
cell: the figures of a VALID result as metrics, the settings as params, the verdict and its
reason as tags, LoadGen's own summary and detail logs as artifacts. An INVALID result is
never a metric: its numbers stay in LoadGen's logs, its reason in the tags."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from mlflow_ngraph import faultpoint
from mlflow_ngraph.loadgen.summary import DETAIL_FILE, SUMMARY_FILE, ScenarioResult
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.journal import checksum

log = logging.getLogger(__name__)


def validity_tag(scenario: str) -> str:
    return f"{S.T_LOADGEN}.{scenario}.validity"


def reason_tag(scenario: str) -> str:
    return f"{S.T_LOADGEN}.{scenario}.reason"


class LoadgenJournal:
    """``<home>/loadgen/<store+experiment+device>.jsonl``: ``result`` lines (a scenario's
    result, written the moment it came) and ``logged`` lines (MLflow has it). A line torn by
    a kill fails its checksum and is skipped: its scenario runs again."""

    def __init__(self, home: Path, tracking_uri: str, experiment: str, device: str) -> None:
        name = hashlib.sha256(f"{tracking_uri}|{experiment}|{device}".encode()).hexdigest()[:16]
        self.path = Path(home) / "loadgen" / f"{name}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, record: dict[str, Any]) -> None:
        record = json.loads(json.dumps({**record, "time": time.time()}, default=str))
        record["crc"] = checksum(record)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def records(self) -> list[dict[str, Any]]:
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("crc") == checksum(record):
                out.append(record)
        return out

    def state(self, cell: str) -> tuple[dict[str, ScenarioResult], set[str]]:
        """(scenario -> its journaled result, the scenarios MLflow has) of ``cell``."""
        results, logged = {}, set()
        for record in self.records():
            if record.get("cell") != cell:
                continue
            if record.get("kind") == "result":
                results[record["scenario"]] = ScenarioResult.from_dict(record["result"])
            elif record.get("kind") == "logged":
                logged.add(record["scenario"])
        return results, logged

    def result(self, cell: str, scenario: str, result: ScenarioResult) -> None:
        self._append({"kind": "result", "cell": cell, "scenario": scenario,
                      "result": result.to_dict()})  # fmt: skip
        faultpoint.point("loadgen_journaled")

    def logged(self, cell: str, scenario: str) -> None:
        self._append({"kind": "logged", "cell": cell, "scenario": scenario})


class CellRecord:
    """One cell's MLflow run (found again by its key when the invocation resumes)."""

    def __init__(self, client, experiment_id: str, key: str, name: str, tags: dict[str, str]):
        from mlflow_ngraph.tracking import mlflow_log as ml

        self.client = client
        self.ml = ml
        role = {S.T_ROLE: "loadgen", S.T_LOADGEN_KEY: key}
        self.run_id = ml.find_or_create_run(client, experiment_id, role, name, tags)
        client.update_run(self.run_id, status="RUNNING")

    def params(self, params: dict[str, Any]) -> None:
        self.ml.log_params_once(self.client, self.run_id, params)

    def engine(self, info: dict[str, Any]) -> None:
        """An engine's build (compile seconds, cache hit, output check) and the runtime's
        own settings, under its compile profile and batch size."""
        prefix = f"engine.{info['profile']}.bs{info['batch']}"
        metrics = [(f"{prefix}.{k}", v, 0) for k, v in info["metrics"].items()]
        params = {f"{prefix}.{k}": v for k, v in info["runtime"].items()}
        self.ml.log_batch(self.client, self.run_id, metrics=metrics)
        self.params(params)

    def result(self, scenario: str, result: ScenarioResult) -> None:
        """A scenario's verdict as tags, its figures as metrics when VALID, LoadGen's logs
        (and the Server search's steps) as artifacts."""
        tags = {validity_tag(scenario): result.validity}
        tags[reason_tag(scenario)] = (result.reason or "-")[:4000]
        metrics = [(k, v, 0) for k, v in result.figures.items()] if result.valid else []
        self.ml.log_batch(self.client, self.run_id, metrics=metrics, tags=tags)
        logs = Path(str(result.details.get("logs", "")))
        for name in (SUMMARY_FILE, DETAIL_FILE):
            if (logs / name).is_file():
                self.client.log_artifact(self.run_id, str(logs / name), f"loadgen/{scenario}")
        if "search" in result.details:
            self.client.log_dict(self.run_id, result.details["search"],
                                 f"loadgen/{scenario}/search.json")  # fmt: skip

    def failed(self, scenario: str, reason: str) -> None:
        tags = {validity_tag(scenario): "FAILED", reason_tag(scenario): reason[:4000]}
        self.ml.log_batch(self.client, self.run_id, tags=tags)

    def finish(self, status: str = "FINISHED") -> None:
        self.ml.finish(self.client, self.run_id, status)
