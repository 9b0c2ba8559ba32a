"""The cost of measuring each cell in its own process: ``--isolation process`` against
``--isolation none``, end to end, side by side.

Both sides run ``mlflow-ngraph benchmark`` in a subprocess on the same spec and the same
home: a warm-up run fills the export and engine caches first, then each run logs into a
fresh tracking store (so its journal is fresh and every cell is measured again, engines
coming from the cache). Three sides: ``process`` (a worker per cell, the next one started
as a spare while the current cell runs, paused while it measures), ``process-cold`` (a
worker per cell started when the cell starts: ``MLFLOW_NGRAPH_SPARE_WORKER=0``) and
``none``. The sides rotate from round to round so that other load hits all alike. Reports
each side's median seconds, the median ratio of each process side to ``none`` and its
overhead per cell in seconds.

    python bench/bench_isolation.py                      # a small grid
    python bench/bench_isolation.py --spec default --pairs 3
"""

from __future__ import annotations

import argparse
import os
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


SIDES = ("process", "process-cold", "none")


def _run(spec: str, home: Path, store: Path, side: str) -> float:
    isolation = "none" if side == "none" else "process"
    command = [
        sys.executable, "-m", "mlflow_ngraph", "benchmark", "--spec", spec,
        "--home", str(home), "--tracking-uri", f"sqlite:///{store}",
        "--isolation", isolation, "-q",
    ]  # fmt: skip
    env = {**os.environ, "MLFLOW_NGRAPH_SPARE_WORKER": "0" if side == "process-cold" else "1"}
    t0 = time.perf_counter()
    # in the store's folder: the runs' artifacts land there, not in the caller's folder
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=store.parent)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"benchmark failed ({side}):\n{done.stderr[-3000:]}")
    return seconds


def _cells(spec: str) -> int:
    from mlflow_ngraph.cli import resolve_spec_path
    from mlflow_ngraph.config import build_spec, load_spec_file

    built = build_spec(load_spec_file(resolve_spec_path(spec)))
    return len(built.models) * len(built.compilers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", help="spec file or packaged name (default: a small grid)")
    p.add_argument("--pairs", type=int, default=3, help="rounds of the three sides")
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
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(args.pairs):
            order = SIDES[i % 3 :] + SIDES[: i % 3]
            for side in order:
                times[side].append(_run(spec, home, tmp_path / f"{side}-{i}.db", side))
            print(
                f"round {i + 1}: " + ", ".join(f"{side} {times[side][-1]:.1f} s" for side in SIDES)
            )
    none = statistics.median(times["none"])
    for side in SIDES[:2]:
        ratios = [p / n for p, n in zip(times[side], times["none"])]
        median = statistics.median(times[side])
        print(
            f"{side}/none: median {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} rounds; "
            f"{median:.1f} s against {none:.1f} s, overhead per cell "
            f"{(median - none) / cells:.2f} s ({cells} cells)"
        )


if __name__ == "__main__":
    main()
