"""MetaSchedule tuning databases: seeding a build from ``--database`` or the cache, and
storing what a build tuned for the next compile of the same model, target and batch."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mlflow_ngraph.compilers.base import CompileContext
from mlflow_ngraph.compilers.tvm.settings import (
    CACHE_VERSION,
    DATABASE_DIR,
    RECORD_FILE,
    WORKLOAD_FILE,
)
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.scratch import put_in_place

log = logging.getLogger(__name__)


#: the files of a MetaSchedule JSON database
DATABASE_FILES = (WORKLOAD_FILE, RECORD_FILE)


def has_database(directory: Path) -> bool:
    return all((directory / name).is_file() for name in DATABASE_FILES)


def database_source(given: str | None) -> Path | None:
    """The database directory the ``database`` flag names (a saved engine directory works too).

    Raises:
        NgraphError: the directory holds no MetaSchedule JSON database.
    """
    if not given:
        return None
    source = Path(given).expanduser()
    if (source / DATABASE_DIR).is_dir() and not has_database(source):
        source = source / DATABASE_DIR
    if not has_database(source):
        raise NgraphError(
            f"compiler 'tvm': database={given!r} has no {WORKLOAD_FILE} and {RECORD_FILE}"
        )
    return source


def seed_database(database_dir: Path, given: str | None, cache_dir: Path | None) -> str:
    """Copy an existing database into the work dir. Returns "flag", "cache" or ""."""
    database_dir.mkdir(parents=True, exist_ok=True)
    source = database_source(given)
    if source is not None:
        copy_database(source, database_dir)
        log.info("TVM: reusing the tuning database %s", source)
        return "flag"
    if cache_dir is not None and _copy_cached(cache_dir, database_dir):
        log.info("TVM: tuning database cache hit %s", cache_dir)
        return "cache"
    return ""


def _copy_cached(cache_dir: Path, database_dir: Path, tries: int = 3) -> bool:
    """Copy the cache's entry into ``database_dir``; False where there is none. An entry
    another tuner replaced as it was read is whole again at once (looked at again); one a
    prune removed is a miss."""
    from mlflow_ngraph.cache import touch

    for _ in range(tries):
        if not has_database(cache_dir):
            return False
        touch(cache_dir)  # its last use: a prune beside this run keeps it
        try:
            copy_database(cache_dir, database_dir)
            return True
        except FileNotFoundError:  # the entry went between the look and the copy
            continue
    log.info("TVM: the tuning database cache %s kept changing as it was read", cache_dir)
    return False


def copy_database(source: Path, destination: Path) -> None:
    """Both files of the database in ``source`` into ``destination``, one tuning's: they are
    opened through one handle on the folder before either is read, so an entry replaced
    whole meanwhile (:func:`store_in_cache`) gives all old or all new files, never the
    workloads of one tuning beside the records of another (records name workloads by their
    line). Raises FileNotFoundError, nothing written, where the folder went first."""
    if not destination.is_dir():
        raise NotADirectoryError(f"no folder {destination} to copy a tuning database into")
    folder = os.open(source, os.O_RDONLY | os.O_DIRECTORY)

    def opener(path: str, flags: int) -> int:
        return os.open(path, flags, dir_fd=folder)

    try:
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(n, "rb", opener=opener)) for n in DATABASE_FILES]
            for name, handle in zip(DATABASE_FILES, files):
                with open(destination / name, "wb") as out:
                    shutil.copyfileobj(handle, out)
    finally:
        os.close(folder)


def cache_dir_for(
    model: Any, target: Any, flags: dict[str, Any], ctx: CompileContext
) -> Path | None:
    """Where the database of exactly this tuning (model, target, batch, budget) is cached."""
    if not flags["trials"] or not getattr(model, "content_hash", ""):
        return None
    import tvm

    key = {
        "version": CACHE_VERSION,
        "tvm": tvm.__version__,
        "model": model.content_hash,
        "target": str(target),
        "batch": ctx.batch_size,
        **{k: flags[k] for k in ("trials", "trials_per_task", "early_stopping", "timeout")},
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(ctx.cache_dir) / "tvm-tuning" / digest


def store_in_cache(database_dir: Path, cache_dir: Path) -> None:
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir.parent, prefix=".tmp-"))
    try:
        (tmp / "new").mkdir()
        copy_database(database_dir, tmp / "new")
        # the one there is set aside whole, never removed file by file under a reader, and
        # a second tuner's entry renamed in meanwhile is set aside the same way
        put_in_place(tmp / "new", cache_dir, tmp)
    except OSError as exc:  # a cache that cannot be written only costs a re-tune later
        log.warning("TVM: could not cache the tuning database in %s: %s", cache_dir, exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_database(database_dir: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    database_dir.mkdir(parents=True, exist_ok=True)
    return ms.database.JSONDatabase(
        path_workload=str(database_dir / WORKLOAD_FILE),
        path_tuning_record=str(database_dir / RECORD_FILE),
        allow_missing=True,
    )
