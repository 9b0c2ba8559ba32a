"""Every figure drawn from logged runs; figures without data are skipped with a reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.image import imread

EXPECTED = {
    "fig05_throughput_cpu.png",
    "fig05_throughput_gpu.png",
    "fig06_speedup.png",
    "fig07_depth_conv_block.png",
    "fig08_ase.png",
    "fig09_bsr.png",
    "fig10_ase_heatmap_conv_block.png",
    "fig12_cpu_cpu.png",
}


def assert_real_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 20_000, path  # a titled, labelled chart, not a blank canvas
    pixels = imread(path)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 400
    assert np.std(pixels) > 0.05  # something is drawn


def test_every_plot_from_logged_runs(compare_cli, tmp_path):
    out = tmp_path / "plots"
    result = compare_cli("--plots", str(out), "--table", "cells")
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == EXPECTED
    for path in out.iterdir():
        assert_real_png(path)
    assert f"8 plot(s) written to {out}" in result.stderr


def test_plots_without_data_are_skipped_with_the_reason(compare_cli, tmp_path):
    out = tmp_path / "gpu"
    result = compare_cli("--device", "gpu", "--plots", str(out), "--table", "cells")
    assert result.exit_code == 0, result.output
    assert {p.name for p in out.iterdir()} == {"fig05_throughput_gpu.png", "fig08_ase.png"}
    for reason in (
        "plot skipped: fig06 speedup: no compiled run of a non-block model with an identity "
        "baseline",
        "plot skipped: fig07 depth: no compiled block run with an identity baseline",
        "plot skipped: fig10 ASE heatmaps: no block run with a batch-1 throughput",
        "plot skipped: fig12 CPU: no CPU usage measured for non-block models",
    ):
        assert reason in result.stderr


def test_points_show_their_interval_and_unstable_ones_are_ringed():
    """One model per panel: each point is one measurement, so it carries its 95% interval
    as a bar; an UNSTABLE point gets a red ring and a legend entry."""
    import pandas as pd
    from matplotlib.collections import PathCollection
    from matplotlib.container import ErrorbarContainer
    from matplotlib.figure import Figure

    from mlflow_ngraph.report import plots

    frame = pd.DataFrame(
        {
            "compiler_label": ["identity", "identity", "openvino", "openvino"],
            "batch_size": [1, 8, 1, 8],
            "throughput": [100.0, 400.0, 150.0, 900.0],
            "throughput_ci_low": [95.0, 380.0, 140.0, 600.0],
            "throughput_ci_high": [105.0, 420.0, 160.0, 1200.0],
            "stability": ["STABLE", "STABLE", "STABLE", "UNSTABLE"],
        }
    )
    ax = Figure().subplots()
    handles: dict = {}
    plots._lines(ax, frame, "batch_size", "throughput", {"openvino": "tab:blue"}, handles,
                 plots.THROUGHPUT_CI)  # fmt: skip
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == 2  # one per compiler, a bar at each of its points
    (_, _, (segments,)) = bars[1]
    spans = sorted(tuple(seg[:, 1]) for seg in segments.get_segments())
    assert spans == [(140.0, 160.0), (600.0, 1200.0)]
    (ring,) = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert ring.get_offsets().tolist() == [[8.0, 900.0]]
    assert plots.UNSTABLE_LABEL in handles

    # a family mean of several models has no interval of its own: no bar, the ring stays
    twice = pd.concat([frame, frame.assign(throughput=frame["throughput"] * 2)])
    ax = Figure().subplots()
    plots._lines(ax, twice, "batch_size", "throughput", {}, {}, plots.THROUGHPUT_CI)
    assert not [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len([c for c in ax.collections if isinstance(c, PathCollection)]) == 1


def test_a_long_title_is_wrapped_inside_a_one_panel_figure():
    """A one-model figure is narrow: its title (the speedup figure's is 80 characters) is
    wrapped to the figure's width, not cut at both edges (seen with --model resnet18)."""
    from mlflow_ngraph.report.plots import _grid

    title = "Speedup over identity (family mean; dotted line = identity; bars: 95% interval)"
    figure, _ = _grid(1, 1, title)
    figure.canvas.draw()
    box = figure._suptitle.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= figure.bbox.x1, (box, figure.bbox)
    assert figure._suptitle.get_text().replace("\n", " ") == title
