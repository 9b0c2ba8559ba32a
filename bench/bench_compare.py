"""How long ``mlflow-ngraph compare`` takes on a tracking server holding 10,000 cell runs.

Starts ``mlflow server`` on 127.0.0.1 (sqlite by default, or PostgreSQL with ``--backend
postgresql``; artifacts proxied by the server), fills an experiment with synthetic benchmark
invocations of 80 cell runs each that follow the schema exactly (params, tags, the runner's
24 per-batch metrics stepped and flat at 5 batch sizes; one ``log_batch`` per run, from a few
threads; each invocation's results index written by the runner's own code), then times
``compare`` over all of them, side by side: reading the indexes (the default) and searching
every cell run (``--live``); in-process (query + tables + render) and as a fresh process
(imports included). The store is reused when it already holds the runs.

Usage::

    .venv/bin/python bench/bench_compare.py                     # sqlite, 10,000 runs
    .venv/bin/python bench/bench_compare.py --backend postgresql
    .venv/bin/python bench/bench_compare.py --runs 2000 --repeat 3

PostgreSQL needs ``psycopg2`` importable by the server. To keep it out of the project's
venv, install it into a folder and pass that folder::

    pip install --target /tmp/pgdeps psycopg2-binary
    .venv/bin/python bench/bench_compare.py --backend postgresql --server-path /tmp/pgdeps
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from mlflow_ngraph.commands.report import parse_tables, run_compare
from mlflow_ngraph.report import render
from mlflow_ngraph.report.query import RunQuery
from mlflow_ngraph.report.tables import DEFAULT_RANGES
from mlflow_ngraph.tracking import index as results_index
from mlflow_ngraph.tracking import schema as S

#: MLflow prints a link for every run terminated on a server: 10,000 lines while filling
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

EXPERIMENT = "bench-compare-indexed"
T_COMPLETE = "bench.complete"  # experiment tag: the number of runs once filling finished
BATCH_SIZES = (1, 2, 4, 8, 16)
PAPER = {
    "resnet": ["resnet18", "resnet50", "resnet101"],
    "efficientnet": ["efficientnet_b3", "efficientnet_b4", "efficientnet_b5"],
    "deit": ["deit3_small_patch16_224", "deit3_medium_patch16_224", "deit3_base_patch16_224"],
    "swin": ["swin_s3_tiny_224", "swin_s3_small_224", "swin_s3_base_224"],
    "convnext": ["convnext_tiny", "convnext_small", "convnext_base"],
}
BLOCKS = {"conv_block": (64, 96, 128, 256), "mha_block": (128, 256, 384, 512)}
COMPILERS = ("identity", "torchscript", "onnxruntime", "openvino", "tensorrt", "tvm")
#: metrics per batch size, as the runner logs them (each stepped and flat)
PER_BATCH = (
    S.M_THROUGHPUT,
    S.M_THROUGHPUT_STD,
    S.M_LATENCY_MEAN,
    S.M_LATENCY_STD,
    S.M_LATENCY_P50,
    S.M_LATENCY_P90,
    S.M_LATENCY_P99,
    S.M_CV,
    S.M_REPETITIONS,
    S.M_DURATION,
    S.M_CPU,
    S.M_RSS,
    S.M_COMPILE,
    S.M_CACHE_HIT,
    S.M_FIRST_INFERENCE,
    S.M_ENGINE_SIZE,
    S.M_MAX_ABS_ERROR,
    S.M_MAX_REL_ERROR,
    S.M_COSINE,
    S.M_VALID,
    S.M_SPEEDUP,
    S.M_RTR,
    S.M_ASE,
    S.M_BSR,
)
#: cell runs per benchmark invocation (the default experiment has 80)
CELLS_PER_BENCHMARK = 80
#: threads logging runs: enough to keep every server worker busy
LOG_THREADS = 8
#: MLflow's default worker count; compare's shard requests run on all of them
SERVER_WORKERS = 4


def models() -> list[tuple[str, str, dict[str, str]]]:
    """(model, family, init params): the paper's 15 models and 48 block configurations."""
    out = [(m, fam, {}) for fam, names in PAPER.items() for m in names]
    for block, widths in BLOCKS.items():
        for width, depth in itertools.product(widths, range(1, 7)):
            out.append((block, block, {"width": str(width), "depth": str(depth)}))
    return out


def cells(count: int) -> list[tuple[str, str, str, dict[str, str], str]]:
    """``count`` cells (device, model, family, params, compiler), devices added as needed."""
    out = []
    for device in (f"device{i:02d}" for i in itertools.count()):
        for (model, family, params), compiler in itertools.product(models(), COMPILERS):
            out.append((device, model, family, params, compiler))
            if len(out) == count:
                return out
    raise AssertionError("unreachable")


def _value(metric: str, batch: int, seed: int) -> float:
    base = 50.0 + seed % 997
    if metric == S.M_THROUGHPUT:
        return base * batch**0.7
    if metric == S.M_VALID:
        return 1.0
    return (base / 10.0) * (1 + batch / 16)


def log_cell(client: MlflowClient, experiment_id: str, parent_id: str, index: int, cell) -> str:
    """One finished cell run with one ``log_batch``; returns its id."""
    device, model, family, params, compiler = cell
    tags = {S.T_ROLE: "cell", S.T_STATUS: S.STATUS_OK, S.T_DEVICE: device, S.T_PARENT: parent_id}
    run = client.create_run(experiment_id, tags=tags)
    now = int(time.time() * 1000)
    metrics = []
    for name, batch in itertools.product(PER_BATCH, BATCH_SIZES):
        value = _value(name, batch, index)
        metrics += [Metric(name, value, now, batch), Metric(S.flat_key(name, batch), value, now, 0)]
    logged = {
        S.P_DEVICE: device,
        S.P_MODEL: model,
        S.P_FAMILY: family,
        S.P_COMPILER: compiler,
        S.P_SCENARIO: "throughput",
        S.P_PARAMETER_COUNT: str(1000 + index % 97),
        **{f"model.{k}": v for k, v in params.items()},
    }
    if compiler != "identity":
        logged["flag.optimization_level"] = "3"
    client.log_batch(
        run.info.run_id,
        metrics=metrics,
        params=[Param(k, v) for k, v in logged.items()],
        tags=[RunTag(S.T_CELL_KEY, f"{device}|{model}|{params}|{compiler}")],
    )
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def log_benchmark(client: MlflowClient, experiment_id: str, first: int, chunk: list) -> None:
    """One benchmark invocation: a parent run, its cell runs, and its results index written
    the way the runner writes it (read back from the server, logged on the parent)."""
    device = chunk[0][0]
    tags = {S.T_ROLE: "benchmark", S.T_DEVICE: device}
    parent_id = client.create_run(experiment_id, tags=tags).info.run_id
    run_ids = [
        log_cell(client, experiment_id, parent_id, first + i, cell) for i, cell in enumerate(chunk)
    ]
    results_index.write(client, parent_id, results_index.snapshot(client, run_ids))
    client.set_terminated(parent_id)


def benchmarks(count: int) -> list[tuple[int, list]]:
    """``count`` cells cut into invocations of one device each, at most
    ``CELLS_PER_BENCHMARK`` cells long: (index of the first cell, cells)."""
    out, chunk, first = [], [], 0
    for i, cell in enumerate(cells(count)):
        if chunk and (len(chunk) == CELLS_PER_BENCHMARK or chunk[0][0] != cell[0]):
            out.append((first, chunk))
            chunk, first = [], i
        chunk.append(cell)
    return out + [(first, chunk)]


def experiment_name(runs: int) -> str:
    return f"{EXPERIMENT}-{runs}"


def populate(client: MlflowClient, runs: int) -> str:
    """The benchmark experiment holding ``runs`` cell runs, filled unless a previous fill
    completed (marked by an experiment tag: counting 10,000 runs would cost a full search)."""
    name = experiment_name(runs)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        if experiment.tags.get(T_COMPLETE) == str(runs):
            print(f"store already holds {runs} cell runs")
            return experiment.experiment_id
        raise SystemExit(f"{name!r} was not filled completely: delete it or use a fresh backend")
    experiment_id = client.create_experiment(name)
    start = time.perf_counter()
    with ThreadPoolExecutor(LOG_THREADS) as pool:
        list(pool.map(lambda job: log_benchmark(client, experiment_id, *job), benchmarks(runs)))
    elapsed = time.perf_counter() - start
    client.set_experiment_tag(experiment_id, T_COMPLETE, str(runs))
    print(f"logged {runs} cell runs in {elapsed:.1f} s ({runs / elapsed:.0f} runs/s)")
    return experiment_id


def start_server(backend_uri: str, port: int, workdir: Path, server_path: str | None):
    env = dict(os.environ)
    if server_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [server_path, env.get("PYTHONPATH")]))
    log = open(workdir / "server.log", "ab")
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(SERVER_WORKERS),
        "--artifacts-destination",
        str(workdir / "artifacts"),
    ]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"mlflow server exited; see {workdir / 'server.log'}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            time.sleep(0.5)
    server.terminate()
    raise SystemExit("mlflow server did not answer /health within 120 s")


def warm_up(uri: str, experiment: str) -> None:
    """Let every server worker open its store once (a fresh worker spends seconds on its
    first request), as on a tracking server that has been up for a while."""
    client = MlflowClient(uri)
    experiment_id = client.get_experiment_by_name(experiment).experiment_id
    start = time.perf_counter()
    with ThreadPoolExecutor(SERVER_WORKERS * 2) as pool:
        list(pool.map(lambda _: client.search_runs([experiment_id], max_results=1), range(16)))
    print(f"  server warm-up (16 one-run searches): {time.perf_counter() - start:.2f} s")


def time_in_process(uri: str, repeat: int, query: RunQuery, live: bool = False) -> list[float]:
    """Seconds for query + every table + terminal rendering, ``repeat`` times."""
    client = MlflowClient(uri)
    names = parse_tables(["all"], "terminal")
    times = []
    for _ in range(repeat):
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        result = run_compare(client, uri, query, names, DEFAULT_RANGES, live=live)
        render.render(result.tables, "terminal")
        times.append(time.perf_counter() - start_wall)
        client_cpu = time.process_time() - start_cpu
    runs = result.frame["run_id"].nunique()
    print(f"  {runs} runs, {len(result.frame)} rows; client CPU {client_cpu:.1f} s (last)")
    return times


def time_subprocess(uri: str, experiment: str) -> float:
    """Seconds for ``compare`` in a fresh interpreter (imports included)."""
    code = "from mlflow_ngraph.commands.report import compare; compare.main()"
    args = [sys.executable, "-c", code, "--tracking-uri", uri, "-e", experiment, "--format", "csv"]
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--backend-uri", help="override the backend store URI")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ngraph-bench-compare"))
    parser.add_argument("--port", type=int, default=5987)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--server-path", help="extra PYTHONPATH for the server (psycopg2)")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    backend = (
        args.backend_uri
        or {
            "sqlite": f"sqlite:///{args.workdir / f'mlflow-{args.runs}.db'}",
            "postgresql": "postgresql+psycopg2://postgres@127.0.0.1:5432/test",
        }[args.backend]
    )
    server = start_server(backend, args.port, args.workdir, args.server_path)
    try:
        uri = f"http://127.0.0.1:{args.port}"
        populate(MlflowClient(uri), args.runs)
        warm_up(uri, experiment_name(args.runs))
        print(f"compare over {args.runs} runs on {args.backend} ({backend}):")
        name = experiment_name(args.runs)
        for label, query in (
            ("all runs", RunQuery(experiments=(name,))),
            ("--device device00", RunQuery(experiments=(name,), devices=("device00",))),
        ):
            for live in (False, True):
                how = "live search (--live)" if live else "results indexes"
                times = time_in_process(uri, 1 if live else args.repeat, query, live)
                print(f"  {label}, {how}, in-process: " + ", ".join(f"{t:.2f} s" for t in times))
        print(f"  fresh process, csv, results indexes: {time_subprocess(uri, name):.2f} s")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
