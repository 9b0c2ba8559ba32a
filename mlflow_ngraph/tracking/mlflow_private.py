"""The one home of every MLflow API this tool uses that MLflow does not publish.

Each is a speed-up or a check with no public equivalent: the REST store's credentials (to
read ``runs/search`` answers as JSON rather than as entities, ~3x faster on 10,000 runs), the
single-file artifact download (to fetch one results index without listing the run's
artifacts), and the list of database schemes a tracking URI may use. They were written
against the MLflow majors in ``TESTED_MAJORS``; on another one a warning says so once, and
every caller keeps a public fallback for when an attribute is gone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

#: MLflow majors these private uses were written and tested against
TESTED_MAJORS = (3,)
#: what MLflow accepts besides database URIs and plugins, should its private list be gone
FALLBACK_DATABASE_SCHEMES = ("postgresql", "mysql", "sqlite", "mssql")


@functools.cache
def check_version() -> bool:
    """``True`` on a tested MLflow major; otherwise warn once and return ``False``."""
    import mlflow

    try:
        major = int(mlflow.__version__.split(".")[0])
    except ValueError:  # pragma: no cover - a development build
        return False
    if major in TESTED_MAJORS:
        return True
    log.warning(
        "MLflow %s is untested here (tested: %s.x): private MLflow APIs may have moved; the "
        "public fallbacks are used where they have",
        mlflow.__version__,
        ", ".join(map(str, TESTED_MAJORS)),
    )
    return False


def database_schemes() -> tuple[str, ...]:
    """The database engines a ``<engine>[+driver]://`` tracking URI may name."""
    check_version()
    try:
        from mlflow.store.db.db_types import DATABASE_ENGINES
    except ImportError:  # pragma: no cover - a future MLflow
        return FALLBACK_DATABASE_SCHEMES
    return tuple(DATABASE_ENGINES)


def rest_host_creds(client: Any) -> Callable | None:
    """The REST store's credentials provider of an ``MlflowClient``, or ``None`` for a store
    that is not REST (or an MLflow where the client's store is out of reach)."""
    check_version()
    from mlflow.store.tracking.rest_store import RestStore

    try:
        store = client._tracking_client.store  # no public accessor for the client's store
    except AttributeError:  # pragma: no cover - a future MLflow: fall back to the client
        return None
    return store.get_host_creds if isinstance(store, RestStore) else None


def rest_post(host_creds: Any, endpoint: str, body: dict) -> str:
    """POST ``body`` to a REST endpoint of the tracking server; the answer's text. MLflow's
    own request helper: its retries, auth headers and TLS settings."""
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    response = http_request(host_creds, endpoint, "POST", json=body)
    return verify_rest_response(response, endpoint).text


def download_artifact_file(tracking_uri: str, artifact_uri: str, name: str, path: str) -> bool:
    """Fetch one artifact file ``name`` of the artifact root ``artifact_uri`` into ``path``
    without listing the root; ``False`` when the repository has no single-file download, so
    the caller takes the public route."""
    check_version()
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    repo = get_artifact_repository(artifact_uri, tracking_uri=tracking_uri)
    download = getattr(repo, "_download_file", None)
    if download is None:  # pragma: no cover - an MLflow without it
        return False
    download(name, path)
    return True
