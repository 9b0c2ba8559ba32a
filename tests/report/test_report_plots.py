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
