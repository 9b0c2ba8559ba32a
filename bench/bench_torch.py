"""identity and TorchScript fidelity: the tool's harness against a bare PyTorch loop.

The bare side calls the very module the engine runs (the eager module for identity, the
frozen and optimized TorchScript module for torchscript) on the same input tensor, back to
back under one ``torch.inference_mode()`` for the same duration. Ratio = ours / bare.

    python bench/bench_torch.py
    python bench/bench_torch.py --compilers identity --models resnet18 --batch-sizes 1
"""

from __future__ import annotations

import time

import _common as C

DEFAULT_MODELS = "resnet18;deit3_small_patch16_224;conv_block:width=32,depth=4"


def bare_loop(fn, tensor, duration_s: float) -> dict[str, float]:
    """``fn(tensor)`` back to back for ``duration_s`` under one ``torch.inference_mode``."""
    import torch

    clock, count = time.perf_counter, 0
    with torch.inference_mode():
        fn(tensor)
        began = clock()
        while True:
            fn(tensor)
            count += 1
            if clock() - began >= duration_s:
                break
        elapsed = clock() - began
    return {"throughput": count * tensor.shape[0] / elapsed}


def run_cell(args, compiler: str, model, batch: int) -> dict:
    import torch

    built = C.engine(compiler, model, batch, args.home)
    tensor = torch.from_numpy(model.random_input(batch))
    C.log(f"{model.label} bs{batch} {compiler}: {built.runtime_settings()}")
    ours, bare = C.interleave(
        args.repetitions,
        lambda: C.harness(built, batch, "throughput", args.duration, args.warmup),
        lambda: bare_loop(built.fn, tensor, args.duration),
    )
    built.close()
    ratio = C.paired_ratio([o["throughput"] for o in ours], [b["throughput"] for b in bare])
    row = {
        "compiler": compiler,
        "model": model.label,
        "batch": batch,
        "ours_sps": C.statistics.median(o["throughput"] for o in ours),
        "bare_sps": C.statistics.median(b["throughput"] for b in bare),
        **C.ratio_columns("ratio", ratio),
        "ratio_text": ratio.text(),
        **C.raw("ours_values", [o["throughput"] for o in ours]),
        **C.raw("bare_values", [b["throughput"] for b in bare]),
    }
    C.log(f"  -> {row}")
    return row


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 2.0, 5, "torch.csv")
    p.add_argument("--models", default=DEFAULT_MODELS, help="';'-separated model specs")
    p.add_argument("--compilers", default="identity,torchscript")
    p.add_argument("--batch-sizes", default="1,8")
    args = p.parse_args()
    rows = []
    for spec in args.models.split(";"):
        model = C.load(spec)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for compiler in args.compilers.split(","):
                rows.append(run_cell(args, compiler, model, batch))
    C.print_table(rows, ["compiler", "model", "batch", "ours_sps", "bare_sps", "ratio_text"])
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
