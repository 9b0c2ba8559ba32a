"""Constants shared by the tests (import as ``from tests._support import ...``)."""

import sys
from pathlib import Path

#: the smallest real workload: a 32x32 conv block, two batch sizes, a few repetitions
TINY = [
    "--model",
    "conv_block:width=8,depth=1,image_size=32",
    "--batch-sizes",
    "1,2",
    "--warmup",
    "1",
    "--repetitions",
    "3",
    "--min-duration",
    "0",
]
PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent


def assert_matches(out, ref) -> None:
    """An engine's output equals the reference's (eager PyTorch) within float32 noise."""
    import numpy as np

    assert out.shape == ref.shape
    assert np.abs(out - ref).max() < 1e-4
    cosine = float(np.dot(out.ravel(), ref.ravel()) / np.linalg.norm(out) / np.linalg.norm(ref))
    assert cosine > 0.9999
