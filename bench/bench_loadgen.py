"""LoadGen against the tool's own figures, on this host (issue 40).

1. Offline samples/s (the real LoadGen driving the engine) over the tool's throughput
   figure for the same engine, interleaved: resnet18 and a conv block, ONNX Runtime and
   OpenVINO. Target 0.95-1.05.
2. The Server scenario's QPS at p99 <= --bound ms for resnet18 on each CPU compiler and
   eager, with the seconds each cell took (target: under 5 minutes a cell).
3. The served Server QPS over the in-process one for --served-compiler's resnet18 engine at
   batch 1 (the bench benchmarks, registers and serves it in a store of its own), and where
   the difference goes: one request at a time, the engine alone, MLflow's pyfunc of the
   registered model, and the served model over HTTP.
4. LoadGen's SingleStream p90 over the tool's latency scenario p90 on the same engine
   (latency profile, batch 1), interleaved: the models of part 1, ONNX Runtime and OpenVINO;
   both LoadGen's early-stopping estimate (its reported figure: an upper bound, near the max
   with few queries) and the p90 its run measured.

    nice python bench/bench_loadgen.py [--parts 1,2,3,4] [--min-duration 10]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from _common import DEFAULT_HOME, RESULTS_DIR, harness, load, log, print_table, write_csv

from mlflow_ngraph.loadgen.cell import LoadgenTask, server_search
from mlflow_ngraph.loadgen.runners import EngineRunner, HttpRunner, probe
from mlflow_ngraph.loadgen.settings import QSL_SAMPLES, LoadgenSettings
from mlflow_ngraph.loadgen.sut import calibrate, run_scenario
from mlflow_ngraph.run.supply import EngineSupply

CONV = "conv_block:width=64,depth=3,image_size=112"


def engine_of(spec: str, compiler: str, profile: str, home: Path, batch: int = 1):
    """The engine `benchmark` and `loadgen` get from the cache for this cell."""
    from mlflow_ngraph.compilers.registry import get_compiler

    model, c = load(spec), get_compiler(compiler)
    supply = EngineSupply(home, "cpu", "cpu", profile)
    flags = c.resolve_flags(c.math_flags("fp32"))
    engine = supply.get(c, flags, model, batch, f"{spec} {compiler}").engine
    engine.prepare(model.random_input(batch))  # the tool's measured input, as EngineRunner's
    return model, engine


def load_now() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


def offline_ratio(args, home: Path) -> list[dict]:
    rows = []
    for spec in args.models:
        for compiler in ("onnxruntime", "openvino"):
            model, engine = engine_of(spec, compiler, "throughput", home)
            settings = LoadgenSettings(("offline",), min_duration_s=args.min_duration)
            ratios = []
            for rep in range(args.repetitions):
                tool = harness(engine, 1, "throughput", args.min_duration, 1)["throughput"]
                runner = EngineRunner(engine, model.random_input(1), 1)
                pace = calibrate(runner)
                out = Path(args.out) / f"offline-{compiler}-{rep}"
                result = run_scenario(runner, "offline", settings, out, pace)
                lg = result.figures.get("offline.samples_per_s") if result.valid else None
                ratios.append(lg / tool if lg else None)
                log(f"{spec} {compiler}: LoadGen offline {lg} vs tool {tool:.1f} ({load_now()})")
            engine.close()
            ok = [r for r in ratios if r]
            rows.append({"model": spec, "compiler": compiler, "offline/tool": (
                f"{sorted(ok)[len(ok) // 2]:.3f}" if ok else "INVALID"), "runs": len(ratios),
                "host": load_now()})  # fmt: skip
    return rows


def server_cells(args, home: Path) -> list[dict]:
    rows = []
    settings = LoadgenSettings(
        ("server",), args.bound, min_duration_s=args.min_duration, server_steps=args.steps
    )
    for compiler in args.compilers:
        t0 = time.perf_counter()
        model, engine = engine_of("resnet18", compiler, "throughput", home)
        runner = EngineRunner(engine, model.random_input(1), 1)
        result = search(runner, settings, f"resnet18 {compiler}", Path(args.out) / compiler)
        engine.close()
        rows.append(server_row(compiler, result, time.perf_counter() - t0))
    return rows


def search(runner, settings, name: str, out: Path):
    task = LoadgenTask(name, "", {}, "", {}, "cpu", "cpu", "", settings, ["server"], str(out))
    return server_search(task, runner, calibrate(runner), out)


def server_row(label: str, result, seconds: float) -> dict:
    f = result.figures
    return {"cell": label, "server QPS": f"{f['server.qps']:.1f}" if result.valid else "INVALID",
            "p99 ms": f"{f['server.p99_ms']:.1f}" if result.valid else "-",
            "steps": int(f.get("server.search_steps", 0)), "seconds": f"{seconds:.0f}",
            "host": load_now(), "why": "" if result.valid else result.reason[:80]}  # fmt: skip


def latency_p90(engine, duration_s: float) -> float:
    """The tool's latency scenario on the engine: its p90 of one request, ms."""
    from mlflow_ngraph.measure.harness import measure
    from mlflow_ngraph.measure.rounds import RoundPolicy
    from mlflow_ngraph.measure.settings import MeasureSettings

    settings = MeasureSettings(scenario="latency", warmup=10, repetitions=1,
                               min_duration_s=duration_s)  # fmt: skip
    policy = RoundPolicy(min_rounds=1, precision=0.0, max_s=duration_s)
    return measure(engine, 1, settings, policy=policy).latency_p90_ms


def median_text(ratios: list) -> str:
    ok = sorted(r for r in ratios if r)
    return f"{ok[len(ok) // 2]:.3f}" if ok else "INVALID"


def single_stream_fidelity(args, home: Path) -> list[dict]:
    """LoadGen's SingleStream p90 (its early-stopping estimate) over the tool's latency
    scenario p90 on the same engine (the latency profile, batch 1), interleaved."""
    rows = []
    settings = LoadgenSettings(("singlestream",), min_duration_s=args.min_duration)
    for spec in args.models:
        for compiler in ("onnxruntime", "openvino"):
            model, engine = engine_of(spec, compiler, "latency", home)
            estimate, measured = [], []
            for rep in range(args.repetitions):
                tool = latency_p90(engine, args.min_duration)
                runner = EngineRunner(engine, model.random_input(1), 1)
                out = Path(args.out) / f"single-{compiler}-{rep}"
                result = run_scenario(runner, "singlestream", settings, out, calibrate(runner))
                f = result.figures if result.valid else {}
                est, raw = f.get("singlestream.p90_ms"), f.get("singlestream.p90_measured_ms")
                estimate.append(est / tool if est and tool else None)
                measured.append(raw / tool if raw and tool else None)
                log(f"{spec} {compiler}: LoadGen p90 estimate {est} ms, measured {raw} ms; tool "
                    f"{tool:.3f} ms; {int(f.get('singlestream.queries', 0))} queries "
                    f"({load_now()})")  # fmt: skip
            engine.close()
            rows.append({"model": spec, "compiler": compiler,
                         "estimate/tool p90": median_text(estimate),
                         "measured/tool p90": median_text(measured), "runs": len(estimate),
                         "host": load_now()})  # fmt: skip
    return rows


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "mlflow_ngraph", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {done.stderr[-1500:]}")
    return done


@contextmanager
def serving(compiler: str, home: Path, work: Path):
    """(the URL, the model URI) of a `mlflow-ngraph serve` of resnet18's ``compiler``
    engine at batch 1, started here as a user would: a short benchmark (its engine from the
    cache) into a store of its own, `register`, `serve`; stopped afterwards."""
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {"MLFLOW_NGRAPH_HOME": str(home), "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
    cli("benchmark", "--model", "resnet18", "--compiler", compiler, "--batch-sizes", "1",
        "--min-duration", "1", "--max-duration", "3", "--experiment", "served",
        "--tracking-uri", uri, "--busy-ok", env=env)  # fmt: skip
    cli("register", "-e", "served", "--device", "cpu", "--model", "resnet18", "--compiler",
        compiler, "--batch-size", "1", "--name", "served", "--allow-unsigned",
        "--tracking-uri", uri, env=env)  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow_ngraph", "serve", "models:/served@cpu", "-p", str(port),
         "--tracking-uri", uri, "--allow-unsigned"],
        env={**os.environ, **env}, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                probe(url, 2.0)
                break
            except Exception as exc:
                if server.poll() is not None or time.time() > deadline:
                    tail = server.stderr.read()[-1500:]
                    raise SystemExit(f"serve did not start: {tail}") from exc
                time.sleep(1)
        yield url, uri
    finally:
        server.terminate()
        server.wait(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median_ms(call, n: int = 200) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def where_it_goes(engine, model, url: str, uri: str) -> dict:
    """One request at a time, median ms: the engine alone, MLflow's pyfunc of the
    registered model in this process (its input check and conversion), and the served model
    over HTTP (the JSON, the scoring server, the connection)."""
    import mlflow

    from mlflow_ngraph.deploy.signed import ALLOW_UNSIGNED_ENV

    os.environ[ALLOW_UNSIGNED_ENV] = "1"  # the engine this bench benchmarked and registered
    x = model.random_input(1)
    mlflow.set_tracking_uri(uri)
    pyfunc = mlflow.pyfunc.load_model("models:/served@cpu")
    http = HttpRunner(url, model.random_input(QSL_SAMPLES), 1, slots=1)
    t_engine = median_ms(lambda: engine.infer_in(0))
    t_pyfunc = median_ms(lambda: pyfunc.predict(x))
    t_http = median_ms(lambda: http.run(0, [0]))
    return {"engine ms": f"{t_engine:.2f}", "pyfunc ms": f"{t_pyfunc:.2f}",
            "served ms": f"{t_http:.2f}", "pyfunc cost": f"{t_pyfunc - t_engine:.2f}",
            "HTTP+JSON cost": f"{t_http - t_pyfunc:.2f}", "host": load_now()}  # fmt: skip


def served(args, home: Path) -> tuple[list[dict], list[dict]]:
    """Served (HTTP) against in-process Server QPS for one engine, and where the
    difference goes (a `serve` of its own)."""
    settings = LoadgenSettings(
        ("server",), args.bound, min_duration_s=args.min_duration, server_steps=args.steps
    )
    model, engine = engine_of("resnet18", args.served_compiler, "throughput", home)
    t0 = time.perf_counter()
    here = search(EngineRunner(engine, model.random_input(1), 1), settings, "in-process",
                  Path(args.out) / "inproc")  # fmt: skip
    rows = [server_row(f"in-process {args.served_compiler}", here, time.perf_counter() - t0)]
    work = Path(tempfile.mkdtemp(prefix="bench-served-"))
    with serving(args.served_compiler, home, work) as (url, uri):
        http = HttpRunner(url, model.random_input(QSL_SAMPLES), 1)
        http.check()
        t0 = time.perf_counter()
        there = search(http, settings, "served", Path(args.out) / "served")
        rows.append(server_row(f"served {args.served_compiler}", there, time.perf_counter() - t0))
        costs = [where_it_goes(engine, model, url, uri)]
    engine.close()
    if here.valid and there.valid:
        rows[-1]["why"] = (
            f"served/in-process {there.figures['server.qps'] / here.figures['server.qps']:.3f}"
        )
    return rows, costs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="1,2,3,4")
    p.add_argument("--models", nargs="+", default=["resnet18", CONV])
    p.add_argument(
        "--compilers",
        nargs="+",
        default=["identity", "torchscript", "inductor", "onnxruntime", "openvino"],
    )
    p.add_argument("--min-duration", type=float, default=10.0)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--bound", type=float, default=50.0)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--served-compiler", default="onnxruntime")
    p.add_argument("--out", default="/tmp/bench-loadgen")
    args = p.parse_args()
    home, parts = DEFAULT_HOME, args.parts.split(",")
    if "1" in parts:
        rows = offline_ratio(args, home)
        print_table(rows, list(rows[0]))
        write_csv(rows, RESULTS_DIR / "loadgen_offline.csv")
    if "2" in parts:
        rows = server_cells(args, home)
        print_table(rows, list(rows[0]))
        write_csv(rows, RESULTS_DIR / "loadgen_server.csv")
    if "4" in parts:
        rows = single_stream_fidelity(args, home)
        print_table(rows, list(rows[0]))
        write_csv(rows, RESULTS_DIR / "loadgen_singlestream.csv")
    if "3" in parts:
        rows, costs = served(args, home)
        print_table(rows, list(rows[0]))
        print_table(costs, list(costs[0]))
        write_csv(rows, RESULTS_DIR / "loadgen_served.csv")


if __name__ == "__main__":
    main()
