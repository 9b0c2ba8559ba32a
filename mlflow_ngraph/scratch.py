"""Work folders a command removes on every exit path, and the ones a kill left.

A command that needs a folder of its own for a while (``pull``'s download beside ``-o``,
``register``'s verified copy, ``serve``'s checked copy) takes it here. The folder holds a
lock file its process keeps locked while it lives; the kernel drops that lock when the
process dies, even by ``kill -9``. Every new folder first removes its unlocked siblings of
the same prefix: what a killed run of the same command left.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: the lock file inside a work folder
HOLD = ".ngraph-hold"
#: seconds a folder without its lock file is taken as being set up (not left by a kill)
GRACE_S = 60.0


def held(folder: Path) -> bool:
    """Whether a live process holds ``folder`` (a folder without a lock file counts as held
    while it is young: its process may be about to lock it)."""
    try:
        handle = open(folder / HOLD, "rb")
    except FileNotFoundError:
        try:
            return time.time() - folder.stat().st_mtime < GRACE_S
        except OSError:
            return True
    except OSError:  # another user's: not ours to judge
        return True
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return True
        return False


def sweep(parent: Path, prefix: str) -> list[Path]:
    """Remove the folders ``parent/<prefix>*`` no live process holds; the removed ones."""
    removed = []
    try:
        found = [p for p in Path(parent).iterdir() if p.name.startswith(prefix) and p.is_dir()]
    except OSError:
        return removed
    for folder in found:
        if not held(folder):
            shutil.rmtree(folder, ignore_errors=True)
            if not folder.exists():
                removed.append(folder)
                log.info("removed %s, left by a killed run", folder)
    return removed


@contextlib.contextmanager
def work_folder(parent: Path | str | None, prefix: str) -> Iterator[Path]:
    """A new folder ``parent/<prefix>XXXX`` (``parent`` None: the system's temp folder),
    held while the block runs and removed when it ends, however it ends (a kill: by the
    next one)."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    sweep(parent, prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        # locked under another name first, then renamed: a lock file seen before its lock
        # was taken read as a kill's leftover, and a sweep beside removed the live folder
        handle = open(path / f"{HOLD}.new", "wb")
        fcntl.flock(handle, fcntl.LOCK_EX)
        os.rename(path / f"{HOLD}.new", path / HOLD)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    try:
        yield path
    finally:
        handle.close()
        shutil.rmtree(path, ignore_errors=True)


def put_in_place(fresh: Path, target: Path, aside: Path, keep=None, tries: int = 8) -> Path:
    """Rename the folder ``fresh`` to ``target`` whole. Where one is there already (another
    writer of the same thing), it is renamed into ``aside`` (a folder the caller removes)
    and the rename tried again, unless ``keep(target)`` says the one there stays. After
    ``tries`` the one there stays: other writers kept replacing it, and theirs is as good."""
    for i in range(tries):
        try:
            fresh.rename(target)
            return target
        except OSError:  # there already
            if keep is not None and keep(target):
                return target
            with contextlib.suppress(FileNotFoundError):  # another just set it aside
                target.rename(aside / f"old-{i}")
    return target
