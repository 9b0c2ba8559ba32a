"""OpenVINO fidelity: the tool's harness against OpenVINO's own ``benchmark_app``.

Both sides load the same ONNX file (the tool's export cache) and run the same input batch
(passed to ``benchmark_app`` with ``-i``), on the same device, at the same static batch shape,
in f32 with an f32 input (the tool's defaults; ``benchmark_app``'s own would be bf16 on CPUs
with AVX512-BF16 and a u8 input: ``--vendor-defaults``), with the same hint and duration.
The throughput scenario is compared with ``benchmark_app -hint throughput`` (FPS), the
latency scenario with ``benchmark_app -hint latency`` (sync API; FPS and median latency). A
third column runs ``benchmark_app``'s own loop in this process on the tool's compiled model.

    python bench/bench_openvino.py                      # resnet18, deit3_small, conv_block
    python bench/bench_openvino.py --models resnet18 --batch-sizes 1 --duration 10

Ratios are ours / benchmark_app for throughput and benchmark_app / ours for latency, so above
1.00 always means the tool reports the runtime at least as fast as its vendor tool does.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import _common as C
import numpy as np

DEFAULT_MODELS = "resnet18;deit3_small_patch16_224;conv_block:width=32,depth=2"
BENCHMARK_APP = Path(sys.executable).with_name("benchmark_app")
_FPS = re.compile(r"Throughput:\s+([0-9.]+)\s+FPS")
_MEDIAN = re.compile(r"Median:\s+([0-9.]+)\s+ms")
_REQUESTS = re.compile(r"(\d+) inference requests")
_COUNT = re.compile(r"Count:\s+(\d+)\s+iterations")


def benchmark_app(
    model_file: Path, input_file: Path, scenario: str, duration_s: float, matched: bool
) -> dict[str, float]:
    """Run ``benchmark_app`` once and parse its FPS, median latency and request count.

    ``matched``: run what the tool runs: the tool's own input batch (``-i`` a ``.npy`` file;
    by default it fills uniform [0, 255] values), an f32 input (``-ip f32``; by default an
    image-shaped input becomes u8 with a conversion in the graph) and f32 inference
    (``-infer_precision f32``; by default bf16 on CPUs with AVX512-BF16). Otherwise its own
    defaults.
    """
    shape = np.load(input_file, mmap_mode="r").shape
    command = [
        str(BENCHMARK_APP),
        "-m",
        str(model_file),
        "-d",
        "CPU",
        "-shape",
        "[" + ",".join(str(s) for s in shape) + "]",
        "-t",
        str(max(1, round(duration_s))),
        "-hint",
        scenario,
    ]
    if matched:
        command += ["-i", str(input_file), "-ip", "f32", "-infer_precision", "f32"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    text = done.stdout + done.stderr
    fps, median = _FPS.search(text), _MEDIAN.search(text)
    if done.returncode != 0 or not fps or not median:
        raise RuntimeError(f"benchmark_app failed ({done.returncode}):\n{text[-2000:]}")
    requests = _REQUESTS.search(text)
    return {
        "throughput": float(fps.group(1)),
        "latency_p50_ms": float(median.group(1)),
        "requests": int(requests.group(1)) if requests else 1,
        "count": int(_COUNT.search(text).group(1)),
    }


def vendor_loop(built, inputs, scenario: str, duration_s: float) -> dict[str, float]:
    """``benchmark_app``'s measurement loop, in this process, on the same compiled model:
    one continuous window (async queue with the optimal number of requests for throughput,
    one synchronous request for latency), FPS = requests x batch / window."""
    from openvino import AsyncInferQueue

    compiled, batch, clock = built.compiled, inputs.shape[0], time.perf_counter
    if scenario == "latency":
        request = compiled.create_infer_request()
        request.get_input_tensor(0).data[:] = inputs
        request.infer()  # benchmark_app's first (warm-up) inference
        latencies, began = [], clock()
        while clock() - began < duration_s:
            request.infer()
            latencies.append(request.latency)
        elapsed = clock() - began
        return {
            "throughput": len(latencies) * batch / elapsed,
            "latency_p50_ms": float(np.median(latencies)),
        }
    queue = AsyncInferQueue(compiled, built.parallel_requests)
    for request in queue:
        request.get_input_tensor(0).data[:] = inputs
    queue.start_async()
    queue.wait_all()
    count, began = 0, clock()
    while clock() - began < duration_s or count % len(queue):
        queue.start_async()
        count += 1
    queue.wait_all()
    elapsed = clock() - began
    return {"throughput": count * batch / elapsed, "latency_p50_ms": float("nan")}


def run_cell(args, model, model_file: Path, batch: int, scenario: str) -> dict:
    built = C.engine("openvino", model, batch, args.home, scenario=scenario)
    inputs = model.random_input(batch)
    input_file = args.home / "work" / "bench" / f"input-{model.content_hash[:16]}-bs{batch}.npy"
    np.save(input_file, inputs)
    C.log(f"{model.label} bs{batch} {scenario}: {built.runtime_settings()}")
    ours, loop, app = C.interleave(
        args.repetitions,
        lambda: C.harness(built, batch, scenario, args.duration, args.warmup),
        lambda: vendor_loop(built, inputs, scenario, args.duration),
        lambda: benchmark_app(
            model_file, input_file, scenario, args.duration, not args.vendor_defaults
        ),
    )
    built.close()
    median = C.statistics.median
    row = {
        "model": model.label,
        "batch": batch,
        "scenario": scenario,
        "requests": f"{built.parallel_requests}/{app[0]['requests']}",
        "ours_fps": median(o["throughput"] for o in ours),
        "loop_fps": median(r["throughput"] for r in loop),
        "app_fps": median(r["throughput"] for r in app),
    }
    ours_fps = [o["throughput"] for o in ours]
    row.update(C.raw("ours_values", ours_fps))
    row.update(C.raw("loop_values", [r["throughput"] for r in loop]))
    row.update(C.raw("app_values", [r["throughput"] for r in app]))
    for name, ref in (("vs_app", app), ("vs_loop", loop)):
        ratio = C.paired_ratio(ours_fps, [r["throughput"] for r in ref])
        row.update(C.ratio_columns(f"fps_{name}", ratio))
        row[f"fps_{name}_text"] = ratio.text()
    if scenario == "latency":
        lat = C.paired_ratio(
            [r["latency_p50_ms"] for r in app], [o["latency_p50_ms"] for o in ours]
        )
        row["ours_p50_ms"] = median(o["latency_p50_ms"] for o in ours)
        row["app_p50_ms"] = median(r["latency_p50_ms"] for r in app)
        row.update({k: v for k, v in C.ratio_columns("p50_vs_app", lat).items() if k != "pairs"})
        row["p50_vs_app_text"] = lat.text()
    C.log(f"  -> {row}")
    return row


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 2.0, 4, "openvino.csv")
    p.add_argument("--models", default=DEFAULT_MODELS, help="';'-separated model specs")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--scenarios", default="throughput,latency")
    p.add_argument("--latency-batch-sizes", default="1", help="batch sizes of the latency rows")
    p.add_argument(
        "--vendor-defaults",
        action="store_true",
        help="run benchmark_app with its own defaults (bf16 where supported, u8 random input)",
    )
    args = p.parse_args()
    from mlflow_ngraph.compilers._export import export_onnx

    rows = []
    for spec in _split_models(args.models):
        model = C.load(spec)
        model_file = export_onnx(model, args.home)
        for scenario in args.scenarios.split(","):
            batches = args.latency_batch_sizes if scenario == "latency" else args.batch_sizes
            for batch in (int(b) for b in batches.split(",")):
                rows.append(run_cell(args, model, model_file, batch, scenario))
    C.print_table(
        rows,
        ["model", "batch", "scenario", "requests", "ours_fps", "loop_fps", "app_fps"]
        + ["fps_vs_app_text", "fps_vs_loop_text", "p50_vs_app_text"],
    )
    C.write_csv(rows, args.csv)


def _split_models(text: str) -> list[str]:
    """Model specs separated by ``;`` or by ``,`` outside a spec's own ``key=value`` list."""
    if ";" in text:
        return [s for s in text.split(";") if s]
    specs: list[str] = []
    for part in text.split(","):
        if "=" in part and specs and ":" in specs[-1]:
            specs[-1] += "," + part
        else:
            specs.append(part)
    return specs


if __name__ == "__main__":
    main()
