"""How long ``mlflow-ngraph pull`` takes on a tracking server holding 10,000 cell runs, and
what loading a pulled engine costs against compiling it again, per compiler.

Starts ``mlflow server`` on 127.0.0.1 (sqlite, artifacts proxied), fills an experiment as
``bench_compare.py`` does (synthetic invocations of 80 cell runs with the runner's metrics
and results indexes; reused when already filled), adds a real tiny benchmark of a conv block
with every CPU compiler that writes an engine to the same experiment, then:

- times ``pull`` end to end as a fresh process (imports, selection from the results
  indexes, download, sha256 verification, move), median of ``--repeat``;
- per compiler, pulls its engine and times ``load_engine`` (files verified, runtime loads the
  engine) against the compile seconds the benchmark logged for a cold compile of the same
  cell: load / compile, below 1 when pulling beats rebuilding.

Usage::

    .venv/bin/python bench/bench_pull.py                  # 10,000 runs (filling ~17 min once)
    .venv/bin/python bench/bench_pull.py --runs 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_compare
from mlflow.tracking import MlflowClient

COMPILERS = ["identity", "torchscript", "onnxruntime", "openvino", "tvm:trials=0"]
MODEL = "conv_block:width=64,depth=3,image_size=64"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=3600,
    )


def real_benchmark(uri: str, experiment: str, home: Path, compilers: list[str]) -> None:
    args = ["benchmark", "--model", MODEL, "--batch-sizes", "1,8", "--warmup", "2"]
    args += ["--repetitions", "10", "--min-duration", "0.2", "--experiment", experiment]
    for compiler in compilers:
        args += ["--compiler", compiler]
    result = cli(*args, "--tracking-uri", uri, env={"MLFLOW_NGRAPH_HOME": str(home)})
    if result.returncode != 0:
        raise SystemExit(f"benchmark failed: {result.stderr[-2000:]}")


def time_pull(uri: str, experiment: str, out: Path, *extra: str) -> float:
    start = time.perf_counter()
    result = cli(
        "pull", "-e", experiment, "--device", "cpu", "--model", "conv_block", *extra,
        "-o", str(out), "--force", "--tracking-uri", uri,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"pull failed: {result.stderr[-2000:]}")
    return elapsed


def load_seconds(directory: Path, repeat: int) -> float:
    """Median seconds of ``load_engine`` in a process that already imported the runtime."""
    code = (
        "import sys, time, json; from mlflow_ngraph import load_engine;"
        "e = load_engine(sys.argv[1], trust_code=True); e.close(); ts = []\n"
        f"for _ in range({repeat}):\n"
        "    t = time.perf_counter(); e = load_engine(sys.argv[1], trust_code=True); "
        "ts.append(time.perf_counter() - t); e.close()\n"
        "print(json.dumps(sorted(ts)[len(ts) // 2]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(directory)], capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        raise SystemExit(f"load failed: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--port", type=int, default=5061)
    parser.add_argument("--workdir", type=Path, default=Path("bench/results/pull-store"))
    parser.add_argument("--inductor", action="store_true", help="also inductor:package=true")
    args = parser.parse_args()
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    backend = f"sqlite:///{workdir / 'mlflow.db'}"
    server = bench_compare.start_server(backend, args.port, workdir, None)
    uri = f"http://127.0.0.1:{args.port}"
    try:
        client = MlflowClient(uri)
        bench_compare.populate(client, args.runs)
        experiment = bench_compare.experiment_name(args.runs)
        compilers = COMPILERS + (["inductor:package=true"] if args.inductor else [])
        home = workdir / "home"
        marker = workdir / f"real-{args.runs}.done"
        if not marker.exists():
            real_benchmark(uri, experiment, home, compilers)
            marker.write_text("done")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "engine"
            times = [time_pull(uri, experiment, out) for _ in range(args.repeat)]
            print(
                f"pull on {args.runs} cell runs + the real cells: median "
                f"{statistics.median(times):.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)})"
            )
            header = f"{'compiler':<12} {'bs':>3} {'load s':>8} {'compile s':>10}"
            print(f"{header} {'load/compile':>13}")
            for name in [c.split(":")[0] for c in compilers if c != "identity"]:
                for batch in (1, 8):
                    target = Path(tmp) / f"{name}-{batch}"
                    extra = ("--compiler", name, "--batch-size", str(batch))
                    time_pull(uri, experiment, target, *extra)
                    source = json.loads((target / "source.json").read_text())
                    run = client.get_run(source["run_id"])
                    compile_s = run.data.metrics.get(f"compile_s.bs{batch}", float("nan"))
                    cold = run.data.metrics.get(f"cache_hit.bs{batch}") == 0.0
                    load_s = load_seconds(target, args.repeat)
                    note = "" if cold else " (logged compile was a cache load)"
                    print(
                        f"{name:<12} {batch:>3} {load_s:>8.3f} {compile_s:>10.3f} "
                        f"{load_s / compile_s:>13.3f}{note}"
                    )
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
