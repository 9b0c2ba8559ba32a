"""Stability: the spread of throughput over repeated runs of one cell, on a quiet host and
beside a competing load, and whether the tool says which numbers are noise.

Each compiler's engine is compiled once; then the same cell (model, batch size, scenario) is
measured ``--repetitions`` times through the harness, the compilers taking turns (round-robin)
so that a change in machine load hits all of them alike; then again with ``--load`` busy
processes running beside it (detached, as another user's job would be). Reports, per
compiler and condition, the median throughput, the CV across runs (run-to-run stability),
the median within-run CV (what the harness records as ``cv``), the median CPU share other
processes took (``host_other_cpu_percent``), how many runs the tool judged UNSTABLE, and how
many runs' 95% intervals hold the quiet runs' median.

    python bench/bench_stability.py
    python bench/bench_stability.py --model resnet18 --batch-size 8 --repetitions 10 --load 2
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import _common as C

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._hog import cpu_hog  # noqa: E402  (the one competing load, shared with the tests)

DEFAULT_COMPILERS = "identity,torchscript,onnxruntime,openvino"


def _runs(engines, args, batch, label) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for i in range(args.repetitions):
        for name, built in engines.items():
            run = C.harness(built, batch, args.scenario, args.duration, args.warmup)
            runs[name].append(run)
            C.log(
                f"{label} run {i + 1} {name}: {run['throughput']:.2f} samples/s, other CPU "
                f"{run['host_other_cpu_percent'] or 0:.0f}%, "
                f"{'stable' if run['stable'] else 'UNSTABLE'}"
            )
    return runs


def _row(name, model, batch, args, label, runs, quiet_median) -> dict:
    values = [r["throughput"] for r in runs]
    others = [r["host_other_cpu_percent"] for r in runs if r["host_other_cpu_percent"] is not None]
    held = [r["ci_low"] <= quiet_median <= r["ci_high"] for r in runs if r["ci_low"] is not None]
    return {
        "compiler": name,
        "model": model.label,
        "batch": batch,
        "scenario": args.scenario,
        "load": label,
        "runs": len(values),
        "median_sps": C.statistics.median(values),
        "cv_across_runs": C.cv(values),
        "cv_within_run": C.statistics.median(r["cv"] for r in runs),
        "other_cpu_pct": C.statistics.median(others) if others else float("nan"),
        "unstable": sum(not r["stable"] for r in runs),
        "ci_holds_quiet_median": f"{sum(held)}/{len(held)}",
    }


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 3.0, 5, "stability.csv")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--compilers", default=DEFAULT_COMPILERS)
    p.add_argument("--scenario", default="throughput", choices=("throughput", "latency"))
    p.add_argument(
        "--load", type=int, default=2, help="busy processes beside the second pass (0: none)"
    )
    args = p.parse_args()
    model = C.load(args.model)
    batch = args.batch_size
    engines = {
        name: C.engine(name, model, batch, args.home, scenario=args.scenario)
        for name in args.compilers.split(",")
    }
    quiet = _runs(engines, args, batch, "quiet")
    passes = [("quiet", quiet)]
    if args.load:
        with tempfile.TemporaryDirectory() as scratch, cpu_hog(Path(scratch), args.load):
            passes.append((f"{args.load} busy", _runs(engines, args, batch, "loaded")))
    rows = []
    for name in engines:
        quiet_median = C.statistics.median(r["throughput"] for r in quiet[name])
        for label, runs in passes:
            rows.append(_row(name, model, batch, args, label, runs[name], quiet_median))
    for built in engines.values():
        with contextlib.suppress(Exception):
            built.close()
    C.print_table(
        rows,
        [
            "compiler",
            "load",
            "runs",
            "median_sps",
            "cv_across_runs",
            "cv_within_run",
            "other_cpu_pct",
            "unstable",
            "ci_holds_quiet_median",
        ],
    )
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
