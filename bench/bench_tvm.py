"""TVM against the other CPU compilers: throughput relative to identity, and tuning cost.

For every model and batch size, TVM is compiled at each trial budget (0 = untuned build) and
measured with the tool's shared harness next to identity (PyTorch eager), ONNX Runtime and
OpenVINO. The sides are interleaved (A B C, B C A, ...) so that load from other processes
hits all alike; each row reports the median throughput, the median of the paired ratios to
identity, and for TVM the trials it measured and the seconds it spent tuning. A database from
an earlier run with the same model, batch and budget is reused (0 trials, 0 s tuning; the
``reused`` column says so): delete ``<home>/tvm-tuning`` to tune again.

    .venv/bin/python bench/bench_tvm.py
    .venv/bin/python bench/bench_tvm.py --models "conv_block:width=64,depth=3" --batch-sizes 1 \\
        --budgets 64
"""

from __future__ import annotations

import logging
import time
from typing import Any

import _common as C

DEFAULT_MODELS = "conv_block:width=64,depth=3;resnet18"
#: the paper's budgets scaled to a small host: untuned, the compiler's default, 4x that
DEFAULT_BUDGETS = "0,64,256"
DEFAULT_REFERENCES = "identity,onnxruntime,openvino"


def compile_side(name: str, model: Any, batch: int, args: Any, flags: dict | None = None):
    """(label, engine, row fields) for one compiler, or (label, None, error) when it fails."""
    label = name if flags is None else f"tvm@{flags['trials']}"
    began = time.perf_counter()
    try:
        built = C.engine(name, model, batch, args.home, flags=flags)
    except Exception as exc:  # one compiler failing must not lose the others' numbers
        C.log(f"{model.label} bs{batch} {label}: FAILED {exc}")
        return label, None, {"error": str(exc).splitlines()[0][:200]}
    fields: dict[str, Any] = {"compile_s": round(time.perf_counter() - began, 1)}
    if name == "tvm":
        settings = built.runtime_settings()
        fields.update(
            tuned=settings["tuned"],
            trials=settings["trials_used"],
            tuning_s=round(settings["tuning_seconds"], 1),
            reused=settings["database_reused"],
            tasks=f"{settings['tasks_tuned']}/{settings['tasks']}",
        )
    C.log(f"{model.label} bs{batch} {label}: compiled {fields}")
    return label, built, fields


def run_cell(args: Any, model: Any, batch: int) -> list[dict]:
    sides = [compile_side(n, model, batch, args) for n in args.references.split(",") if n]
    for budget in (int(b) for b in args.budgets.split(",") if b):
        sides.append(compile_side("tvm", model, batch, args, {"trials": budget}))
    live = [(label, built) for label, built, _ in sides if built is not None]
    results = C.interleave(
        args.repetitions,
        *[
            (lambda b=built: C.harness(b, batch, "throughput", args.duration, args.warmup))
            for _, built in live
        ],
    )
    by_label = {
        label: [r["throughput"] for r in runs]
        for (label, _), runs in zip(live, results, strict=True)
    }
    identity = by_label.get("identity")
    rows = []
    for label, built, fields in sides:
        row: dict[str, Any] = {"model": model.label, "batch": batch, "compiler": label, **fields}
        if label in by_label:
            row["samples_per_s"] = round(C.statistics.median(by_label[label]), 2)
            row["cv"] = round(C.cv(by_label[label]), 3)
            if identity:
                ratio = C.paired_ratio(by_label[label], identity)
                row.update(C.ratio_columns("vs_identity", ratio), vs_identity_text=ratio.text())
        rows.append(row)
        if built is not None:
            built.close()
    for row in rows:
        C.log(f"  -> {row}")
    return rows


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 3.0, 3, "tvm.csv")
    p.add_argument("--models", default=DEFAULT_MODELS, help="';'-separated model specs")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--budgets", default=DEFAULT_BUDGETS, help="TVM trial budgets, 0 = untuned")
    p.add_argument(
        "--references", default=DEFAULT_REFERENCES, help="compilers TVM is compared with"
    )
    args = p.parse_args()
    # the tool logs progress (TVM: one line per tuning round); other libraries only warnings
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s] %(name)s: %(message)s")
    logging.getLogger("mlflow_ngraph").setLevel(logging.INFO)
    rows = []
    for spec in args.models.split(";"):
        model = C.load(spec)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            rows += run_cell(args, model, batch)
    C.print_table(
        rows,
        ["model", "batch", "compiler", "samples_per_s", "vs_identity_text", "trials", "tuning_s",
         "reused", "compile_s", "error"],
    )  # fmt: skip
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
