"""``mlflow-ngraph cache``: what the home's caches hold, and pruning them.

The home (``--home``, ``MLFLOW_NGRAPH_HOME``, ``~/.cache/mlflow-ngraph``) keeps, besides the
resume journals, caches that only save time: compiled engines (one directory per model,
compiler, flags, batch size and device: the default experiment leaves about 2 GB), ONNX
exports, eager reference outputs, TVM tuning databases and the compilers' scratch. Each can
be deleted: the next run that needs an entry builds it again. The journals (what a re-run
resumes from, and results not yet sent to the tracking store) and the timings (what the
time estimate learned) are never pruned here.

A prune beside a running benchmark or tune never takes what the run holds. Each run that
uses a home's caches holds a lock file under ``<home>/in-use/`` for its whole length
(:func:`in_use`; the kernel drops it when the run dies, even by ``kill -9``). While one is
held, a prune skips the entries used since the earliest such run began (a run touches an
entry each time it takes it from the cache) and the ``.tmp-*`` folders entries are being
written in, and says so; with none held, those ``.tmp-*`` folders are what a killed run
left, and go.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click

from mlflow_ngraph.errors import NgraphError

#: the caches of a home: folder -> what it holds (in the order shown)
PARTS = {
    "engines": "compiled engines, one folder per model x compiler x flags x batch size",
    "exports": "ONNX exports of the models",
    "references": "eager outputs the engines are checked against",
    "tvm-tuning": "TVM tuning databases",
    "work": "the compilers' scratch",
}
#: folders kept whatever is pruned: they hold results, what the estimate learned and the
#: host's history of its figures (measure/history.py: the spread between sittings)
KEPT = ("journals", "timings.json", "history")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: the folder of the runs' lock files (:func:`in_use`)
IN_USE = "in-use"
#: an entry is being written (``.tmp-*``): in use while a run holds the home, else left
WRITING = ".tmp-"
#: seconds of slack on a run's start (file times may lag the clock a little)
SLACK_S = 2.0


@dataclass
class Entry:
    """One cache entry (an engine's folder, an export, a reference file)."""

    part: str
    path: Path
    bytes: int
    used: float  # when it was last written or, for an engine, last taken from the cache


def size_text(count: float) -> str:
    """``1.9 GB``, ``340 MB``, ``12 KB``."""
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit in ("B", "KB") else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GB"  # pragma: no cover - the loop returns


def parse_size(text: str) -> int:
    """``500M``, ``2G``, ``1.5GB``, ``100000`` (bytes) as bytes.

    Raises:
        NgraphError: not a size.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise NgraphError(f"--max-size {text!r} is not a size: expected e.g. 500M or 2G")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass
class User:
    """A run holding a home's caches."""

    pid: int
    since: float
    what: str

    def __str__(self) -> str:
        clock = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.what} (pid {self.pid}, since {clock})"


@contextlib.contextmanager
def in_use(home: Path, what: str) -> Iterator[None]:
    """Hold ``home``'s caches while the block runs (a prune beside it skips what it uses).
    A home whose lock cannot be written is used without one (nothing to protect there)."""
    folder = Path(home) / IN_USE
    path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(path, "w")
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.write(json.dumps({"pid": os.getpid(), "since": time.time(), "what": what}))
        handle.flush()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        handle.close()


def users(home: Path) -> list[User]:
    """The live runs holding ``home``'s caches (the lock files of dead ones are removed)."""
    out = []
    folder = Path(home) / IN_USE
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        try:
            with open(path) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    info = json.loads(handle.read() or "{}")
                    since = float(info.get("since") or path.stat().st_mtime)
                    out.append(User(int(info.get("pid", 0)), since, str(info.get("what", "a run"))))
                    continue
            path.unlink(missing_ok=True)  # its run died: nothing holds it
        except (OSError, ValueError):
            continue
    return out


def touch(path: Path) -> None:
    """Mark a cache entry used now (a prune beside the run that uses it keeps it)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def entries(home: Path) -> list[Entry]:
    """Every entry of the home's caches (the journals and timings are none)."""
    out = []
    for part in PARTS:
        folder = home / part
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            try:
                out.append(Entry(part, path, _bytes(path), path.stat().st_mtime))
            except OSError:  # removed meanwhile (a run cleaning its scratch)
                continue
    return out


@dataclass
class Pruned:
    """What a prune removed, and what it left because a running run holds it."""

    removed: list[Entry]
    held: list[Entry]
    users: list[User]
    leftovers: int = 0  # ``.tmp-*`` folders killed runs left, removed


def prune(home: Path, max_bytes: int | None = None, older_than_s: float | None = None) -> Pruned:
    """Remove entries: those unused for ``older_than_s`` seconds, then the least recently
    used until the caches hold at most ``max_bytes``; with neither, all of them. What a
    running benchmark or tune holds (:func:`in_use`) is never removed."""
    running = users(home)
    busy_since = min((u.since for u in running), default=math.inf) - SLACK_S
    every = entries(home)
    held = [
        e for e in every if running and (e.path.name.startswith(WRITING) or e.used >= busy_since)
    ]
    leftovers = [e for e in every if e.path.name.startswith(WRITING) and e not in held]
    found = sorted((e for e in every if e not in held and e not in leftovers), key=lambda e: e.used)
    for entry in leftovers:
        _remove(entry.path)
    doomed: list[Entry] = []
    if max_bytes is None and older_than_s is None:
        doomed = found
    if older_than_s is not None:
        cutoff = time.time() - older_than_s
        doomed = [e for e in found if e.used < cutoff]
    if max_bytes is not None:
        total = sum(e.bytes for e in found if e not in doomed)
        for entry in found:
            if total <= max_bytes:
                break
            if entry not in doomed:
                doomed.append(entry)
                total -= entry.bytes
    for entry in doomed:
        _remove(entry.path)
    return Pruned(doomed, held, running, len(leftovers))


def _remove(path: Path) -> None:
    """Renamed first (a run that looks it up from now on misses it and builds it again),
    then deleted."""
    gone = path.with_name(f".pruned-{uuid.uuid4().hex[:8]}-{path.name}")
    try:
        os.replace(path, gone)
    except OSError:
        gone = path
    if gone.is_dir():
        shutil.rmtree(gone, ignore_errors=True)
    else:
        gone.unlink(missing_ok=True)


def summary(home: Path) -> str:
    """A table of the caches of ``home``: entries, size and what each part holds."""
    from mlflow_ngraph.table import format_table, terminal_width

    found = entries(home)
    rows = []
    for part, what in PARTS.items():
        mine = [e for e in found if e.part == part]
        rows.append((part, len(mine), size_text(sum(e.bytes for e in mine)), what))
    total = sum(e.bytes for e in found)
    kept = sum(_bytes(home / name) for name in KEPT if (home / name).exists())
    return "\n".join([
        f"caches in {home}: {size_text(total)} (journals, timings and history, never pruned: "
        f"{size_text(kept)})",
        format_table(["cache", "entries", "size", "holds"], rows, width=terminal_width()),
        "prune: `mlflow-ngraph cache --prune` (everything above), with --max-size 1G",
        "(the least recently used first) or --older-than 14 (days unused)",
    ])  # fmt: skip


@click.command("cache")
@click.option("--home", type=click.Path(path_type=Path), help="The home (default: the runs').")
@click.option("--prune", "do_prune", is_flag=True, help="Remove cache entries (see below).")
@click.option("--max-size", help="With --prune: keep the most recently used up to this, e.g. 1G.")
@click.option("--older-than", type=float, help="With --prune: remove what was unused N days.")
def cache_command(home: Path | None, do_prune: bool, max_size: str | None, older_than) -> None:
    """Show the size of the engine and export caches, or prune them.

    --prune alone removes every cached engine, export, reference output and scratch; the
    journals (resume, unsent results) and the timings of the estimate are kept. A run
    rebuilds what it needs. What a benchmark or tune running on the same home uses is
    kept, and said.
    """
    from mlflow_ngraph.console import default_home

    home = home or default_home()
    if (max_size or older_than is not None) and not do_prune:
        raise NgraphError("--max-size and --older-than say what --prune removes: add --prune")
    if older_than is not None and older_than < 0:
        raise NgraphError(f"--older-than must be a number of days >= 0, got {older_than:g}")
    if not do_prune:
        click.echo(summary(home))
        return
    limit = parse_size(max_size) if max_size else None
    done = prune(home, limit, None if older_than is None else older_than * 86400)
    freed = sum(e.bytes for e in done.removed)
    click.echo(f"removed {len(done.removed)} cache entries, {size_text(freed)} freed")
    if done.leftovers:
        click.echo(f"removed {done.leftovers} unfinished entries killed runs left")
    if done.held:
        runs = "; ".join(str(u) for u in done.users) or "a run"
        click.echo(
            f"kept {len(done.held)} entries ({size_text(sum(e.bytes for e in done.held))}) "
            f"in use by {runs}: prune again once it ends to remove them"
        )
    click.echo(summary(home))
