"""What every command of the command line shares: the home, logging to the terminal, a spec
file's options under the command line's, and SIGTERM taken as Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from importlib import resources
from pathlib import Path
from typing import Any

from mlflow_ngraph.redaction import redact_log_records
from mlflow_ngraph.text import visible_lines


def default_home() -> Path:
    """Where engines, exports and resume journals are kept (``MLFLOW_NGRAPH_HOME``)."""
    return Path(os.environ.get("MLFLOW_NGRAPH_HOME") or Path.home() / ".cache" / "mlflow-ngraph")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not the stream it was
    created with (which an embedding program or a test harness may since have closed)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _VisibleFormatter(logging.Formatter):
    """A record's lines with every control and format character in them shown as an escape
    (:func:`~mlflow_ngraph.text.visible_lines`): a value from the store in a message cannot
    send the terminal an escape sequence."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return visible_lines(super().formatMessage(record))


#: the level of a run's machinery: compiling, loading, re-measuring, each sitting. It goes
#: to the run's log file always and to the terminal with ``-v``; the terminal's own lines are
#: the results (one per cell), the summary and what needs a person (INFO and above).
DETAIL = 15
logging.addLevelName(DETAIL, "DETAIL")
#: how many log files of earlier invocations the home keeps (``logs/*-<command>.log``)
KEEP_LOGS = 20
_NOISY = ("mlflow", "alembic", "torch", "onnxscript", "onnx_ir", "urllib3")


def terminal_level(verbose: int) -> int:
    """``-q`` (verbose -1): warnings and errors; none: INFO; ``-v``: the run's machinery
    (:data:`DETAIL`) too; ``-vv``: everything (DEBUG)."""
    if verbose < 0:
        return logging.WARNING
    return (logging.INFO, DETAIL)[verbose] if verbose < 2 else logging.DEBUG


def setup_logging(verbose: int) -> None:
    redact_log_records()
    handler = _StderrHandler()
    handler.setLevel(terminal_level(verbose))
    handler.setFormatter(_VisibleFormatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    root = logging.getLogger("mlflow_ngraph")
    for old in root.handlers:  # a log file of an earlier command in this process
        if isinstance(old, logging.FileHandler):
            old.close()
    root.handlers[:] = [handler]
    root.setLevel(handler.level)
    root.propagate = False
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # MLflow sets its own logger's level again when it is imported: its store's INFO lines
    # ("Creating initial MLflow database tables") are kept off by their logger's own level
    store_log = logging.getLogger("mlflow.store.db.utils")
    store_log.setLevel(logging.WARNING)
    if not any(isinstance(f, _RaisedNext) for f in store_log.filters):
        store_log.addFilter(_RaisedNext())
    # torch.onnx and timm warn about deprecations on every export; they are not the user's.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def open_log_file(home: Path, command: str, say: bool = True) -> Path | None:
    """Every record of this invocation, the machinery's included, with its date and logger,
    to ``<home>/logs/<timestamp>-<command>.log``, said in one line on stderr (unless not
    ``say``: ``-q``) so a person can ``tail -f`` it; the oldest such files beyond
    :data:`KEEP_LOGS` are removed. None (and nothing said) where the home cannot hold it:
    the home's own check says why."""
    import time

    folder = Path(home) / "logs"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{stamp}-{command}.log"
        for n in range(2, 100):
            if not path.exists():
                break
            path = folder / f"{stamp}-{command}-{n}.log"
        handler = _LogFile(path, encoding="utf-8")
    except OSError:
        return None
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(_VisibleFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("mlflow_ngraph")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    _prune_logs(folder, path)
    to_log_file(log_file_line(path), name=__name__)
    if say:
        say_log_file(path)
    return path


def log_file_line(path: Path) -> str:
    return f"log: {visible_lines(str(path))} (every step; -v shows them here too)"


def say_log_file(path: Path | None) -> None:
    """The log file's path on stderr, once the command's settings were found good (a bad
    option stays one line)."""
    if path is not None:
        print(log_file_line(path), file=sys.stderr, flush=True)


class _LogFile(logging.FileHandler):
    """The invocation's log file. A write that fails (the disk filled up, the home went
    away) drops the file for the rest of the run instead of printing logging's traceback:
    the terminal and the journal still carry what matters, and the failure that filled the
    disk is said by the command as one line."""

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        logging.getLogger("mlflow_ngraph").removeHandler(self)
        with contextlib.suppress(OSError, ValueError):
            self.close()


def to_log_file(text: str, level: int = logging.INFO, name: str = "mlflow_ngraph") -> None:
    """``text`` to the invocation's log file only (if one is open): what the terminal got
    another way (a cell's line, the summary, the closing error) is in the file too."""
    root = logging.getLogger("mlflow_ngraph")
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    if files:
        record = logging.getLogger(name).makeRecord(name, level, "", 0, "%s", (text,), None)
        for handler in files:
            handler.handle(record)


def _prune_logs(folder: Path, current: Path) -> None:
    """The invocations' log files beyond the newest :data:`KEEP_LOGS` removed (a cell's
    ``logs/<key>/worker.log`` is its run's artifact, not one of them)."""
    import re

    named = re.compile(r"^\d{8}-\d{6}-[\w-]+\.log$")
    found = []
    for path in folder.iterdir():
        with contextlib.suppress(OSError):  # one removed beside this by another run
            if named.match(path.name) and path.is_file():
                found.append((path.stat().st_mtime_ns, path.name, path))
    found.sort()
    for *_, old in found[: max(0, len(found) - KEEP_LOGS)]:
        if old != current:
            with contextlib.suppress(OSError):
                old.unlink()


class _RaisedNext(logging.Filter):
    """Drops a record that carries a traceback. MLflow's database store logs a database
    error with its traceback, then raises it; this CLI says what it means in one line (a
    store error, or Ctrl-C when the interrupt landed in the store's commit)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.exc_info


def resolve_spec_path(value: str) -> Path:
    """A spec file path, or the name of a packaged experiment (``default``, ``paper``...)."""
    path = Path(value)
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return path
    packaged = resources.files("mlflow_ngraph") / "experiments" / f"{value}.yaml"
    if packaged.is_file():
        return Path(str(packaged))
    return path


def split_multi(values: tuple[str, ...]) -> list[str]:
    """``--model a --model b`` and ``--model "a b"`` both give [a, b]: the MLproject passes
    list params as one space-separated string."""
    return [item for value in values for item in value.split() if item]


def merge_options(file_data: dict[str, Any], **options: Any) -> dict[str, Any]:
    """Command-line options override the spec file; ``None`` and empty lists mean unset."""
    data = dict(file_data)
    for key, value in options.items():
        if value is None or value == [] or value == ():
            continue
        data[key] = value
    return data


def interrupt(signum, frame) -> None:
    """SIGTERM ends a run as Ctrl-C does: the journal holds every measured result."""
    raise KeyboardInterrupt
