"""Harness overhead on a model of ~100 us per call: the tool's throughput / a bare loop.

The model is small enough (``mha_block`` width 128, depth 1, batch 1) that whatever the
harness adds per call shows. Each compiler's engine is measured through the harness and by
the bare loop of its own fidelity script (same callable, same input), interleaved. A ``noop``
row measures the harness on an engine whose call does nothing: that is its fixed cost.

    python bench/bench_overhead.py
    python bench/bench_overhead.py --compilers identity,onnxruntime --duration 2

Overhead per call (us) = 1e6 * (1 / ours_calls_per_s - 1 / bare_calls_per_s).
"""

from __future__ import annotations

import time

import _common as C
import bench_onnxruntime
import bench_openvino
import bench_torch
import numpy as np

DEFAULT_MODEL = "mha_block:width=128,depth=1"


class NoopEngine:
    """An engine whose requests cost nothing: what is measured is the harness itself."""

    parallel_requests = 1
    asynchronous_device = False

    def infer(self) -> None:
        pass

    def run_many(self, count: int, stamps=None) -> None:
        if stamps is None:
            for _ in range(count):
                self.infer()
            return
        clock = time.perf_counter
        for _ in range(count):
            self.infer()
            stamps.append(clock())

    def synchronize(self) -> None:
        pass


def noop_loop(duration_s: float) -> dict[str, float]:
    def call() -> None:
        pass

    clock, count = time.perf_counter, 0
    began = clock()
    while True:
        call()
        count += 1
        if clock() - began >= duration_s:
            break
    return {"throughput": count / (clock() - began)}


def sides(args, compiler: str, model, batch: int):
    """(the engine, its bare loop) for ``compiler``."""
    if compiler == "noop":
        return NoopEngine(), lambda: noop_loop(args.duration)
    built = C.engine(compiler, model, batch, args.home)
    inputs = model.random_input(batch)
    if compiler == "onnxruntime":  # the engine's own session: one thread pool in the process
        return built, lambda: bench_onnxruntime.bare_loop(built.session, inputs, args.duration)
    if compiler == "openvino":
        return built, lambda: bench_openvino.vendor_loop(built, inputs, "throughput", args.duration)
    import torch

    tensor = torch.from_numpy(inputs)
    return built, lambda: bench_torch.bare_loop(built.fn, tensor, args.duration)


def run_cell(args, compiler: str, model, batch: int) -> dict:
    built, bare_side = sides(args, compiler, model, batch)
    ours, bare = C.interleave(
        args.repetitions,
        lambda: C.harness(built, batch, "throughput", args.duration, args.warmup),
        bare_side,
    )
    ours_sps = [o["throughput"] for o in ours]
    bare_sps = [b["throughput"] for b in bare]
    ratio = C.paired_ratio(ours_sps, bare_sps)
    overhead_us = 1e6 * (batch / np.asarray(ours_sps) - batch / np.asarray(bare_sps))
    row = {
        "compiler": compiler,
        "model": "-" if compiler == "noop" else model.label,
        "batch": batch,
        "bare_us_per_call": 1e6 * batch / C.statistics.median(bare_sps),
        "overhead_us_per_call": float(np.median(overhead_us)),
        **C.ratio_columns("ratio", ratio),
        "ratio_text": ratio.text(),
    }
    C.log(f"  -> {row}")
    return row


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 1.0, 10, "overhead.csv")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--compilers", default="noop,identity,torchscript,onnxruntime,openvino")
    p.add_argument("--batch-size", type=int, default=1)
    args = p.parse_args()
    model = C.load(args.model)
    rows = [run_cell(args, c, model, args.batch_size) for c in args.compilers.split(",")]
    C.print_table(
        rows,
        ["compiler", "model", "batch", "bare_us_per_call", "overhead_us_per_call", "ratio_text"],
    )
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
