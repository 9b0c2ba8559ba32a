"""How good and how costly is ``mlflow-ngraph tune`` on this host? Three figures, each
printed with the 1-minute load average beside it:

1. ``defaults``: for each model, a tune with a budget (15 minutes by default) at batch
   sizes 1 and 8; then, at each batch size, the tune's best there and every compiler's
   default configuration measured together in one interleaved group: the tune's best's
   throughput over the best default's, from their paired speedups, with an interval.
2. ``grid``: a small space (ONNX Runtime intra-op threads x execution mode x optimization
   level, OpenVINO hint x streams; one model, batch 1) measured exhaustively, every point
   paired with identity; then tunes of ``--trials`` points (several seeds). The share of the
   grid's best that each tune's pick reaches, read twice: on the grid's own figures, and
   head to head (the grid's ``--top`` best and every pick measured again together in one
   interleaved group, so neither the host's drift nor the largest-of-many-noisy-figures
   bias of the grid's best enters); and the share of the grid it measured. Target: at
   least 95% of the best in at most 30% of the grid.
3. from the same runs: what a trial costs beyond its own measured windows (workers, compile,
   output check, store writes), per trial.

    python bench/bench_tune.py defaults --budget 15m
    python bench/bench_tune.py grid --trials 7 --seeds 3
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
    from mlflow_ngraph.tune.trials import TuneJournal

    for model in args.models:
        # with --work, the tune of a model run before resumes there (it is not measured again)
        if args.work:
            work = (args.work / model.replace(":", "-").replace(",", "-")).resolve()
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(tempfile.mkdtemp(prefix="bench-tune-"))
        uri = f"sqlite:///{work / 'mlflow.db'}"
        t0 = time.perf_counter()
        done = cli("tune", "--model", model, "--batch-sizes", "1,8", "--budget", args.budget,
                   "--tracking-uri", uri, "--experiment", "tune",
                   home=work / "home", cwd=work)  # fmt: skip
        seconds = time.perf_counter() - t0
        (work / "tune.txt").write_text(done.stdout)
        print(f"   the tune's transcript: {work / 'tune.txt'}; its store: {uri}")
        trials, _ = trials_of(uri, "tune")
        searched = sum(t["stage"] == "search" for t in trials)
        # a resumed tune: the seconds its groups took in every invocation
        spent = sum(
            TuneJournal(work / "home", path.stem).load()[1]
            for path in (work / "home" / "tunes").glob("*.jsonl")
        )
        finals = [t for t in trials if t["stage"] == "final" and t["feasible"]]
        winner = max(finals, key=lambda t: t["throughput"] or 0)
        print(f"1. {model}: tune ({args.budget}, {searched} trials, {seconds:.0f} s this time, "
              f"{spent:.0f} s in its search groups, load {load()}); its winner "
              f"{_label(winner)} at bs{winner['batch_size']}")  # fmt: skip
        for b in sorted({t["batch_size"] for t in finals}):
            _versus(model, b, trials, finals, work, uri)


def _versus(model: str, b: int, trials: list, finals: list, work: Path, uri: str) -> None:
    """The tune's best at ``b`` and every compiler's default configuration, measured
    together in one interleaved group at ``b``: the best's share of the best default."""
    before = load()
    best_final = max((t for t in finals if t["batch_size"] == b), key=lambda t: t["speedup"])
    compilers = [best_final["compiler"] + _pins(best_final["flags"])]
    compilers += sorted({t["compiler"] for t in trials})  # each compiler's defaults
    args_ = ["benchmark", "--model", model, "--batch-sizes", str(b), "--compiler", "identity"]
    for c in compilers:
        args_ += ["--compiler", c]
    experiment = f"tuned-vs-defaults-bs{b}"
    cli(*args_, "--tracking-uri", uri, "--experiment", experiment, "-q", home=work / "home",
        cwd=work)  # fmt: skip
    rows = _compare(uri, experiment, work)
    compiled = [r for r in rows if r["compiler"] != "identity" and r.get("status") == "OK"]
    matches = [r for r in compiled if _same(r, best_final)]
    if len(matches) != 1:
        print(f"   bs{b}: the tune's best is {len(matches)} rows of the comparison: not judged")
        return
    mine = matches[0]
    # the group holds the tune's best and each compiler's default configuration (one cell
    # where the best is a default one)
    default_best = _label(best_final).endswith("{defaults}")
    defaults_ = [r for r in compiled if r.get("speedup") and (default_best or r is not mine)]
    best = max(defaults_, key=lambda r: r["speedup"])
    ratio = mine["speedup"] / best["speedup"]
    if best is mine:  # the tune's best is a default configuration: nothing gained
        low = high = 1.0
    else:
        low = mine["speedup_ci_low"] / best["speedup_ci_high"]
        high = mine["speedup_ci_high"] / best["speedup_ci_low"]
    print(
        f"   bs{b}: the tune's best {_label(best_final)}: {mine['speedup']:.3f}x over eager; "
        f"the best default {best['compiler']}: {best['speedup']:.3f}x; ratio {ratio:.3f}x "
        f"[{low:.3f}-{high:.3f}]  (load {before} -> {load()})",
        flush=True,
    )


def _label(trial: dict) -> str:
    from mlflow_ngraph.tune.trials import short_flags

    return f"{trial['compiler']}{{{short_flags(trial['flags'], trial['compiler'])}}}"


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
        if isinstance(row.get("flags"), str):  # compare's k=v,k=v
            row["flags"] = dict(item.split("=", 1) for item in row["flags"].split(",") if item)
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
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.plan.config import CompilerSpec, ModelSpec, split_name_args
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
        job.bench.measure(batch, 1, i // 2, job.settings.measure, job.precision)
        job.bench.read(batch, 1)
        job.journal.append("spent", seconds=time.perf_counter() - began, group=i // 2)
    grid_s = time.perf_counter() - t0
    value = {t.config(): t.speedup for t in job.trials if t.status == "OK" and t.speedup}
    best_config = max(value, key=value.get)
    print(f"2. grid: {len(points)} points in {grid_s:.0f} s, best {best_config[0]} "
          f"{best_config[1]}: {value[best_config]:.3f}x  (load {before} -> {load()})")  # fmt: skip
    _cost(job, "grid")
    shares, picks = [], []
    for seed in range(args.seeds):
        # the tune measures its own trials in its own experiment (their engines come from
        # the grid's cache); its pick is judged on the grid's figures, then head to head
        tuned = _tune(work, args.model, experiment=f"tune-{args.trials}-{seed}",
                      max_trials=args.trials, seed=seed, finalists=3, patience=10**6)  # fmt: skip
        tuned.run()
        finals = [t for t in tuned.trials if t.stage == "final" and t.feasible and t.speedup]
        pick = max(finals, key=lambda t: t.speedup) if finals else None
        searched = sum(t.stage == "search" for t in tuned.trials)
        reached = value.get(pick.config(), 0.0) / value[best_config] if pick else 0.0
        shares.append(reached)
        picks.append(pick)
        print(f"   seed {seed}: {searched} trials ({100 * searched / len(points):.0f}% of the "
              f"grid), pick {pick.label if pick else '-'}: {100 * reached:.1f}% of the grid's "
              f"best (on the grid's figures)  (load {load()})", flush=True)  # fmt: skip
        _cost(tuned, f"tune seed {seed}")
    print(f"   median share of the best reached: {100 * statistics.median(shares):.1f}% "
          f"on the grid's figures (target >= 95% in <= 30% of the grid)")  # fmt: skip
    _head_to_head(work, args, value, picks)


def _head_to_head(work: Path, args, value: dict, picks: list) -> None:
    """The grid's figures were measured minutes apart, each paired only with its own
    group's identity, and its best is the largest of many noisy figures (biased upwards).
    So the grid's top ``--top`` configurations and every seed's pick are measured again
    together, interleaved in one group at the finalists' settings: each pick's share of the
    best of that group, from their paired speedups, with an interval from the endpoints."""
    from dataclasses import replace

    from mlflow_ngraph.tune.search import FINAL_MAX_S, FINAL_PRECISION
    from mlflow_ngraph.tune.trials import Trial

    top = sorted(value, key=value.get, reverse=True)[: args.top]
    configs = list(dict.fromkeys(top + [p.config() for p in picks if p is not None]))
    job = _tune(work, args.model, experiment="head-to-head", max_trials=len(configs),
                finalists=1)  # fmt: skip
    job._open_run()
    batch = [Trial(i, 1, name, json.loads(flags), None, 0, "final")
             for i, (name, flags) in enumerate(configs)]  # fmt: skip
    job.trials += batch
    before = load()
    t0 = time.perf_counter()
    measure = replace(job.settings.measure, max_duration_s=FINAL_MAX_S)
    job.bench.measure(batch, 1, 0, measure, FINAL_PRECISION)
    job.bench.read(batch, 1)
    seconds = time.perf_counter() - t0
    ok = [t for t in batch if t.status == "OK" and t.speedup and t.interval]
    if not ok:
        print("   head to head: nothing measured OK")
        return
    best = max(ok, key=lambda t: t.speedup)
    print(f"   head to head ({len(batch)} configurations in one group, {seconds:.0f} s, "
          f"load {before} -> {load()}):")  # fmt: skip
    for t in sorted(ok, key=lambda t: -t.speedup):
        rank = top.index(t.config()) + 1 if t.config() in top else None
        print(f"     {t.label}: {t.speedup:.3f}x [{t.interval[0]:.3f}-{t.interval[1]:.3f}]"
              f"{f'  (grid #{rank}: {value[t.config()]:.3f}x)' if rank else ''}")  # fmt: skip
    shares = []
    for seed, pick in enumerate(picks):
        mine = next((t for t in ok if pick is not None and t.config() == pick.config()), None)
        if mine is None:
            print(f"   seed {seed}: its pick was not measured OK head to head")
            continue
        share = mine.speedup / best.speedup
        low = mine.interval[0] / best.interval[1]
        high = min(1.0, mine.interval[1] / best.interval[0])
        shares.append(share)
        print(f"   seed {seed}: pick {mine.label}: {100 * share:.1f}% of the best head to head "
              f"[{100 * low:.1f}-{100 * high:.1f}%]")  # fmt: skip
    if shares:
        median = 100 * statistics.median(shares)
        print(f"   median share of the best reached, head to head: {median:.1f}% "
              "(target >= 95% in <= 30% of the grid)")  # fmt: skip


def _cost(job, label: str) -> None:
    """Wall seconds per trial beyond every window measured in its groups (its own and the
    identity reference's)."""
    spent = [r for r in job.journal.records() if r.get("kind") == "spent"]
    wall = sum(float(r["seconds"]) for r in spent)
    # the search's groups only: they are the ones whose wall time is journaled ("spent")
    groups = {int(r["group"]) for r in spent if r.get("group") is not None}
    trials = [t for t in job.trials if t.status is not None and t.group in groups]
    own = sum(float(t.metrics.get("duration_s") or 0.0) for t in trials)
    reference = sum(
        float((r.get("metrics") or {}).get("duration_s") or 0.0)
        for (group, _), r in job.bench.references.items()
        if group in groups
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
    p.add_argument("--work", type=Path,
                   help="grid: the folder of a grid measured before; defaults: a folder per "
                   "model where its tune resumes")  # fmt: skip
    p.add_argument("--top", type=int, default=3,
                   help="the grid's best configurations measured again with the picks")  # fmt: skip
    args = p.parse_args()
    defaults(args) if args.what == "defaults" else grid(args)


if __name__ == "__main__":
    main()
