"""The cost of measuring each cell in its own process: ``--isolation process`` against
``--isolation none``, end to end, side by side.

Both sides run ``mlflow-ngraph benchmark`` (this checkout's package) in a subprocess on the
same spec and the same home: a warm-up run fills the export, engine and reference caches
first, then each run logs into a fresh tracking store (so its journal is fresh and every
cell is measured again, engines coming from the cache). The sides: ``process`` (a worker per
cell, forked from the run's template process, the next one started as a spare while the
current cell runs, paused while it measures), ``process-spawn`` (the same with each worker
its own interpreter importing PyTorch: ``MLFLOW_NGRAPH_WORKER_START=spawn``), ``process-
cold`` (a worker per cell started when the cell starts: ``MLFLOW_NGRAPH_SPARE_WORKER=0``)
and ``none``. The sides take turns and rotate from round to round so that other load hits
all alike; each run is printed with the host's load average before and after it. Reports
each side's median seconds, the median ratio of each process side to ``none`` with its range
over the rounds, and the overhead per cell in seconds.

``--profile`` shows where a worker's time goes instead: the spec's cells run one after the
other through the worker step, in spawned workers (with the spare) and in this process, and
each cell's seconds are split into waiting for the worker (``start``), building the model,
reference outputs, getting the engine, the output check and first inference, measuring, and
the worker's end (from its last result to its process gone).

    python bench/bench_isolation.py                                  # a small grid
    python bench/bench_isolation.py --spec default --device cpu --rounds 2
    python bench/bench_isolation.py --spec default --home ~/iso-home --no-warmup
    python bench/bench_isolation.py --profile --home ~/iso-home
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SMALL = """\
experiment: bench-isolation
models:
  - {name: conv_block, params: {width: 16, depth: 2, image_size: 64}}
  - {name: mha_block, params: {width: 64, depth: 2}}
compilers: [identity, torchscript, onnxruntime, openvino]
batch_sizes: [1, 2]
warmup: 2
repetitions: 10
min_duration: 0.2
"""

SIDES = ("process", "process-spawn", "process-cold", "none")
PHASES = ("start", "build", "reference", "engine", "check", "measure", "end")


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def _run(spec: str, device: str | None, home: Path, store: Path, side: str) -> float:
    isolation = "none" if side == "none" else "process"
    command = [
        sys.executable, "-m", "mlflow_ngraph", "benchmark", "--spec", spec,
        "--home", str(home), "--tracking-uri", f"sqlite:///{store}",
        "--isolation", isolation, "-q",
    ]  # fmt: skip
    if device:
        command += ["--device", device]
    env = {
        **os.environ,
        "MLFLOW_NGRAPH_SPARE_WORKER": "0" if side == "process-cold" else "1",
        "MLFLOW_NGRAPH_WORKER_START": "spawn" if side == "process-spawn" else "forkserver",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.perf_counter()
    # in the store's folder: the runs' artifacts land there, not in the caller's folder
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=store.parent)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"benchmark failed ({side}):\n{done.stderr[-3000:]}")
    return seconds


def _plan(spec: str, device: str | None, home: Path):
    from mlflow_ngraph.console import resolve_spec_path
    from mlflow_ngraph.plan.config import build_spec, load_spec_file
    from mlflow_ngraph.run.runner import plan

    data = load_spec_file(resolve_spec_path(spec))
    if device:
        data["device"] = device
    return plan(build_spec(data), home)


def compare(args, spec: str, home: Path, scratch: Path) -> None:
    sides = [s.strip() for s in args.sides.split(",")]
    unknown = set(sides) - set(SIDES)
    if unknown or "none" not in sides:
        raise SystemExit(f"--sides: one or more of {', '.join(SIDES)}, with none")
    cells = len(_plan(spec, args.device, home).cells)
    if not args.no_warmup:
        load = _load()
        warm = _run(spec, args.device, home, scratch / "warm.db", "none")
        print(f"warm-up (fills the caches): {warm:.1f} s, {cells} cells, load {load}", flush=True)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(args.rounds):
        order = sides[i % len(sides) :] + sides[: i % len(sides)]
        parts = []
        for side in order:
            before = _load()
            seconds = _run(spec, args.device, home, scratch / f"{side}-{i}.db", side)
            times[side].append(seconds)
            parts.append(f"{side} {seconds:.1f} s (load {before} -> {_load()})")
        print(f"round {i + 1}: " + ", ".join(parts), flush=True)
    none = statistics.median(times["none"])
    for side in sides:
        if side == "none":
            continue
        ratios = [p / n for p, n in zip(times[side], times["none"])]
        median = statistics.median(times[side])
        print(
            f"{side}/none: median {statistics.median(ratios):.3f} "
            f"[{min(ratios):.3f}-{max(ratios):.3f}] over {len(ratios)} rounds; "
            f"{median:.1f} s against {none:.1f} s, overhead per cell "
            f"{(median - none) / cells:.2f} s ({cells} cells)"
        )


def _phases(events: list, t0: float, t1: float) -> dict[str, float]:
    """A cell's seconds by phase, from the arrival times of its worker's events."""
    out = dict.fromkeys(PHASES, 0.0)
    at, phase = t0, "start"
    for t, kind, payload in events:
        if kind == "phase" or kind in ("model", "record", "failed"):
            out[phase] += t - at
            at = t
            # after the model is built: the compiler's import, still building; after a
            # result: the engine's close and, after the last one, the worker's end
            phase = payload[1] if kind == "phase" else ("build" if kind == "model" else "end")
    out["end"] += t1 - at
    return out


def profile(args, spec: str, home: Path, scratch: Path) -> None:
    from mlflow_ngraph.run import isolation
    from mlflow_ngraph.run.worker import CellTask, measure_cell

    built = _plan(spec, args.device, home)
    cells = built.cells

    def task(cell) -> CellTask:
        s = built.spec
        return CellTask(
            name=cell.name, model_name=cell.model.name, model_params=dict(cell.model.params),
            compiler=cell.compiler.name, flags=dict(cell.flags), batch_sizes=list(s.batch_sizes),
            device=built.profile.name, device_kind=built.profile.kind, home=str(home),
            measure=s.measure, tolerance=s.tolerance, atol=s.atol, rtol=s.rtol,
            log_file=str(scratch / "worker.log"),
        )  # fmt: skip

    for side in ("process", "none"):
        total = dict.fromkeys(PHASES, 0.0)
        print(f"{side}: seconds per cell by phase (load {_load()})")
        print(f"{'cell':28} {'total':>6} " + " ".join(f"{p:>9}" for p in PHASES))
        t_all = time.perf_counter()
        for i, cell in enumerate(cells):
            events: list = []

            def on_event(kind, payload, events=events):
                events.append((time.perf_counter(), kind, payload))

            following = cells[i + 1] if i + 1 < len(cells) else None
            t0 = time.perf_counter()
            if side == "none":
                measure_cell(task(cell), on_event)
            else:
                ahead = following and isolation.Ahead(
                    following.model.name, following.compiler.name, dict(following.model.params)
                )
                one = task(cell)
                isolation.run_group(
                    [isolation.GroupCell(cell.name, one, on_event)], list(one.batch_sizes),
                    None, one.measure, one.policy(), 0, 1800, [ahead] if ahead else [],
                )  # fmt: skip
            t1 = time.perf_counter()
            split = _phases(events, t0, t1)
            for phase, seconds in split.items():
                total[phase] += seconds
            name = f"{cell.model.name[:12]}/{cell.compiler.name}"
            print(f"{name:28} {t1 - t0:6.2f} " + " ".join(f"{split[p]:9.2f}" for p in PHASES))
        isolation.shutdown()
        print(
            f"{'sum':28} {time.perf_counter() - t_all:6.2f} "
            + " ".join(f"{total[p]:9.2f}" for p in PHASES)
            + f"   (load {_load()})",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", help="spec file or packaged name (default: a small grid)")
    p.add_argument("--device", help="device profile (default: the spec's, else cpu)")
    p.add_argument("--rounds", "--pairs", type=int, default=3, help="rounds of the sides")
    p.add_argument("--sides", default="process,none", help=f"of {', '.join(SIDES)}")
    p.add_argument("--home", type=Path, help="cache home to use (default: a temporary one)")
    p.add_argument("--no-warmup", action="store_true", help="--home's caches are warm already")
    p.add_argument("--profile", action="store_true", help="split each cell's time by phase")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))  # --profile: this checkout's package, in its workers too
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        spec = args.spec
        if spec is None:
            spec = str(scratch / "small.yaml")
            Path(spec).write_text(SMALL)
        home = args.home or scratch / "home"
        (profile if args.profile else compare)(args, spec, home, scratch)


if __name__ == "__main__":
    main()
