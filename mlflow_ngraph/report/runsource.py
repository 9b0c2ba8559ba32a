"""Fetch runs from a tracking store as plain dicts, as fast as the store allows.

A tracking server (``http(s)://``) is asked through MLflow's REST search endpoint with MLflow's
own request helper (so auth, TLS and retries follow the MLflow environment variables), and the
JSON answer is read directly: turning 10,000 runs into protobuf messages and then into
MLflow entities costs the client more than the server's search. The search is split into 16
shards by the first hex digit of the run id and the shards are fetched in parallel, so a
server with several workers searches on several cores. Any other store (a sqlite or
PostgreSQL URI used directly, a file store) goes through ``MlflowClient.search_runs``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from mlflow.entities import Run, ViewType
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

SEARCH_ENDPOINT = "/api/2.0/mlflow/runs/search"
#: run ids are uuid4 hex strings, so their first digit splits runs into 16 even shards
HEX_SHARDS = tuple(f"attributes.run_id LIKE '{digit}%'" for digit in "0123456789abcdef")
#: parallel shard requests: the server's default worker count (``mlflow server -w 4``)
SHARD_THREADS = 4


@dataclass(frozen=True)
class RunData:
    """What the report reads of a run."""

    run_id: str
    experiment_id: str
    start_time: int
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    status: str = ""  # the run's MLflow status (RUNNING, FINISHED, KILLED, ...)
    artifact_uri: str | None = None


def from_entity(run: Run) -> RunData:
    info, data = run.info, run.data
    return RunData(
        info.run_id,
        info.experiment_id,
        info.start_time or 0,
        dict(data.params),
        dict(data.tags),
        dict(data.metrics),
        info.status or "",
        info.artifact_uri,
    )


def from_record(record: dict) -> RunData:
    """A run of a results index (:mod:`mlflow_ngraph.tracking.index`)."""
    return RunData(
        run_id=record["run_id"],
        experiment_id=str(record["experiment_id"]),
        start_time=int(record.get("start_time") or 0),
        params=record["params"],
        tags=record["tags"],
        metrics={k: float(v) for k, v in record["metrics"].items()},
    )


def from_json(run: dict) -> RunData:
    """A run of the REST search answer (proto3 JSON: int64 may come as strings, NaN as
    ``"NaN"``)."""
    info, data = run["info"], run.get("data", {})
    return RunData(
        run_id=info.get("run_id") or info["run_uuid"],
        experiment_id=str(info["experiment_id"]),
        start_time=int(info.get("start_time") or 0),
        params={p["key"]: p.get("value", "") for p in data.get("params", [])},
        tags={t["key"]: t.get("value", "") for t in data.get("tags", [])},
        metrics={m["key"]: float(m.get("value", "nan")) for m in data.get("metrics", [])},
        status=info.get("status", ""),
        artifact_uri=info.get("artifact_uri"),
    )


class Searcher:
    """Searches one store: ``search(experiment_ids, filter_string)`` -> every matching run."""

    shards: tuple[str, ...] = ("",)
    threads: int = 1

    def __init__(self, client: MlflowClient, page: int) -> None:
        self.client = client
        self.page = page

    def search(self, experiment_ids: list[str], filter_string: str) -> list[RunData]:
        out, token = [], None
        while True:
            runs = self.client.search_runs(
                experiment_ids,
                filter_string,
                ViewType.ACTIVE_ONLY,
                max_results=self.page,
                page_token=token,
            )
            out += [from_entity(run) for run in runs]
            token = runs.token
            if not token:
                return out

    def search_all(
        self, experiment_ids: list[str], filters: list[str], shard: bool = True
    ) -> list[RunData]:
        """Every run matching any of ``filters`` (disjoint), each split into shards unless
        ``shard`` is false (filters that match few runs each)."""
        shards = self.shards if shard else ("",)
        sharded = [" and ".join(p for p in (f, s) if p) for f in filters for s in shards]
        if self.threads == 1 or len(sharded) == 1:
            return [run for f in sharded for run in self.search(experiment_ids, f)]
        with ThreadPoolExecutor(self.threads) as pool:
            pages = pool.map(lambda f: self.search(experiment_ids, f), sharded)
            return [run for page in pages for run in page]


class RestSearcher(Searcher):
    """Searches a tracking server through its REST API, reading the JSON answer directly."""

    shards = HEX_SHARDS
    threads = SHARD_THREADS

    def __init__(self, client: MlflowClient, page: int, host_creds: Callable) -> None:
        super().__init__(client, page)
        self.host_creds = host_creds

    def search(self, experiment_ids: list[str], filter_string: str) -> list[RunData]:
        from mlflow_ngraph.tracking.mlflow_private import rest_post

        out, token = [], None
        while True:
            body = {
                "experiment_ids": experiment_ids,
                "filter": filter_string,
                "run_view_type": "ACTIVE_ONLY",
                "max_results": self.page,
            }
            if token:
                body["page_token"] = token
            answer = json.loads(rest_post(self.host_creds(), SEARCH_ENDPOINT, body))
            out += [from_json(run) for run in answer.get("runs", [])]
            token = answer.get("next_page_token")
            if not token:
                return out


def searcher_for(client: MlflowClient, page: int) -> Searcher:
    """The fastest searcher for the client's store."""
    from mlflow_ngraph.tracking.mlflow_private import rest_host_creds

    creds = rest_host_creds(client)
    if creds is None:
        return Searcher(client, page)
    return RestSearcher(client, page, creds)
