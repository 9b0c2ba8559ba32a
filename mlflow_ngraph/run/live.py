"""What a benchmark shows while it runs.

The terminal shows results, not machinery: :class:`PlainView` prints one line per finished
cell (``[k/N] ...``: each batch size's figures, its stability folded in, a failure with its
reason), while the compiling, loading and re-measuring lines go to the run's log file in the
home (and to the terminal with ``-v``: :func:`mlflow_ngraph.console.open_log_file`). It
suits logs, CI and ``mlflow run``; :class:`LiveView` (a terminal) keeps one ``rich``
display up to date: cell k of N, the current model, compiler, batch size and phase, the
last results, the elapsed time and an estimate of what is left. Both write to stderr (and
the log file); the summary table is stdout's.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from mlflow_ngraph.console import to_log_file
from mlflow_ngraph.measure.stability import short_reason


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


#: the longest failure reason a cell's line carries (the log file has it whole)
REASON_CHARS = 160


def _clip(text: str, limit: int = REASON_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _result(row) -> str:
    """One batch size of a cell: its throughput and interval, its speedup, and its
    stability folded in (``UNSTABLE (interval +-12.0%, host contended)``)."""
    text = f"bs{row.batch_size} {row.throughput:.1f}/s"
    low, high = getattr(row, "ci_low", None), getattr(row, "ci_high", None)
    if low is not None and high is not None:
        text += f" [{low:.1f}-{high:.1f}]"
    speedup = getattr(row, "speedup", None)
    if speedup is not None and row.compiler != "identity":
        text += f" {speedup:.2f}x"
    if row.status != "OK":
        text += f" {row.status}" + (f" ({_clip(row.note, 80)})" if row.note else "")
    note = short_reason(getattr(row, "stability_note", "") or "")
    if row.stable is False:
        text += f" UNSTABLE ({note})" if note else " UNSTABLE"
    elif note:
        text += f" ({note})"
    return text


def cell_results(rows) -> str:
    """A cell's batch sizes on one line: each measured one as :func:`_result` gives it, the
    ones that failed for one reason together (``bs1,2 FAILED: the reason``)."""
    parts: list[str] = []
    failed: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        if row.throughput is not None:
            parts.append(_result(row))
            continue
        key = (row.status, row.note or "")
        if key not in failed:
            parts.append(key)  # its place: filled once every batch size of it is known
        failed.setdefault(key, []).append(row.batch_size)
    out = []
    for part in parts:
        if isinstance(part, tuple):
            sizes = ",".join(str(b) for b in failed[part])
            part = f"bs{sizes} {part[0]}" + (f": {_clip(part[1])}" if part[1] else "")
        out.append(part)
    return ", ".join(out) or "nothing to measure"


def _opening(cells: int, estimate) -> str:
    """The run's one opening line: its cells and the estimate, with what it rests on."""
    if not estimate.items:
        return f"{cells} cells, every one measured before"
    return f"{cells} cells to run; {estimate.said()}"


class PlainView:
    """One line per finished cell on stderr."""

    def __init__(self, total_cells: int, stream=None) -> None:
        self.estimate = None  # the run's Estimate, once it starts
        self.total = total_cells
        self.done = 0
        self.began = time.monotonic()
        self.stream = stream
        self.rows: list[Any] = []
        self.current: dict[str, Any] = {}

    def _write(self, text: str) -> None:
        print(text, file=self.stream or sys.stderr, flush=True)
        to_log_file(text, name=__name__)

    def start(self, estimate) -> None:
        """The run starts; ``estimate`` (:class:`~mlflow_ngraph.plan.estimate.Estimate`) says
        what is left from now on."""
        self.estimate = estimate
        self._write(_opening(self.total, estimate))

    def cell_started(self, name: str) -> None:
        self.current = {"cell": name, "batch": None, "phase": "start"}
        self.rows = []

    def phase(self, batch_size: int, phase: str) -> None:
        self.current.update(batch=batch_size, phase=phase)

    def row(self, row) -> None:
        self.rows.append(row)

    def left_s(self) -> float | None:
        if self.estimate is not None:
            return self.estimate.left_s()
        if not self.done:
            return None
        return (time.monotonic() - self.began) / self.done * (self.total - self.done)

    def cell_done(self, name: str, rows=None) -> None:
        """``rows``: the cell's own results (cells measured together share the view)."""
        self.done += 1
        left = self.left_s()
        results = cell_results(self.rows if rows is None else rows)
        tail = f"; about {duration(left)} left" if left is not None and left > 0 else ""
        self._write(
            f"[{self.done}/{self.total}] {name}: {results} "
            f"({duration(time.monotonic() - self.began)} elapsed{tail})"
        )

    def stop(self) -> None:
        pass


class LiveView(PlainView):
    """A ``rich`` live display on a terminal."""

    def __init__(self, total_cells: int) -> None:
        super().__init__(total_cells)
        from rich.console import Console
        from rich.live import Live

        self.console = Console(stderr=True)
        self.last: list[str] = []
        self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)

    def _render(self):
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 2))
        left = self.left_s()
        table.add_row(
            f"[bold]cell {min(self.done + 1, self.total)}/{self.total}[/]",
            f"{self.current.get('cell', '')}",
            f"bs{self.current['batch']}" if self.current.get("batch") else "",
            f"[cyan]{self.current.get('phase', '')}[/]",
        )
        table.add_row(
            "elapsed",
            duration(time.monotonic() - self.began),
            "left",
            "-" if left is None else f"~{duration(left)}",
        )
        for line in self.last[-4:]:  # a name or reason in brackets is no markup
            table.add_row("done", Text(line), "", "")
        return table

    def start(self, estimate) -> None:
        self.estimate = estimate
        self.console.print(_opening(self.total, estimate), markup=False)
        to_log_file(_opening(self.total, estimate), name=__name__)
        self.live.start()

    def _refresh(self) -> None:
        self.live.update(self._render())

    def cell_started(self, name: str) -> None:
        super().cell_started(name)
        self._refresh()

    def phase(self, batch_size: int, phase: str) -> None:
        super().phase(batch_size, phase)
        self._refresh()

    def cell_done(self, name: str, rows=None) -> None:
        self.done += 1
        results = cell_results(self.rows if rows is None else rows)
        self.last.append(f"{name}: {results}")
        line = f"[{self.done}/{self.total}] {name}: {results}"
        self.console.print(line, markup=False)
        to_log_file(line, name=__name__)
        self._refresh()

    def stop(self) -> None:
        self.live.stop()


def make_view(total_cells: int, quiet: bool) -> PlainView:
    """A live display on a terminal, else (and with ``-q``) plain lines."""
    if not quiet and sys.stderr.isatty():
        return LiveView(total_cells)
    return PlainView(total_cells)


def notify(view: PlainView | None, method: str, *args: Any) -> None:
    """``view.method(*args)`` where the run has a view (``None``: it shows nothing)."""
    if view is not None:
        getattr(view, method)(*args)
