"""How good and how costly is ``mlflow-ngraph tune`` on this host? Three figures, each
printed with the 1-minute load average beside it:

1. ``defaults``: for each model, a tune with a budget (15 minutes by default) at batch
   sizes 1 and 8; then the winner and every compiler's default configuration measured
   together in one interleaved group at the winner's batch size: the winner's throughput
   over the best default's, from their paired speedups, with an interval.
2. ``grid``: a small space (ONNX Runtime intra-op threads x execution mode x optimization
   level, OpenVINO hint x streams; one model, batch 1) measured exhaustively, every point
   paired with identity; then tunes of ``--trials`` points (several seeds). The share of the
   grid's best that each tune's pick reaches (read on the grid's own figures, so the host's
   drift between the two does not enter) and the share of the grid it measured. Target: at
   least 95% of the best in at most 30% of the grid.
3. from the same runs: what a trial costs beyond its own measured windows (workers, compile,
   output check, store writes), per trial.

    python bench/bench_tune.py defaults --budget 15m
    python bench/bench_tune.py grid --trials 12 --seeds 3
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

DEFAULT_MODELS = ["resnet18", "conv_block:width=64,depth=3"]


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def cli(*args: str, home: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(home), "PYTHONPATH": str(REPO)}
    for name in list(env):  # the test suite's shortcuts must not reach a measured run
        if name.startswith(("MLFLOW_NGRAPH_BENCHMARK_", "MLFLOW_NGRAPH_TUNE_")):
            env.pop(name)
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", *args], cwd=cwd, env=env, capture_output=True,
        text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"mlflow-ngraph {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def trials_of(uri: str, experiment: str) -> tuple[list[dict], str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    [run] = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'tune'")
    path = client.download_artifacts(run.info.run_id, "trials.json", tempfile.mkdtemp())
    return json.loads(Path(path).read_text()), run.info.run_id


def defaults(args) -> None:
    for model in args.models:
        work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
        uri = f"sqlite:///{work / 'mlflow.db'}"
        before = load()
        t0 = time.perf_counter()
        done = cli("tune", "--model", model, "--batch-sizes", "1,8", "--budget", args.budget,
                   "--tracking-uri", uri, "--experiment", "tune",
                   home=work / "home", cwd=work)  # fmt: skip
        seconds = time.perf_counter() - t0
        (work / "tune.txt").write_text(done.stdout)
        print(f"   the tune's transcript: {work / 'tune.txt'}; its store: {uri}")
        trials, _ = trials_of(uri, "tune")
        finals = [t for t in trials if t["stage"] == "final" and t["feasible"]]
        winner = max(finals, key=lambda t: t["throughput"] or 0)
        b = winner["batch_size"]
        compilers = [winner["compiler"] + _pins(winner["flags"])]
        compilers += sorted({t["compiler"] for t in trials})  # each compiler's defaults
        args_ = ["benchmark", "--model", model, "--batch-sizes", str(b), "--compiler", "identity"]
        for c in compilers:
            args_ += ["--compiler", c]
        cli(*args_, "--tracking-uri", uri, "--experiment", "versus", "-q", home=work / "home",
            cwd=work)  # fmt: skip
        rows = _compare(uri, "versus", work)
        mine = next(r for r in rows if _same(r, winner))
        rest = [r for r in rows if r is not mine and r["compiler"] != "identity"
                and r.get("speedup") and r.get("status") == "OK"]  # fmt: skip
        best = max(rest, key=lambda r: r["speedup"])
        ratio = mine["speedup"] / best["speedup"]
        low = mine["speedup_ci_low"] / best["speedup_ci_high"]
        high = mine["speedup_ci_high"] / best["speedup_ci_low"]
        searched = sum(t["stage"] == "search" for t in trials)
        print(
            f"1. {model}: tune ({args.budget}, {searched} trials, {seconds:.0f} s) winner "
            f"{winner['compiler']}{_pins(winner['flags'])} bs{b}: {ratio:.3f}x the best "
            f"default ({best['compiler']}) [{low:.3f}-{high:.3f}]  (load {before} -> {load()})",
            flush=True,
        )


def _pins(flags: dict) -> str:
    items = [f"{k}={v}" for k, v in flags.items() if v is not None]
    return (":" + ",".join(items)) if items else ""


def _same(row: dict, trial: dict) -> bool:
    return (
        row["compiler"].split("[")[0] == trial["compiler"]
        and row.get("flags")
        and all(
            str(row["flags"].get(k)) == str(v) for k, v in trial["flags"].items() if v is not None
        )
    )


def _compare(uri: str, experiment: str, cwd: Path) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", "compare", "--tracking-uri", uri, "-e",
         experiment, "--format", "json", "--live"],
        cwd=cwd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    data = json.loads(done.stdout)
    rows = data if isinstance(data, list) else data["cells"]
    for row in rows:
        if isinstance(row.get("flags"), str):
            row["flags"] = json.loads(row["flags"] or "{}")
    return rows


def grid_space():
    """ONNX Runtime threads x mode x level, OpenVINO hint x streams."""
    from mlflow_ngraph.compilers.base import HostLimits, Knob
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.tune.space import CompilerSpace, SearchSpace

    host = HostLimits.here()
    ort, ov = get_compiler("onnxruntime"), get_compiler("openvino")
    space = SearchSpace()
    space.spaces["onnxruntime"] = CompilerSpace(ort, {}, [
        Knob("graph_optimization_level", ("basic", "extended", "all")),
        Knob("intra_op_num_threads", (0, *host.counts())),
        Knob("execution_mode", ("sequential", "parallel")),
    ])  # fmt: skip
    space.spaces["openvino"] = CompilerSpace(ov, {}, [
        Knob("PERFORMANCE_HINT", ("THROUGHPUT", "LATENCY")),
        Knob("NUM_STREAMS", (None, *host.counts())),
    ])  # fmt: skip
    return space


def _tune(work: Path, model: str, **kw):
    from mlflow_ngraph.config import CompilerSpec, MeasureSettings, ModelSpec, split_name_args
    from mlflow_ngraph.tune.search import Tune
    from mlflow_ngraph.tune.settings import TuneSettings

    os.environ["MLFLOW_NGRAPH_HOME"] = str(work / "home")
    settings = TuneSettings(
        model=ModelSpec(*split_name_args(model, "model")), device="cpu",
        compilers=[CompilerSpec("onnxruntime"), CompilerSpec("openvino")], batch_sizes=[1],
        budget_s=None, experiment=kw.pop("experiment"),
        measure=MeasureSettings(warmup=3, repetitions=10, min_duration_s=0.5), **kw,
    )  # fmt: skip
    job = Tune(settings, work / "home", f"sqlite:///{work / 'mlflow.db'}", say=lambda s: None)
    job.prepare()
    job.space = grid_space()
    return job


def grid(args) -> None:
    from mlflow_ngraph.tune.trials import Trial

    # with --work, a grid measured before is read from its journal, not measured again
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-tune-grid-"))
    points = grid_space().grid()
    before = load()
    t0 = time.perf_counter()
    job = _tune(work, args.model, experiment="grid", max_trials=len(points), finalists=1)
    job._open_run()
    for i in range(0, len(points), 2):
        batch = [Trial(i + j, 1, n, f, None, i // 2) for j, (n, f) in enumerate(points[i : i + 2])]
        job.trials += batch
        began = time.perf_counter()
        job._run_benchmark(batch, 1, i // 2, job.settings.measure, job.precision)
        job._read_results(batch, 1)
        job.journal.append("spent", seconds=time.perf_counter() - began, group=i // 2)
    grid_s = time.perf_counter() - t0
    value = {t.config(): t.speedup for t in job.trials if t.status == "OK" and t.speedup}
    best_config = max(value, key=value.get)
    print(f"2. grid: {len(points)} points in {grid_s:.0f} s, best {best_config[0]} "
          f"{best_config[1]}: {value[best_config]:.3f}x  (load {before} -> {load()})")  # fmt: skip
    _cost(job, "grid")
    shares = []
    for seed in range(args.seeds):
        # the tune's trials are cells of the grid (same settings): it reads their figures
        # from the grid's journal, and measures only its finalists again
        tuned = _tune(work, args.model, experiment=f"tune-{args.trials}-{seed}",
                      max_trials=args.trials, seed=seed, finalists=3, patience=10**6)  # fmt: skip
        tuned.run()
        finals = [t for t in tuned.trials if t.stage == "final" and t.feasible and t.speedup]
        pick = max(finals, key=lambda t: t.speedup) if finals else None
        searched = sum(t.stage == "search" for t in tuned.trials)
        reached = value.get(pick.config(), 0.0) / value[best_config] if pick else 0.0
        shares.append(reached)
        print(f"   seed {seed}: {searched} trials ({100 * searched / len(points):.0f}% of the "
              f"grid), pick {pick.label if pick else '-'}: {100 * reached:.1f}% of the grid's "
              f"best (on the grid's figures)  (load {load()})", flush=True)  # fmt: skip
        _cost(tuned, f"tune seed {seed}")
    print(f"   median share of the best reached: {100 * statistics.median(shares):.1f}% "
          f"(target >= 95% in <= 30% of the grid)")  # fmt: skip


def _cost(job, label: str) -> None:
    """Wall seconds per trial beyond every window measured in its groups (its own and the
    identity reference's)."""
    spent = [r for r in job.journal.records() if r.get("kind") == "spent"]
    wall = sum(float(r["seconds"]) for r in spent)
    trials = [t for t in job.trials if t.status is not None]
    own = sum(float(t.metrics.get("duration_s") or 0.0) for t in trials)
    reference = sum(
        float((r.get("metrics") or {}).get("duration_s") or 0.0) for r in job.references.values()
    )
    n = max(len(trials), 1)
    print(f"3. {label}: {wall / n:.1f} s of wall time per trial; its own windows "
          f"{own / n:.1f} s, the reference's share {reference / n:.1f} s; beyond them "
          f"{(wall - own - reference) / n:.1f} s (workers, compiles, checks, store writes; "
          f"{len(spent)} groups)")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["defaults", "grid"])
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    p.add_argument("--model", default="conv_block:width=64,depth=3")
    p.add_argument("--budget", default="15m")
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--work", type=Path, help="the folder of a grid measured before")
    args = p.parse_args()
    defaults(args) if args.what == "defaults" else grid(args)


if __name__ == "__main__":
    main()
