"""``make gpu-check``: the GPU paths checked end to end on a host with an NVIDIA GPU.

``python -m mlflow_ngraph.commands.gpucheck`` (the Makefile target installs the ``gpu`` extra and
runs the ``gpu``-marked tests first):

1. **The harness waits for the device.** A kernel of known length (``torch.cuda._sleep``,
   timed with CUDA events) is measured through the harness: the per-request time it reads
   must match the events' (0.9x to 1.3x). The same kernel through an engine that does not
   synchronise is measured too, and must read faster than the kernel runs: the check can
   tell a clock that does not wait for the device.
2. **Every GPU compiler on a tiny benchmark.** A conv block and a model with three outputs
   of different shapes at batch sizes 1 and 8, on ``--device gpu`` in strict FP32, from a
   fresh home and a fresh store, through identity, TorchScript, Inductor, ONNX Runtime's
   CUDA and TensorRT providers, TensorRT and TVM; then the conv block at batch size 8 with
   ``--math tf32`` and ``--math fp16`` through the compilers that apply them. One row per
   cell and batch size (compiled, output check, throughput, GPU utilisation inside the
   windows, GPU energy per sample). A compiler not installed here is a line that says so.

Without a CUDA device it says so in one line and exits 1. Exit 0 only when the harness
check passes and every installed compiler compiled and passed its output check.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: (compiler spec, registry name): every compiler that targets ``cuda``
COMPILERS = [
    ("identity", "identity"),
    ("torchscript", "torchscript"),
    ("inductor", "inductor"),
    ("onnxruntime:provider=cuda", "onnxruntime"),
    ("onnxruntime:provider=tensorrt", "onnxruntime"),
    ("tensorrt", "tensorrt"),
    ("tvm:trials=0", "tvm"),
]
MODELS = [
    "conv_block:width=16,depth=2,image_size=32",
    "mlflow_ngraph.models.blocks:heads_block:input_shape=3x16x16",
]
BATCH_SIZES = (1, 8)
#: what the harness may read against the kernel's own length (CUDA events)
WAITS = (0.9, 1.3)
#: the sleep kernel's target length
KERNEL_MS = 2.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlflow_ngraph.commands.gpucheck")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--keep", type=Path, help="keep the home and store here")
    args = parser.parse_args(argv)
    from mlflow_ngraph.devices import cuda_status

    ok, reason = cuda_status()
    if not ok:
        print(
            f"gpu-check: {reason}: run it on a host with an NVIDIA GPU and its driver "
            "(docs/gpu.md)",
            file=sys.stderr,
        )
        return 1
    lines = [f"gpu-check on {reason}"]
    harness_ok = _harness_check(lines)
    work = args.keep or Path(tempfile.mkdtemp(prefix="ngraph-gpu-check-"))
    cells_ok = _benchmark(work, lines)
    verdict = "PASS" if harness_ok and cells_ok else "FAIL"
    lines.append(f"gpu-check: {verdict}")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if verdict == "PASS" else 1


# --- 1. the harness waits for the device --------------------------------------------------


def _harness_check(lines: list[str]) -> bool:
    import numpy as np
    import torch

    from mlflow_ngraph.compilers._torch import TorchCallableEngine
    from mlflow_ngraph.measure import harness
    from mlflow_ngraph.measure.settings import MeasureSettings

    cycles = _cycles_for(KERNEL_MS)
    kernel_ms = _event_ms(cycles)

    class NoWait(TorchCallableEngine):
        def synchronize(self) -> None:  # the defect the check must catch
            pass

    settings = MeasureSettings(warmup=5, repetitions=50, min_duration_s=1.0, max_duration_s=3.0)
    ok = True
    lines.append(f"harness: a sleep kernel of {kernel_ms:.3f} ms (CUDA events)")
    for label, engine_type, must_wait in (
        ("synchronising engine", TorchCallableEngine, True),
        ("engine that does not wait", NoWait, False),
    ):
        engine = engine_type(lambda x: torch.cuda._sleep(cycles), "cuda")
        engine.prepare(np.zeros((1, 1), np.float32))
        m = harness.measure(engine, 1, settings, gpu=True)
        torch.cuda.synchronize()  # drain what the engine that does not wait left queued
        read_ms = 1000.0 / m.throughput
        ratio = read_ms / kernel_ms
        waited = WAITS[0] <= ratio <= WAITS[1]
        good = waited if must_wait else ratio < WAITS[0]
        ok &= good
        gpu = m.gpu or {}
        util = gpu.get("gpu_util_percent")
        verdict = ("ok" if good else "WRONG") + (
            "" if must_wait else (": caught, it reads faster than the kernel runs" if good else "")
        )
        lines.append(
            f"  {label:26s} {read_ms:8.3f} ms a request = {ratio:5.2f}x the kernel, "
            f"GPU util {_fmt(util, '.0f')}% ({_fmt(gpu.get('gpu_util_samples'), '.0f')} "
            f"samples), GPU energy {_fmt((m.energy or {}).get('energy_j_per_sample.gpu'), '.4f')}"
            f" J/request: {verdict}"
        )
    return ok


def _cycles_for(ms: float) -> int:
    """Clock cycles of ``torch.cuda._sleep`` that take about ``ms`` on this GPU."""
    probe = 1_000_000
    return max(1, int(probe * ms / _event_ms(probe)))


def _event_ms(cycles: int, count: int = 20) -> float:
    """The length of one ``torch.cuda._sleep(cycles)`` kernel by CUDA events."""
    import torch

    torch.cuda._sleep(cycles)  # warm
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(count):
        torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / count


# --- 2. every GPU compiler on a tiny benchmark -------------------------------------------


#: the lower-precision passes: the compilers that apply each setting, on the conv block
#: at batch size 8 (the first pass measured every compiler in strict FP32)
MATH_PASSES = {
    "tf32": ["identity", "torchscript", "inductor", "onnxruntime:provider=cuda", "tensorrt"],
    "fp16": ["identity", "torchscript", "inductor", "onnxruntime:provider=tensorrt", "tensorrt"],
}


def _benchmark(work: Path, lines: list[str]) -> bool:
    from mlflow_ngraph.compilers.registry import get_compiler

    specs, missing = [], []
    for spec, name in COMPILERS:
        ok, reason = _available(spec, name, get_compiler)
        (specs if ok else missing).append((spec, reason))
    installed = {s for s, _ in specs}
    home, uri = work / "home", f"sqlite:///{work / 'mlflow.db'}"
    lines.append(f"benchmark: fresh home {home}, store {uri}")
    passes = [("fp32", MODELS, [s for s, _ in specs], BATCH_SIZES)]
    passes += [
        (math, MODELS[:1], [s for s in wanted if s in installed], (8,))
        for math, wanted in MATH_PASSES.items()
    ]
    ok, rows = True, []
    for math, models, compilers, batch_sizes in passes:
        experiment = "gpu-check" if math == "fp32" else f"gpu-check-{math}"
        command = [
            sys.executable, "-m", "mlflow_ngraph", "benchmark", "--device", "gpu",
            "--math", math, *(a for m in models for a in ("--model", m)),
            *(a for s in compilers for a in ("--compiler", s)),
            "--batch-sizes", ",".join(map(str, batch_sizes)), "--experiment", experiment,
            "--tracking-uri", uri, "--home", str(home), "--warmup", "5", "--repetitions", "20",
            "--min-duration", "0.3", "--max-duration", "2", "--stable-retries", "0",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
        with open(work / "benchmark.log", "a") as log:
            log.write(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}\n")
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            lines.append(f"  the {math} benchmark exited {done.returncode}: {tail}")
        found, good = _rows(uri, {_spec_label(s) for s in compilers}, experiment, batch_sizes)
        rows.extend([math, *row] if len(row) > 4 else row for row in found)
        ok &= good and done.returncode == 0
    lines.extend(_table(rows))
    for spec, reason in missing:
        lines.append(f"  {spec:30s} not available here: {reason}")
    return ok


def _available(spec: str, name: str, get_compiler) -> tuple[bool, str]:
    from mlflow_ngraph.errors import NgraphError

    try:
        compiler = get_compiler(name)
    except NgraphError as exc:  # unknown, or a plug-in that fails to load: a row that says so
        return False, str(exc)
    provider = spec.partition("provider=")[2]
    if provider:  # the provider the row names, before the compiler's own (CUDA) check
        try:
            import onnxruntime
        except ImportError as exc:
            return False, f"onnxruntime does not import ({exc})"
        want = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
        if want[provider] not in onnxruntime.get_available_providers():
            return False, f"this onnxruntime has no {want[provider]} (pip install onnxruntime-gpu)"
    return compiler.availability("cuda")


def _rows(
    uri: str, labels: set[str], experiment: str = "gpu-check", batch_sizes=BATCH_SIZES
) -> tuple[list[list[str]], bool]:
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import schema as S

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return [], False
    runs = [
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    ]
    rows, ok = [], bool(runs)
    seen = set()
    for run in sorted(runs, key=lambda r: (r.data.params.get("model", ""), _label(r))):
        label = _label(run)
        seen.add(label)
        status = run.data.tags.get(S.T_STATUS, "?")
        steps = {
            key: _stepped(client, run.info.run_id, key)
            for key in (S.M_GPU_UTIL, S.M_GPU_UTIL_SAMPLES, "energy_j_per_sample.gpu")
        }
        for b in batch_sizes:
            metrics = run.data.metrics
            valid = metrics.get(S.flat_key(S.M_VALID, b))
            throughput = metrics.get(S.flat_key(S.M_THROUGHPUT, b))
            check = "VALID" if valid == 1.0 else "INVALID" if valid == 0.0 else "-"
            ok &= status == "OK" and valid == 1.0
            rows.append([
                _model_label(run.data.params.get("model", "?")), label, str(b),
                "yes" if throughput is not None else "no: " + status, check,
                _fmt(throughput, ",.0f"), _fmt(steps[S.M_GPU_UTIL].get(b), ".0f"),
                _fmt(steps[S.M_GPU_UTIL_SAMPLES].get(b), ".0f"),
                _fmt(steps["energy_j_per_sample.gpu"].get(b), ".2e"),
            ])  # fmt: skip
            if status != "OK":
                error = (run.data.tags.get(S.T_ERROR) or "").splitlines()[:1]
                rows.append(["", "", "", f"  {error[0][:150] if error else status}"])
                break
    return rows, ok and labels <= seen


def _model_label(model: str) -> str:
    """``pkg.module:factory:k=v`` -> ``factory``; a registered name stays as it is."""
    head, _, rest = model.partition(":")
    return (rest.partition(":")[0] if "." in head and rest else head)[:24]


def _spec_label(spec: str) -> str:
    """``onnxruntime:provider=cuda`` -> ``onnxruntime:cuda``, ``tvm:trials=0`` -> ``tvm``: the
    label :func:`_label` gives its cells."""
    provider = spec.partition("provider=")[2].split(",")[0]
    name = spec.split(":")[0]
    return f"{name}:{provider}" if provider else name


def _label(run) -> str:
    params = run.data.params
    provider = params.get("flag.provider")
    return params.get("compiler", "?") + (f":{provider}" if provider else "")


def _stepped(client, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def _table(rows: list[list[str]]) -> list[str]:
    head = ["math", "model", "compiler", "bs", "compiled", "output", "samples/s", "util%", "n",
            "J/sample"]  # fmt: skip

    def line(cells: list[str]) -> str:
        widths = [5, 12, 22]
        return "  " + "  ".join(
            f"{v:{widths[i]}s}" if i < 3 else f"{v:>9s}" for i, v in enumerate(cells)
        )

    # a row of four is the reason a cell failed, under its row
    return [line(head)] + ["    " + row[3] if len(row) == 4 else line(row) for row in rows]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


if __name__ == "__main__":
    sys.exit(main())
