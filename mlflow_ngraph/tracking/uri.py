"""Whether a tracking URI can be used, said before any run is created: a scheme no MLflow
store handles, a malformed database URL, a local sqlite file in a folder this process cannot
write. Every command checks the URI it will write to or read from."""

from __future__ import annotations

import re
from pathlib import Path

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.plan.config import unwritable
from mlflow_ngraph.tracking.mlflow_log import local_sqlite, redact_uri
from mlflow_ngraph.tracking.mlflow_private import database_schemes

#: tracking URI schemes MLflow opens itself (databases go through SQLAlchemy)
_MLFLOW_SCHEMES = ("", "file", "http", "https", "databricks", "databricks-uc", "uc")


def check_tracking_uri(uri: str) -> None:
    """Refuse a URI whose scheme no MLflow tracking store handles (a typo such as
    ``htp://``), before any run is created.

    Raises:
        NgraphError: the scheme is unknown.
    """
    import importlib.metadata

    shown = redact_uri(uri)
    scheme = uri.partition("://")[0] if "://" in uri else ""
    base = scheme.split("+")[0].lower()
    plugins = {e.name for e in importlib.metadata.entry_points(group="mlflow.tracking_store")}
    known = {*_MLFLOW_SCHEMES, *database_schemes(), *plugins}
    bare = re.match(r"([A-Za-z][A-Za-z0-9+.-]+):(?!//)", uri)  # ``sqlite:/x.db``
    if not scheme and bare and bare.group(1).split("+")[0].lower() in known - {""}:
        raise NgraphError(
            f"tracking URI {shown!r} is malformed: {bare.group(1)}: is followed by // (e.g. "
            "sqlite:///mlflow.db for a file here, sqlite:////abs/path.db, "
            "http://127.0.0.1:5000); fix --tracking-uri / MLFLOW_TRACKING_URI"
        )
    if base in database_schemes():
        _check_database_url(uri)
    if base not in known:
        raise NgraphError(
            f"tracking URI {shown!r} has an unknown scheme {scheme!r} (known: "
            f"{', '.join(sorted(s for s in known if s))}); fix --tracking-uri / "
            "MLFLOW_TRACKING_URI"
        )
    path = local_sqlite(uri)
    if path is not None:
        _check_store_file(path, uri)


def _check_database_url(uri: str) -> None:
    """Raises: NgraphError: a database URI SQLAlchemy cannot read."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
        if url.get_backend_name() == "sqlite" and (url.host or not url.database):
            raise ValueError("a sqlite URI names a file after three slashes, not a host")
    except (ArgumentError, ValueError) as exc:
        raise NgraphError(
            f"tracking URI {redact_uri(uri)!r} is malformed ({redact_uri(str(exc))}): e.g. "
            "sqlite:///mlflow.db, "
            "postgresql://user@127.0.0.1:5432/db; fix --tracking-uri / MLFLOW_TRACKING_URI"
        ) from None


def _check_store_file(path: Path, uri: str) -> None:
    """A local sqlite store must be a file (or not exist yet) in a folder this process can
    write (sqlite writes its journal beside the file); otherwise MLflow retries the
    connection for minutes before it gives up."""
    fix = "point --tracking-uri / MLFLOW_TRACKING_URI at a writable file"
    shown = redact_uri(uri)
    if path.is_dir():
        raise NgraphError(f"tracking store {shown!r} is a folder, not an sqlite file: {fix}")
    folder = path.parent
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise NgraphError(
                    f"tracking store {shown!r} lies under {str(parent)!r}, which is a file: {fix}"
                )
            break
    problem = unwritable(folder)
    if problem:
        raise NgraphError(
            f"tracking store {shown!r}: its folder {str(folder)!r} cannot be written "
            f"({problem}): {fix}"
        )
