"""Time to result: a first run, its resume, and a re-run on a warm engine cache.

Runs ``mlflow-ngraph benchmark`` in subprocesses on a small spec:

1. ``first``: a fresh home (export and engine caches, journal) and a fresh tracking store;
2. ``resume``: the same command again: every cell is in the journal, nothing is measured;
3. ``warm-cache``: the same home but a new tracking store: every cell is measured again,
   its engine comes from the engine cache (compile seconds should be ~0).

Also times ``mlflow-ngraph --help`` (interpreter start and imports: the floor of any run).
Reports wall seconds, the fraction of the first run, and compile seconds summed over cells
as logged in MLflow (``compile_s``), in total and per compiler, with the cache-hit count.

    python bench/bench_resume.py
    python bench/bench_resume.py --repetitions 3 --keep /tmp/resume
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C

SPEC = """\
experiment: bench-resume
models:
  - resnet18
  - {name: conv_block, params: {width: 32, depth: 2}}
  - {name: mha_block, params: {width: 128, depth: 2}}
compilers: [identity, torchscript, onnxruntime, openvino]
batch_sizes: [1, 4]
warmup: 2
repetitions: 10
min_duration: %(duration)s
"""
CLI = [sys.executable, "-m", "mlflow_ngraph"]


def timed(command: list[str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return elapsed


def compile_seconds(tracking_uri: str) -> dict[str, float]:
    """Compile seconds summed over cells and batch sizes, in total and per compiler, cache
    hits and the count of cells x batch sizes, as logged in ``tracking_uri``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name("bench-resume")
    out: dict[str, float] = {"compile_s": 0.0, "cache_hits": 0, "cells": 0}
    for run in client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'cell'"):
        compiler = f"compile_s.{run.data.params.get('compiler', '?')}"
        for key, value in run.data.metrics.items():
            if key.startswith("compile_s.bs"):
                out["compile_s"] += value
                out[compiler] = out.get(compiler, 0.0) + value
                out["cells"] += 1
            elif key.startswith("cache_hit.bs"):
                out["cache_hits"] += int(value)
    return out


def one_round(workdir: Path, duration: float) -> list[dict]:
    spec = workdir / "spec.yaml"
    spec.write_text(SPEC % {"duration": duration})
    home = workdir / "home"

    def run(store: str) -> tuple[float, str]:
        uri = f"sqlite:///{workdir / store}"
        command = CLI + ["benchmark", "--spec", str(spec), "--home", str(home)]
        return timed(command + ["--tracking-uri", uri, "--no-engine-artifacts", "-q"]), uri

    startup = timed(CLI + ["--help"])
    C.log("first run")
    first, uri = run("first.db")
    C.log("resume")
    resume, _ = run("first.db")
    C.log("warm engine cache, new tracking store")
    warm, warm_uri = run("warm.db")
    rows = []
    for name, seconds, store in (
        ("startup (--help)", startup, None),
        ("first", first, uri),
        ("resume", resume, uri),
        ("warm-cache", warm, warm_uri),
    ):
        row = {"run": name, "wall_s": seconds, "fraction_of_first": seconds / first}
        if store and name != "resume":
            row.update(compile_seconds(store))
        rows.append(row)
    return rows


def main() -> None:
    p = C.parser(__doc__.splitlines()[0], 0.5, 1, "resume.csv")
    p.add_argument("--keep", type=Path, help="keep the homes and stores under this directory")
    args = p.parse_args()
    rows = []
    for i in range(args.repetitions):
        workdir = Path(tempfile.mkdtemp(prefix="ngraph-resume-", dir=args.keep))
        try:
            for row in one_round(workdir, args.duration):
                rows.append({"round": i + 1, **row})
                C.log(str(rows[-1]))
        finally:
            if args.keep is None:
                shutil.rmtree(workdir, ignore_errors=True)
    per_compiler = sorted({k for row in rows for k in row if k.startswith("compile_s.")})
    C.print_table(
        rows,
        ["round", "run", "wall_s", "fraction_of_first", "compile_s", *per_compiler]
        + ["cache_hits", "cells"],
    )
    C.write_csv(rows, args.csv)


if __name__ == "__main__":
    main()
