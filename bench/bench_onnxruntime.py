"""ONNX Runtime fidelity: the tool's harness against a bare ``InferenceSession.run`` loop.

The bare side calls ``session.run(None, feed)`` in a plain loop for the same duration on the
same input. Ratio = ours / bare. Its session is, by default, the engine's own (``--session
same``: same options by construction, and one thread pool in the process). ``--session
separate`` builds a second session from the same ONNX file (the tool's export cache) with the
options the tool uses by default (all graph optimizations, ONNX Runtime's own thread counts,
sequential execution, the batch dimension fixed to the measured batch); two sessions means two
intra-op thread pools in one process, and on a 2-core host the side that runs second in a pair
then loses ~10% to the other pool's threads: read its ratios with that in mind.

    python bench/bench_onnxruntime.py
    python bench/bench_onnxruntime.py --models resnet18 --batch-sizes 1 --duration 5
"""

from __future__ import annotations

import time
from pathlib import Path

import _common as C

DEFAULT_MODELS = "resnet18;deit3_small_patch16_224;conv_block:width=32,depth=4"


def bare_session(model_file: Path, batch_size: int):
    """A session with the tool's default options, built without the tool's code."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = 0
    options.inter_op_num_threads = 0
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_free_dimension_override_by_name("batch", batch_size)
    return ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])


def bare_loop(session, inputs, duration_s: float) -> dict[str, float]:
    """``session.run`` back to back for ``duration_s``; one continuous window."""
    feed = {session.get_inputs()[0].name: inputs}
    session.run(None, feed)
    clock, count = time.perf_counter, 0
    began = clock()
    while True:
        session.run(None, feed)
        count += 1
        if clock() - began >= duration_s:
            break
    return {"throughput": count * inputs.shape[0] / (clock() - began)}


def run_cell(args, model, model_file: Path, batch: int) -> dict:
    built = C.engine("onnxruntime", model, batch, args.home)
    session = built.session if args.session == "same" else bare_session(model_file, batch)
    inputs = model.random_input(batch)
    C.log(f"{model.label} bs{batch}: {built.runtime_settings()}")
    ours, bare = C.interleave(
        args.repetitions,
        lambda: C.harness(built, batch, "throughput", args.duration, args.warmup),
        lambda: bare_loop(session, inputs, args.duration),
    )
    built.close()
    ratio = C.paired_ratio([o["throughput"] for o in ours], [b["throughput"] for b in bare])
    row = {
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
    p = C.parser(__doc__.splitlines()[0], 2.0, 5, "onnxruntime.csv")
    p.add_argument("--models", default=DEFAULT_MODELS, help="';'-separated model specs")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--session", default="same", choices=("same", "separate"))
    args = p.parse_args()
    from mlflow_ngraph.compilers._export import export_onnx

    rows = []
    for spec in args.models.split(";"):
        model = C.load(spec)
        model_file = export_onnx(model, args.home)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            rows.append(run_cell(args, model, model_file, batch))
    C.print_table(rows, ["model", "batch", "ours_sps", "bare_sps", "ratio_text"])
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
