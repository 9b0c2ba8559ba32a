"""What every command of the command line shares: the home, logging to the terminal, a spec
file's options under the command line's, and SIGTERM taken as Ctrl-C."""

from __future__ import annotations

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


def setup_logging(verbose: int) -> None:
    redact_log_records()
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose >= 0 else logging.WARNING
    handler = _StderrHandler()
    handler.setFormatter(_VisibleFormatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    root = logging.getLogger("mlflow_ngraph")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    for noisy in ("mlflow", "alembic", "torch", "onnxscript", "onnx_ir", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    store_log = logging.getLogger("mlflow.store.db.utils")
    if not any(isinstance(f, _RaisedNext) for f in store_log.filters):
        store_log.addFilter(_RaisedNext())
    # torch.onnx and timm warn about deprecations on every export; they are not the user's.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


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
