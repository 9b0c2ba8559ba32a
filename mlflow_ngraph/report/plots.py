"""The paper's figures from the compare DataFrame, as PNG files.

Every figure is drawn on its own :class:`matplotlib.figure.Figure` with the Agg canvas (no
pyplot state, no display needed) and carries a title, axis labels with units and a legend.
A figure whose data is absent is skipped, and :class:`PlotResult` says why.

- ``fig05_throughput_<device>.png``: throughput vs batch size per model, compilers as
  lines, identity dashed (Fig. 5).
- ``fig06_speedup.png``: speedup over identity per family x device, a line per compiler.
- ``fig07_depth_<block>.png``: block speedup vs depth per width x batch size.
- ``fig08_ase.png`` and ``fig09_bsr.png``: ASE and BSR vs batch size per family x device.
- ``fig10_ase_heatmap_<block>.png``: ASE over width x batch size per device x compiler x
  depth.
- ``fig12_cpu_<device>.png``: CPU usage (solid) and its reduction against identity
  (dashed) vs batch size per family.

Figures 5, 6 and 7 show their uncertainty: a bar of the 95% interval (throughput's, or the
speedup's paired interval) at every point that is one measurement, and a red ring around
every point that holds an UNSTABLE measurement (noise on its host: its interval too wide,
other processes took the CPU, or the host drifted).
"""

from __future__ import annotations

import logging
import re
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from mlflow_ngraph.report import tables
from mlflow_ngraph.report.tables import BLOCK_FAMILIES, IDENTITY

log = logging.getLogger(__name__)

#: inches per subplot: small enough for a 5 x 3 grid of the paper's models on one page
PANEL_W, PANEL_H = 3.4, 2.6
#: PNG resolution: sharp on screen, a few hundred kB per figure
DPI = 110
IDENTITY_STYLE = {"color": "black", "linestyle": "--", "marker": "o", "markersize": 3}
#: one color per compiler, the same in every figure
PALETTE = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
)
BATCH_AXIS = "batch size [samples]"
UNSTABLE = "UNSTABLE"
UNSTABLE_LABEL = "UNSTABLE (noise on this host)"
#: a ring around the point, drawn over the line and its interval bar
UNSTABLE_STYLE = {
    "s": 90,
    "facecolors": "none",
    "edgecolors": "red",
    "linewidths": 1.5,
    "zorder": 5,
    "label": UNSTABLE_LABEL,
}
THROUGHPUT_CI = ("throughput_ci_low", "throughput_ci_high")
SPEEDUP_CI = ("speedup_ci_low", "speedup_ci_high")


@dataclass
class PlotResult:
    """Files written and figures skipped (with the reason)."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _colors(frame: pd.DataFrame) -> dict[str, str]:
    """One color per compiler of the whole frame, so a compiler keeps it in every figure."""
    labels = sorted(set(frame["compiler_label"]) - {IDENTITY})
    return {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}


def _style(label: str, colors: dict[str, str]) -> dict:
    if label == IDENTITY:
        return dict(IDENTITY_STYLE)
    return {
        "color": colors.get(label, "tab:gray"),
        "linestyle": "-",
        "marker": "o",
        "markersize": 3,
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


#: characters of a figure's title per inch of its width (matplotlib's suptitle size, with a
#: margin): a longer title is wrapped, never cut at the figure's edges
TITLE_CHARS_PER_INCH = 9


def _grid(rows: int, cols: int, title: str) -> tuple[Figure, np.ndarray]:
    width = PANEL_W * cols + 1.6
    figure = Figure(figsize=(width, PANEL_H * rows + 0.9), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False)
    # wrapped to the panels' width: the legend takes the column on the right
    figure.suptitle(textwrap.fill(title, int(PANEL_W * cols * TITLE_CHARS_PER_INCH)))
    return figure, axes


def _batch_axis(ax: Axes, batch_sizes: Iterable[int]) -> None:
    ticks = sorted({int(b) for b in batch_sizes})
    if len(ticks) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(BATCH_AXIS)


def _legend(figure: Figure, handles: dict[str, Line2D]) -> None:
    """The figure's legend, the UNSTABLE ring last (after the compilers)."""
    if handles:
        ordered = sorted(handles, key=lambda label: label == UNSTABLE_LABEL)
        # beside the panels, centred: at the top it met a title wider than the panels
        labels = [handles[k] for k in ordered]
        figure.legend(labels, ordered, loc="outside right center", fontsize=8)


def _save(figure: Figure, path: Path, result: PlotResult) -> None:
    figure.savefig(path, dpi=DPI)
    result.written.append(path)


def _families(frame: pd.DataFrame) -> list[str]:
    return sorted(set(frame["family"]), key=tables.family_rank)


def _models(frame: pd.DataFrame) -> list[str]:
    """Model labels, smallest first (by parameter count when logged)."""
    if "parameter_count" in frame:
        sizes = frame.groupby("model_label")["parameter_count"].max()
        return sorted(sizes.index, key=lambda m: (np.nan_to_num(sizes[m], nan=np.inf), m))
    return sorted(set(frame["model_label"]))


def _lines(
    ax: Axes,
    data: pd.DataFrame,
    x: str,
    y: str,
    colors: dict,
    handles: dict,
    interval: tuple[str, str] | None = None,
    **override,
) -> None:
    """One line per compiler label: the mean of ``y`` at each ``x``, with the 95% interval
    (columns ``interval``) as bars where a point is one measurement, and a ring around
    every point that holds an UNSTABLE one."""
    if data[y].notna().sum() == 0:
        _no_data(ax)
        return
    for label in sorted(set(data["compiler_label"]), key=tables.compiler_rank):
        part = data[data["compiler_label"] == label]
        series = part.groupby(x)[y].mean().dropna()
        if series.empty:
            continue
        style = {**_style(label, colors), **override}
        (line,) = ax.plot(series.index.astype(float), series.values, label=label, **style)
        handles.setdefault(label, line)
        if interval is not None:
            _interval_bars(ax, part, x, y, interval, style["color"])
        _mark_unstable(ax, part, x, series, handles)


def _interval_bars(
    ax: Axes, part: pd.DataFrame, x: str, y: str, interval: tuple[str, str], color: str
) -> None:
    """Bars from the interval's columns at the points that are one measurement (a mean of
    several models has no interval of its own)."""
    low, high = interval
    if low not in part or high not in part:
        return
    counts = part.groupby(x)[y].transform("count")
    rows = part[(counts == 1) & part[y].notna() & part[low].notna() & part[high].notna()]
    if rows.empty:
        return
    values = rows[y].to_numpy(dtype=float)
    below = np.clip(values - rows[low].to_numpy(dtype=float), 0, None)
    above = np.clip(rows[high].to_numpy(dtype=float) - values, 0, None)
    ax.errorbar(
        rows[x].to_numpy(dtype=float),
        values,
        yerr=np.vstack([below, above]),
        fmt="none",
        ecolor=color,
        elinewidth=1,
        capsize=3,
        alpha=0.8,
    )


def _mark_unstable(ax: Axes, part: pd.DataFrame, x: str, series: pd.Series, handles: dict):
    """A red ring around each point of ``series`` that holds an UNSTABLE measurement."""
    if "stability" not in part:
        return
    flagged = set(part.loc[part["stability"] == UNSTABLE, x].dropna())
    points = series[series.index.isin(flagged)]
    if points.empty:
        return
    ring = ax.scatter(points.index.astype(float), points.values, **UNSTABLE_STYLE)
    handles.setdefault(UNSTABLE_LABEL, ring)


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def _models_data(frame: pd.DataFrame) -> pd.DataFrame:
    """Measured rows of the off-the-shelf (non-block) models."""
    measured = frame[tables.is_result(frame) & frame["batch_size"].notna()]
    return measured[~measured["family"].isin(BLOCK_FAMILIES)]


def plot_throughput(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 5: one file per device; a panel per model (columns: families)."""
    data = _models_data(frame)
    if data.empty:
        result.skipped.append("fig05 throughput: no throughput of non-block models")
        return
    colors = _colors(frame)
    for device, part in data.groupby("device"):
        families = _families(part)
        columns = {f: _models(part[part["family"] == f]) for f in families}
        rows = max(len(m) for m in columns.values())
        title = f"Throughput vs batch size on {device} (bars: 95% interval)"
        figure, axes = _grid(rows, len(families), title)
        handles: dict[str, Line2D] = {}
        for col, family in enumerate(families):
            for row in range(rows):
                ax = axes[row][col]
                if row >= len(columns[family]):
                    ax.set_visible(False)
                    continue
                model = columns[family][row]
                cell = part[part["model_label"] == model]
                _lines(ax, cell, "batch_size", "throughput", colors, handles, THROUGHPUT_CI)
                ax.set_title(f"{family}: {model}", fontsize=9)
                ax.set_ylabel("throughput [samples/s]")
                _batch_axis(ax, cell["batch_size"])
        _legend(figure, handles)
        _save(figure, out_dir / f"fig05_throughput_{_slug(str(device))}.png", result)


def _family_device_grid(
    data: pd.DataFrame,
    metric: str,
    title: str,
    ylabel: str,
    colors: dict[str, str],
    interval: tuple[str, str] | None = None,
) -> Figure:
    """Rows: devices; columns: families; a line per compiler of the family mean (with the
    ``interval`` columns' bars where the family has one model)."""
    devices, families = sorted(set(data["device"])), _families(data)
    figure, axes = _grid(len(devices), len(families), title)
    handles: dict[str, Line2D] = {}
    for r, device in enumerate(devices):
        for c, family in enumerate(families):
            ax = axes[r][c]
            cell = data[(data["device"] == device) & (data["family"] == family)]
            _lines(ax, cell, "batch_size", metric, colors, handles, interval)
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")  # identity / linear
            ax.set_title(f"{family} on {device}", fontsize=9)
            ax.set_ylabel(ylabel)
            _batch_axis(ax, data["batch_size"])
    _legend(figure, handles)
    return figure


def plot_speedup(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 6: speedup over identity per family x device, a line per compiler."""
    data = _models_data(frame)
    data = data[(data["compiler"] != IDENTITY) & data["speedup"].notna()]
    if data.empty:
        result.skipped.append(
            "fig06 speedup: no compiled run of a non-block model with an identity baseline"
        )
        return
    title = "Speedup over identity (family mean; dotted line = identity; bars: 95% interval)"
    figure = _family_device_grid(
        data, "speedup", title, "speedup [x identity]", _colors(frame), SPEEDUP_CI
    )
    _save(figure, out_dir / "fig06_speedup.png", result)


def plot_ase(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 8: ASE vs batch size per family x device (identity dashed)."""
    data = _models_data(frame)
    data = data[data["ase"].notna()]
    if data.empty:
        result.skipped.append("fig08 ASE: no run of a non-block model with a batch-1 throughput")
        return
    title = "Absolute scaling efficiency (family mean; 1 = throughput linear in batch size)"
    figure = _family_device_grid(data, "ase", title, "ASE = T(b) / (b T(1))", _colors(frame))
    _save(figure, out_dir / "fig08_ase.png", result)


def plot_bsr(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 9: BSR vs batch size per family x device, a line per compiler."""
    data = _models_data(frame)
    data = data[(data["compiler"] != IDENTITY) & data["bsr"].notna()]
    if data.empty:
        result.skipped.append(
            "fig09 BSR: no compiled run of a non-block model with batch-1 and identity baselines"
        )
        return
    title = "Batch scaling resilience (family mean; above 1 = scales better than identity)"
    figure = _family_device_grid(data, "bsr", title, "BSR = ASE / identity ASE", _colors(frame))
    _save(figure, out_dir / "fig09_bsr.png", result)


def _blocks_data(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    measured = frame[tables.is_result(frame) & frame[metric].notna()]
    return tables.block_params(measured)


def plot_depth(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 7: speedup vs depth, one file per block; panels: width (rows) x batch size."""
    data = _blocks_data(frame, "speedup")
    data = data[data["compiler"] != IDENTITY]
    if data.empty:
        result.skipped.append("fig07 depth: no compiled block run with an identity baseline")
        return
    data = data.assign(pair=data["device"].astype(str) + " " + data["compiler_label"])
    for model, part in data.groupby("model"):
        widths, batches = sorted(set(part["width"])), sorted(set(part["batch_size"]))
        title = f"{model}: speedup over identity vs depth (dotted line = identity)"
        figure, axes = _grid(len(widths), len(batches), title)
        handles: dict[str, Line2D] = {}
        colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(sorted(set(part["pair"])))}
        for r, width in enumerate(widths):
            for c, batch in enumerate(batches):
                ax = axes[r][c]
                cell = part[(part["width"] == width) & (part["batch_size"] == batch)]
                _depth_lines(ax, cell, colors, handles)
                ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
                ax.set_title(f"width {width}, batch {batch}", fontsize=9)
                ax.set_xlabel("depth [stacked blocks]")
                ax.set_ylabel("speedup [x identity]")
        _legend(figure, handles)
        _save(figure, out_dir / f"fig07_depth_{_slug(str(model))}.png", result)


def _depth_lines(ax: Axes, cell: pd.DataFrame, colors: dict, handles: dict) -> None:
    if cell.empty:
        _no_data(ax)
        return
    for pair, group in cell.groupby("pair"):
        series = group.groupby("depth")["speedup"].mean()
        (line,) = ax.plot(
            series.index, series.values, marker="o", markersize=3, color=colors[pair], label=pair
        )
        handles.setdefault(pair, line)
        _interval_bars(ax, group, "depth", "speedup", SPEEDUP_CI, colors[pair])
        _mark_unstable(ax, group, "depth", series, handles)
    depths = sorted(set(cell["depth"]))
    if depths:
        ax.set_xticks(depths)


def plot_ase_heatmaps(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 10: ASE over width x batch size; one file per block, a panel per device x
    compiler (rows) and depth (columns)."""
    data = _blocks_data(frame, "ase")
    if data.empty:
        result.skipped.append("fig10 ASE heatmaps: no block run with a batch-1 throughput")
        return
    data = data.assign(pair=data["device"].astype(str) + " " + data["compiler_label"])
    for model, part in data.groupby("model"):
        pairs, depths = sorted(set(part["pair"])), sorted(set(part["depth"]))
        title = f"{model}: ASE over width x batch size (1 = linear scaling)"
        figure, axes = _grid(len(pairs), len(depths), title)
        image = None
        vmax = max(1.0, float(part["ase"].max()))  # ASE can exceed 1 (super-linear scaling)
        for r, pair in enumerate(pairs):
            for c, depth in enumerate(depths):
                cell = part[(part["pair"] == pair) & (part["depth"] == depth)]
                image = _heatmap(axes[r][c], cell, f"{pair}, depth {depth}", vmax) or image
        if image is not None:
            figure.colorbar(image, ax=axes, label="ASE", shrink=0.8)
        _save(figure, out_dir / f"fig10_ase_heatmap_{_slug(str(model))}.png", result)


def _heatmap(ax: Axes, cell: pd.DataFrame, title: str, vmax: float):
    ax.set_title(title, fontsize=9)
    if cell.empty:
        ax.set_axis_off()
        return None
    grid = cell.pivot_table(index="width", columns="batch_size", values="ase", aggfunc="mean")
    image = ax.imshow(grid.values, vmin=0.0, vmax=vmax, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(grid.columns)), [str(int(b)) for b in grid.columns])
    ax.set_yticks(range(len(grid.index)), [str(int(w)) for w in grid.index])
    ax.set_xlabel(BATCH_AXIS)
    ax.set_ylabel("width [channels / embedding]")
    for (i, j), value in np.ndenumerate(grid.values):
        if not np.isnan(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color="white")
    return image


def plot_cpu(frame: pd.DataFrame, out_dir: Path, result: PlotResult) -> None:
    """Fig. 12: one file per device; per family, CPU % (solid, left axis) and its reduction
    against identity (dashed, right axis) vs batch size."""
    data = _models_data(frame)
    data = data[data["cpu_percent"].notna()]
    if data.empty:
        result.skipped.append("fig12 CPU: no CPU usage measured for non-block models")
        return
    colors = _colors(frame)
    for device, part in data.groupby("device"):
        families = _families(part)
        title = f"CPU usage on {device} (solid, left) and reduction vs identity (dashed, right)"
        figure, axes = _grid(1, len(families), title)
        handles: dict[str, Line2D] = {}
        for c, family in enumerate(families):
            _cpu_panel(axes[0][c], part[part["family"] == family], colors, handles)
            axes[0][c].set_title(family, fontsize=9)
        handles["CPU usage (solid, left)"] = Line2D([], [], color="grey", linestyle="-")
        handles["reduction (dashed, right)"] = Line2D([], [], color="grey", linestyle="--")
        _legend(figure, handles)
        _save(figure, out_dir / f"fig12_cpu_{_slug(str(device))}.png", result)


def _cpu_panel(ax: Axes, cell: pd.DataFrame, colors: dict, handles: dict) -> None:
    _lines(ax, cell, "batch_size", "cpu_percent", colors, handles, linestyle="-")
    ax.set_ylabel("CPU usage [% of all logical cores]")
    _batch_axis(ax, cell["batch_size"])
    reduction = cell[(cell["compiler"] != IDENTITY) & cell["cpu_reduction_pct"].notna()]
    if reduction.empty:
        return
    twin = ax.twinx()
    for label, group in reduction.groupby("compiler_label"):
        series = group.groupby("batch_size")["cpu_reduction_pct"].mean()
        style = {**_style(label, colors), "linestyle": "--", "marker": "x"}
        twin.plot(series.index.astype(float), series.values, **style)
    twin.set_ylabel("CPU reduction vs identity [%]")


PLOTTERS: tuple[Callable[[pd.DataFrame, Path, PlotResult], None], ...] = (
    plot_throughput,
    plot_speedup,
    plot_depth,
    plot_ase,
    plot_bsr,
    plot_ase_heatmaps,
    plot_cpu,
)


def draw_all(
    frame: pd.DataFrame, out_dir: Path, which: Sequence[Callable] = PLOTTERS
) -> PlotResult:
    """Draw every figure that has data into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = PlotResult()
    for plotter in which:
        plotter(frame, out_dir, result)
    for path in result.written:
        log.info("wrote %s", path)
    return result
