"""Stability: the coefficient of variation of throughput over repeated runs of one cell.

Each compiler's engine is compiled once; then the same cell (model, batch size, scenario) is
measured ``--repetitions`` times through the harness, the compilers taking turns (round-robin)
so that a change in machine load hits all of them alike. Reports, per compiler, the median
throughput, the CV across runs (run-to-run stability) and the median within-run CV (what the
harness records as ``cv``), plus the thread settings the tool records for the engine.

    python bench/bench_stability.py
    python bench/bench_stability.py --model resnet18 --batch-size 8 --repetitions 10
"""

from __future__ import annotations

import _common as C

DEFAULT_COMPILERS = "identity,torchscript,onnxruntime,openvino"


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 3.0, 5, "stability.csv")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--compilers", default=DEFAULT_COMPILERS)
    p.add_argument("--scenario", default="throughput", choices=("throughput", "latency"))
    args = p.parse_args()
    model = C.load(args.model)
    batch = args.batch_size
    engines = {
        name: C.engine(name, model, batch, args.home, scenario=args.scenario)
        for name in args.compilers.split(",")
    }
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for i in range(args.repetitions):
        for name, built in engines.items():
            runs[name].append(C.harness(built, batch, args.scenario, args.duration, args.warmup))
            C.log(f"run {i + 1} {name}: {runs[name][-1]['throughput']:.2f} samples/s")
    rows = []
    for name, built in engines.items():
        values = [r["throughput"] for r in runs[name]]
        rows.append(
            {
                "compiler": name,
                "model": model.label,
                "batch": batch,
                "scenario": args.scenario,
                "runs": len(values),
                "median_sps": C.statistics.median(values),
                "cv_across_runs": C.cv(values),
                "cv_within_run": C.statistics.median(r["cv"] for r in runs[name]),
                "settings": " ".join(f"{k}={v}" for k, v in built.runtime_settings().items()),
            }
        )
        built.close()
    C.print_table(
        rows, ["compiler", "batch", "runs", "median_sps", "cv_across_runs", "cv_within_run"]
    )
    for row in rows:
        print(f"{row['compiler']}: {row['settings']}")
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
