"""The cost of measuring each cell in its own process: ``--isolation process`` against
``--isolation none``, end to end, side by side.

Both sides run ``mlflow-ngraph benchmark`` in a subprocess on the same spec and the same
home: a warm-up run fills the export and engine caches first, then each run logs into a
fresh tracking store (so its journal is fresh and every cell is measured again, engines
coming from the cache). The sides alternate (P N, N P, P N ...) so that other load hits both
alike. Reports each side's median seconds, the median of the paired ratios
process / none, and the overhead per cell in seconds.

    python bench/bench_isolation.py                      # a small grid
    python bench/bench_isolation.py --spec default --pairs 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = """\
experiment: bench-isolation
models:
  - {name: conv_block, params: {width: 16, depth: 2, image_size: 64}}
  - {name: mha_block, params: {width: 64, depth: 2}}
compilers: [identity, torchscript, onnxruntime, openvino]
batch_sizes: [1, 2]
warmup: 2
repetitions: 10
min_duration: 0.2
"""


def _run(spec: str, home: Path, store: Path, isolation: str) -> float:
    command = [
        sys.executable, "-m", "mlflow_ngraph", "benchmark", "--spec", spec,
        "--home", str(home), "--tracking-uri", f"sqlite:///{store}",
        "--isolation", isolation, "-q",
    ]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"benchmark failed ({isolation}):\n{done.stderr[-3000:]}")
    return seconds


def _cells(spec: str) -> int:
    from mlflow_ngraph.cli import resolve_spec_path
    from mlflow_ngraph.config import build_spec, load_spec_file

    built = build_spec(load_spec_file(resolve_spec_path(spec)))
    return len(built.models) * len(built.compilers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", help="spec file or packaged name (default: a small grid)")
    p.add_argument("--pairs", type=int, default=3, help="interleaved pairs")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        spec = args.spec
        if spec is None:
            spec = str(tmp_path / "small.yaml")
            Path(spec).write_text(SMALL)
        home = tmp_path / "home"
        cells = _cells(spec)
        warm = _run(spec, home, tmp_path / "warm.db", "none")
        print(f"warm-up (fills the caches): {warm:.1f} s, {cells} cells")
        times: dict[str, list[float]] = {"process": [], "none": []}
        ratios = []
        for i in range(args.pairs):
            order = ("process", "none") if i % 2 == 0 else ("none", "process")
            pair = {}
            for side in order:
                pair[side] = _run(spec, home, tmp_path / f"{side}-{i}.db", side)
                times[side].append(pair[side])
            ratios.append(pair["process"] / pair["none"])
            print(
                f"pair {i + 1}: process {pair['process']:.1f} s, none {pair['none']:.1f} s, "
                f"ratio {ratios[-1]:.3f}"
            )
    proc, none = statistics.median(times["process"]), statistics.median(times["none"])
    print(f"median end to end: process {proc:.1f} s, none {none:.1f} s")
    print(
        f"ratio process/none: median {statistics.median(ratios):.3f} "
        f"[{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} pairs"
    )
    print(f"overhead per cell: {(proc - none) / cells:.2f} s ({cells} cells)")


if __name__ == "__main__":
    main()
