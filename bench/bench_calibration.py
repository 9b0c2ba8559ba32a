"""Calibration: do the tool's marks and intervals predict a re-run, and what does it cost?

Five figures, each printed with the 1-minute load average beside it:

1. ``repeat``: the spec measured twice, back to back, into one store (the second run with
   warm engine caches): the share of measurements marked UNSTABLE over both runs.
2. over the same two runs: for speedups STABLE in both, the share whose 95% intervals
   overlap and the median change between the runs; the same overlap share for throughputs;
   the median relative width of both kinds of interval; and, where the first run called a
   winner's lead beyond noise, the share of (model, batch size) whose winner is the same.
3. ``hog``: the spec on a quiet host with ``--sittings 2``, then with a CPU hog on every
   core into the same home: the share marked UNSTABLE, and the share marked or held by the
   quiet run's re-run interval.
4. ``walltime``: the spec with empty caches, this checkout against ``--before REV`` (a git
   revision, checked out into a temporary worktree), sides alternating.
5. ``paper``: one OpenVINO cell under the paper's protocol (100 repetitions, 10 warm-up, a
   1 s floor; conv block w64 d2, batch 1 and 8), this checkout against ``--before``.

Each ``repeat`` run also prints the screen's bias twice: its median change to the figures
(``3. screen bias``: screened against every window kept, the issue's measure, which holds a
quiet host to +-0.5%), and against a signal the screen does not use (``3b``: the windows in
which no other process took any CPU), which says whether the screen stopped short of the
undisturbed figure or went past it on a host that is not quiet; and what the host's state
did around the rounds (``7. host state``: the probe's readings in the windows log, the share
of rounds in its slow state, how the baseline's windows tracked them, the group attempts
that met both states with the six rounds a figure is split on, and the figures marked for
it).

And a check of the intervals themselves, ``aa``: each engine measured against a second copy
of itself, each copy in its own worker, in the tool's rounds with its default stop rule and
UNSTABLE limit (no re-measure). The true speedup is 1: the share of 95% intervals that hold
1 is their real coverage, across worker processes (what a re-run meets), and the share
marked UNSTABLE is the noise floor of the marks on this host; the per-round log ratio's sd
(and its MAD-based sd: the bulk without the stray rounds) says why. "Beyond noise" is
counted as the tool calls a lead: on the re-run interval where the home's history gives a
spread (the earlier repeats, or the home ``--work`` names), and only where the figure is
STABLE; a lead the sitting interval alone separates (the home has no spread yet) is what
the tool calls "beyond this run's noise", counted apart.

    python bench/bench_calibration.py repeat --spec default   # --runs 3: re-run coverage
    python bench/bench_calibration.py repeat --spec default --runs 2 --sittings 2
    python bench/bench_calibration.py hog --spec bench/specs/calibration.yaml
    python bench/bench_calibration.py hog --work /tmp/calibration-XXXX --runs 3  # after a repeat
    python bench/bench_calibration.py walltime --before f3ab2ff --spec default
    python bench/bench_calibration.py paper --before f3ab2ff
    python bench/bench_calibration.py aa --model mha_block:width=256,depth=3 --repeats 5
    python bench/bench_calibration.py study --work /tmp/calibration-XXXX
    python bench/bench_calibration.py coverage --work /tmp/calibration-XXXX --sittings 1 --runs 2

``host`` asks whether the host itself runs at more than one speed: fixed workloads in turn,
in 0.1 s windows, for ``--seconds``: a 256x256 matmul (in cache), and sums over 2 MB (the
core's L2), 32 MB (the shared L3) and 512 MB (memory). For each: its median rate, the rate of
its faster and slower halves of windows, the share of windows 15% or more off the median,
and how long the host stays in its slow state (consecutive windows); then how often a slow
L3 window is a slow memory window. Beside them: the tool's memory probe (a sum over 64 MB in
one thread, measure/hostprobe.py), an add of two 64K-float tensors whose two threads join at
its end (what every operator of an eager engine does) and an eager attention block at batch
8; then, in the rounds where the attention block ran under 0.8x its median, each workload's
rate over its own median and the correlation of their logs: which reading tracks the
engine. On this host the join tracks it (0.61x there, correlation +0.76-0.87), the
one-thread sum barely (0.96x, +0.34), and the two-thread sums run faster there.

    python bench/bench_calibration.py host --seconds 120

``study`` reads the windows a ``repeat`` logged (``MLFLOW_NGRAPH_WINDOWS_LOG``, one file per
run in the folder ``repeat`` prints) and sets each way of making an interval from one run's
windows against the other run's figure: the share of intervals that overlap, the share
that hold the re-run's figure, their median half-width.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAPER_CELL = [
    "--model", "conv_block:width=64,depth=2", "--compiler", "openvino",
    "--batch-sizes", "1,8", "--repetitions", "100", "--warmup", "10", "--min-duration", "1",
]  # fmt: skip


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def benchmark(
    args: list[str], home: Path, uri: str, checkout: Path = REPO, extra: dict | None = None
) -> float:
    """One ``mlflow-ngraph benchmark`` from ``checkout``; returns its wall seconds."""
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(home), "PYTHONPATH": str(checkout)}
    env.update(extra or {})
    for name in list(env):  # the suite's shortcuts must not reach a measured run
        if name.startswith("MLFLOW_NGRAPH_BENCHMARK_"):
            env.pop(name)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", "benchmark", *args, "--tracking-uri", uri, "-q"],
        cwd=checkout, env=env, capture_output=True, text=True,
    )  # fmt: skip
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"benchmark failed ({done.returncode}):\n{done.stderr[-3000:]}")
    for line in done.stderr.splitlines():  # the settle's word on the host's state
        if "a state its history has not measured" in line:
            print(f"  said: {line.strip()}", flush=True)
    return seconds


def records(uri: str, experiment: str) -> dict[tuple, dict]:
    """(model, compiler label, batch size) -> its record, from ``compare --format json``."""
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", "compare", "--tracking-uri", uri, "-e",
         experiment, "--format", "json", "--live"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"compare failed:\n{done.stderr[-3000:]}")
    data = json.loads(done.stdout)
    rows = data if isinstance(data, list) else data.get("cells", [])
    _said_moves(uri, rows)
    _as_measured(uri, rows)
    return {(r["model"], r["compiler"], int(r["batch_size"])): r for r in rows}


def _said_moves(uri: str, rows: list[dict]) -> None:
    """Each row's ``moved``: the guard's word where it said the figure moved against the
    engine's history (the ``ngraph.moved.bs<b>`` tag), else ""; and its
    ``stability_reason`` (why it is UNSTABLE, else "")."""
    from mlflow import MlflowClient

    from mlflow_ngraph.tracking.schema import T_MOVED, T_STABILITY_REASON

    client, tags = MlflowClient(uri), {}
    for r in rows:
        run_id = r.get("run_id")
        if run_id and run_id not in tags:
            tags[run_id] = client.get_run(run_id).data.tags
        b = r.get("batch_size")
        said = tags.get(run_id, {})
        r["moved"] = said.get(f"{T_MOVED}.bs{int(b)}", "") if b else ""
        r["stability_reason"] = said.get(f"{T_STABILITY_REASON}.bs{int(b)}", "") if b else ""


def _as_measured(uri: str, rows: list[dict]) -> None:
    """Each row's ``as_measured``: its re-run interval's ends as first logged, before the
    run's end settled them (the metric's history keeps both)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    for r in rows:
        run_id, b, first = r.get("run_id"), r.get("batch_size"), {}
        for name in ("speedup_rerun_low", "speedup_rerun_high", "throughput_rerun_low",
                     "throughput_rerun_high"):  # fmt: skip
            if run_id and b:
                logged = client.get_metric_history(run_id, f"{name}.bs{int(b)}")
                if logged:
                    first[name] = min(logged, key=lambda m: (m.timestamp, m.step)).value
        r["as_measured"] = first


def _overlap(a: dict, b: dict, low: str, high: str) -> bool | None:
    values = (a.get(low), a.get(high), b.get(low), b.get(high))
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return None
    return a[low] <= b[high] and b[low] <= a[high]


def _width(r: dict, low: str, high: str, mid: str) -> float | None:
    if None in (r.get(low), r.get(high), r.get(mid)) or not r[mid]:
        return None
    return (r[high] - r[low]) / 2 / r[mid]


def _winners(rows: dict[tuple, dict]) -> dict[tuple, tuple[str, bool]]:
    """(model, bs) -> (winner, lead beyond noise): the fastest valid non-identity row, beyond
    noise when its speedup interval separates from the next-fastest's (identity: from 1)."""
    groups: dict[tuple, list[dict]] = {}
    for (model, _, b), r in rows.items():
        if r.get("status") == "OK" and r.get("throughput"):
            groups.setdefault((model, b), []).append(r)
    out = {}
    for key, group in groups.items():
        ranked = sorted(group, key=lambda r: -r["throughput"])
        best = next((r for r in ranked if r["compiler"] != "identity"), None)
        if best is None:
            continue
        second = next(r for r in ranked if r is not best) if len(ranked) > 1 else None
        low = best.get("speedup_ci_low")
        if second is None or low is None:
            beyond = False
        elif second["compiler"] == "identity":
            beyond = low > 1.0
        else:
            beyond = second.get("speedup_ci_high") is not None and low > second["speedup_ci_high"]
        out[key] = (best["compiler"], beyond)
    return out


def repeat(args) -> None:
    # --work: runs into an earlier repeat's store and home (warm caches, its history)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="calibration-"))
    uri = f"sqlite:///{work / 'mlflow.db'}"
    home = work / "home"
    print(f"store, engines and every window (windows-N.jsonl) in {work}", flush=True)
    runs = []
    rerun = [] if args.rerun_sd is None else ["--rerun-sd", str(args.rerun_sd)]
    rerun += ["--sittings", str(args.sittings)]
    # a repeat into an earlier one's folder (--work) names its runs apart
    label = args.label or ("calibration" if not args.work else f"calibration-s{args.sittings}")
    for i in range(1, args.runs + 1):
        before = load()
        rest = label.removeprefix("calibration").strip("-")
        windows_log = work / f"windows-{rest + '-' if rest else ''}{i}.jsonl"
        seconds = benchmark(
            ["--spec", args.spec, "--device", args.device, "--experiment", f"{label}-{i}",
             *rerun],
            home, uri, extra={"MLFLOW_NGRAPH_WINDOWS_LOG": str(windows_log)},
        )  # fmt: skip
        runs.append(records(uri, f"{label}-{i}"))
        print(f"run {i}: {seconds:.0f} s (load {before} -> {load()})", flush=True)
    coverage(runs)
    for i in range(1, args.runs + 1):
        screen_bias(uri, f"{label}-{i}")
        rest = label.removeprefix("calibration").strip("-")
        screen_check(work / f"windows-{rest + '-' if rest else ''}{i}.jsonl")
        state_check(work / f"windows-{rest + '-' if rest else ''}{i}.jsonl", runs[i - 1])
    if len(runs) < 2:  # one run (--runs 1 beside an earlier repeat): its marks alone
        flagged = sum(r.get("stability") == "UNSTABLE" for r in runs[0].values())
        print(f"1. UNSTABLE: {flagged} of {len(runs[0])} (one run)")
        return
    first, second = runs[-2], runs[-1]
    both = [k for k in first if k in second]
    flagged = sum((first[k].get("stability") == "UNSTABLE") for k in first)
    flagged += sum((second[k].get("stability") == "UNSTABLE") for k in second)
    total = len(first) + len(second)
    print(f"1. UNSTABLE: {flagged} of {total} ({100 * flagged / max(total, 1):.1f}%)")

    def paired(keys, low):
        return [k for k in keys if first[k].get(low) is not None and second[k].get(low) is not None]

    def pct(n, d):
        return f"{n} of {d} ({100 * n / max(d, 1):.1f}%)"

    def med(values):
        return f"{100 * statistics.median(values or [math.nan]):.2f}%"

    marks = ("UNSTABLE",)
    stable = [
        k for k in both
        if first[k].get("stability") not in marks and second[k].get("stability") not in marks
    ]  # fmt: skip
    sp = paired(stable, "speedup_ci_low")
    sp_overlap = sum(
        bool(_overlap(first[k], second[k], "speedup_ci_low", "speedup_ci_high")) for k in sp
    )
    sp_change = [abs(second[k]["speedup"] / first[k]["speedup"] - 1) for k in sp]
    tp = paired(stable, "throughput_ci_low")
    tp_overlap = sum(
        bool(_overlap(first[k], second[k], "throughput_ci_low", "throughput_ci_high")) for k in tp
    )
    sp_width = [_width(first[k], "speedup_ci_low", "speedup_ci_high", "speedup") for k in sp]
    tp_width = [
        _width(first[k], "throughput_ci_low", "throughput_ci_high", "throughput") for k in tp
    ]
    print(
        f"2. speedups STABLE in both runs: intervals overlap {pct(sp_overlap, len(sp))}; "
        f"median change {med(sp_change)}"
    )
    print(f"   throughputs STABLE in both runs: intervals overlap {pct(tp_overlap, len(tp))}")
    print(
        f"   median relative half-width: speedup {med([w for w in sp_width if w])}, "
        f"throughput {med([w for w in tp_width if w])}"
    )
    w1, w2 = _winners(first), _winners(second)
    called = [k for k, (_, beyond) in w1.items() if beyond and k in w2]
    same = sum(w1[k][0] == w2[k][0] for k in called)
    print(
        f"   winners called beyond noise in run 1: the same in run 2: {pct(same, len(called))}"
        f"  (load {load()})"
    )
    for figure, low, high in (
        ("speedup", "speedup_ci_low", "speedup_ci_high"),
        ("throughput", "throughput_ci_low", "throughput_ci_high"),
    ):
        keys = paired(both, low)
        if figure == "speedup":
            keys = [k for k in keys if k[1] != "identity"]
        sd = rerun_spread(first, second, keys, figure, low, high, args.rerun_sd or 0.0)
        print(
            f"   re-run spread of a {figure} beyond its run's own interval: "
            f"{'-' if sd is None else f'{100 * sd:.2f}%'} (sd of the log)"
        )
    _changes(first, second, both)


def coverage(runs: list[dict]) -> None:
    """Re-run coverage: for each run whose figures have re-run intervals (the spread the
    home's history measured from the runs before), the share of the previous run's figures
    inside them; and every figure that moved more than 25% between two runs without either
    being marked."""
    for figure in ("speedup", "throughput"):
        for way, pairs in (
            ("the previous run's figure inside", [(b, a) for a, b in zip(runs, runs[1:])]),
            ("the next run's figure inside (a prediction)", list(zip(runs, runs[1:]))),
        ):
            held = total = 0
            stable_held = stable_total = marked = 0
            for interval, other in pairs:
                h, n = _held(interval, other, figure)
                held, total = held + h, total + n
                h, n, m = _held(interval, other, figure, apart=True)
                stable_held, stable_total, marked = stable_held + h, stable_total + n, marked + m
            share = f"{held} of {total} ({100 * held / max(total, 1):.1f}%)"
            print(f"re-run coverage of the {figure}s: {way}: {share if total else 'none yet'}")
            first = [_held(i, o, figure, measured=True) for i, o in pairs]
            h, n = sum(x[0] for x in first), sum(x[1] for x in first)
            if n:  # the intervals as each result was measured, before the run's end
                print(f"   as measured, before the run's end settled them: {h} of {n} "
                      f"({100 * h / n:.1f}%)")  # fmt: skip
            if total:  # the same, apart: STABLE in both runs; and a miss the tool marked
                print(f"   of those STABLE in both runs: {stable_held} of {stable_total} "
                      f"({100 * stable_held / max(stable_total, 1):.1f}%); held or marked "
                      f"UNSTABLE in either run: {stable_held + marked} of {total} "
                      f"({100 * (stable_held + marked) / total:.1f}%)")  # fmt: skip
    unmarked, said = [], []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            for k in a.keys() & b.keys():
                x, y = a[k].get("throughput"), b[k].get("throughput")
                if not x or not y or max(x / y, y / x) <= 1.25:
                    continue
                if "UNSTABLE" in (a[k].get("stability"), b[k].get("stability")):
                    continue
                if b[k].get("moved") or a[k].get("moved"):
                    said.append((k, round(max(x / y, y / x), 2)))
                else:
                    unmarked.append((k, round(max(x / y, y / x), 2)))
    print(f"6. moved more than 25% between runs, neither UNSTABLE: said by the guard (the "
          f"ngraph.moved tag) {len(said)} {said[:5]}; neither marked nor said: "
          f"{len(unmarked)} {unmarked[:5]}")  # fmt: skip


def _held(
    interval: dict, other: dict, figure: str, apart: bool = False, measured: bool = False
) -> tuple[int, ...]:
    """(held, compared): how many of ``other``'s figures lie inside ``interval``'s re-run
    intervals, of those both runs have (identity's speedup left out). With ``apart``:
    (held, compared, marked) over the figures STABLE in both runs, and how many figures
    either run marked UNSTABLE (each a figure the tool said was noise). With ``measured``:
    ``interval``'s re-run intervals as first logged (``as_measured``)."""
    low, high = f"{figure}_rerun_low", f"{figure}_rerun_high"
    held = total = marked = 0
    for k, r in interval.items():
        if measured:
            r = r.get("as_measured") or {}
        if r.get(low) is None or k not in other or other[k].get(figure) is None:
            continue
        if figure == "speedup" and k[1] == "identity":
            continue
        if apart and "UNSTABLE" in (interval[k].get("stability"), other[k].get("stability")):
            marked += 1
            continue
        total += 1
        held += r[low] <= other[k][figure] <= r[high]
    return (held, total, marked) if apart else (held, total)


def screen_bias(uri: str, experiment: str) -> None:
    """3. Screen bias: each figure against the same figure with the disturbed windows kept
    in (``*_unscreened``, logged where the screen left windows out): the median and the
    largest change the screen made, over every figure of the run (0 where it left none
    out)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id], "tags.`ngraph.role` = 'cell'")
    for figure in ("throughput", "speedup"):
        changes = []
        for run in runs:
            m = run.data.metrics
            kept = {  # logged stepped (the step is the batch size), where windows were left out
                int(h.step): h.value
                for h in client.get_metric_history(run.info.run_id, f"{figure}_unscreened")
            }
            for key, value in m.items():
                stem, _, b = key.partition(".bs")
                if stem != figure or not b.isdigit() or not value:
                    continue
                changes.append(value / kept[int(b)] - 1 if kept.get(int(b)) else 0.0)
        if not changes:
            continue
        moved = [c for c in changes if c]
        worst, middle = max(changes, key=abs), statistics.median(changes)
        print(
            f"3. screen bias, {experiment}, {figure}s: median {100 * middle:+.2f}%"
            f" over {len(changes)} ({len(moved)} screened), largest {100 * worst:+.2f}%"
            f"  (load {load()})"
        )


def screen_check(path: Path) -> None:
    """3b. The screen against a signal it does not use: each engine's throughput over the
    windows in which no other process (nor the hypervisor) took any CPU (``other_s`` 0, the
    machine's /proc/stat less the worker's own), against the screened figure and the one
    with every window kept. Where the screen left windows out it should move the figure
    toward the clean windows' and no further: past them it picked the engine's fast windows
    (an upward bias); short of them, disturbed windows stayed in. Per attempt of each
    engine and batch size in the windows log ``path``, where the screen left windows out
    and at least 3 windows were clean."""
    from mlflow_ngraph.measure import rounds as R
    from mlflow_ngraph.measure.harness import Window

    def rate(ws):
        ws = [w for w in ws if w is not None and w.seconds > 0]
        total = sum(w.seconds for w in ws)
        return sum(w.samples for w in ws) / total if total > 0 else None

    screened_to_clean, kept_to_clean, counts = [], [], []
    for text in path.read_text().splitlines() if path.exists() else []:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        for engine in line["engines"].values():
            ws = [Window(*w) for w in engine["windows"] if w]
            left = R.screened(ws)
            clean = [w for w in ws if w.other_s is not None and w.other_s <= 0]
            if len(clean) < 3 or all(w is not None for w in left):
                continue
            every, screened, undisturbed = rate(ws), rate(left), rate(clean)
            if every and screened and undisturbed:
                screened_to_clean.append(screened / undisturbed - 1)
                kept_to_clean.append(every / undisturbed - 1)
                counts.append((len(ws), sum(w is None for w in left), len(clean)))
    if not counts:
        print(f"3b. screen against clean windows, {path.name}: no engine to judge it on")
        return
    print(
        f"3b. screen against clean windows, {path.name}: over {len(counts)} engine attempts"
        f" with windows left out, the screened throughput"
        f" {100 * statistics.median(screened_to_clean):+.2f}% (median) from the clean windows',"
        f" every window kept {100 * statistics.median(kept_to_clean):+.2f}%"
        f" (windows {statistics.median(c[0] for c in counts):.0f}, left out"
        f" {statistics.median(c[1] for c in counts):.0f}, clean"
        f" {statistics.median(c[2] for c in counts):.0f}, medians)"
    )


def state_check(path: Path, rows: dict) -> None:
    """7. What the host's state did around the rounds (measure/hostprobe.py): the probe's
    readings in the windows log ``path`` (the share of rounds under 75% of the log's 90th
    percentile, the rule the runs used against their own process's readings), whether the
    baseline's windows tracked them (its rate in those rounds over its group's median, and
    the correlation of the logs, each over its group's median), the group attempts whose
    rounds met both states (6 rounds or more in each, the fewest a figure is split on), and
    the figures of ``rows`` (a run's records) marked for it."""
    import numpy as np

    from mlflow_ngraph.measure.hostprobe import REFERENCE_Q, SLOW

    groups, kind = [], None
    for text in path.read_text().splitlines() if path.exists() else []:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        kind = line.get("host_probe") or kind
        readings = line.get("host_readings") or line.get("memory_gbs") or []
        base = (line["engines"].get(line.get("baseline") or "") or {}).get("windows") or []
        rates = [w[1] / w[2] if w and w[2] else None for w in base]
        groups.append((readings, rates))
    every = [g for readings, _ in groups for g in readings if g]
    if len(every) < 2:
        print(f"7. host state, {path.name}: too few readings (the probe was off)")
        return
    fast = float(np.quantile(every, REFERENCE_Q))
    slow = [[bool(g and g < SLOW * fast) for g in readings] for readings, _ in groups]
    both = sum(sum(s) >= 6 and len(s) - sum(s) >= 6 for s in slow)
    pairs = []  # (log reading, log baseline rate), each over its group's median
    for readings, rates in groups:
        got = [(g, r) for g, r in zip(readings, rates) if g and r]
        if len(got) >= 3:
            mg, mr = np.median([g for g, _ in got]), np.median([r for _, r in got])
            pairs += [(np.log(g / mg), np.log(r / mr), g < SLOW * fast) for g, r in got]
    said = [r.get("stability_reason") or "" for r in rows.values()]
    marked = sum("host ran in two states" in reason for reason in said)
    tracked = ""
    if len(pairs) >= 3:
        x, y, low = (np.array(c) for c in zip(*pairs))
        there = f"{np.exp(np.median(y[low])):.2f}x" if low.any() else "none"
        tracked = (
            f"; the baseline's rate in those rounds {there} its group's median, correlation "
            f"{np.corrcoef(x, y)[0, 1]:+.2f} over {len(pairs)} rounds"
        )
    print(
        f"7. host state ({kind or 'memory'}), {path.name}: {len(every)} rounds read, median "
        f"{statistics.median(every):,.1f}, fast {fast:,.1f}; slow rounds {sum(map(sum, slow))} "
        f"({100 * sum(map(sum, slow)) / len(every):.1f}%){tracked}; group attempts with both "
        f"states {both} of {len(groups)}; figures marked for it {marked} of {len(rows)}"
    )


def rerun_spread(first, second, keys, figure, low, high, rerun_sd) -> float | None:
    """The sd (log scale) by which a figure moves from one run to the next beyond what
    each run's rounds showed: each run's 95% interval, less the re-run spread it was
    given, says its own sd; the rest of the squared change between the runs, over two
    runs, is the spread of a sitting (method of moments over every figure in ``keys``)."""
    from mlflow_ngraph.measure.rounds import Z95 as z

    changes, own = [], []
    for k in keys:
        a, b = first[k], second[k]
        changes.append(math.log(b[figure] / a[figure]) ** 2)
        for r in (a, b):
            h = math.log(r[high] / r[low]) / 2  # the interval's half-width on the log scale
            own.append(max(h * h - (z * rerun_sd) ** 2, 0.0) / z**2)
    if len(changes) < 3:
        return None
    return math.sqrt(max(statistics.mean(changes) - 2 * statistics.mean(own), 0.0) / 2)


def _changes(first, second, keys) -> None:
    print("\n   per measurement: speedup run 1 [interval] -> run 2 [interval], stability")
    for k in sorted(keys):
        a, b = first[k], second[k]
        if a.get("speedup") is None or a.get("compiler") == "identity":
            continue

        def show(r):
            lo, hi = r.get("speedup_ci_low"), r.get("speedup_ci_high")
            ci = f"[{lo:.3f}-{hi:.3f}]" if lo is not None and hi is not None else "[-]"
            return f"{r['speedup']:.3f} {ci} {r.get('stability') or '-'}"

        print(f"   {k[0][:28]:28} {k[1][:24]:24} bs{k[2]:<3} {show(a)} -> {show(b)}")


@contextlib.contextmanager
def hogs(count: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def hog(args) -> None:
    """4. The spec measured on a quiet host (``--sittings 2``: its re-run intervals from the
    run's own spread), then into the same home and store with a CPU hog on every core: the
    share of the hogged figures marked UNSTABLE, and the share marked or inside the quiet
    run's re-run interval (the target: at least 95%); every hogged figure more than 25% off
    the quiet one without a mark is listed. With ``--work``: no quiet run of its own; the
    hogged run goes into a ``repeat``'s home and store (a host in another state than its
    history: the settle's state check should say so) and is held against its last run."""
    base = ["--spec", args.spec, "--device", args.device]
    if args.work:  # into a repeat's home and store: its last run is the quiet one
        work, quiet_name = Path(args.work), f"calibration-s{args.sittings}-{args.runs}"
        uri = f"sqlite:///{work / 'mlflow.db'}"
        print(f"quiet run: {quiet_name} in {work}, its home's history behind it", flush=True)
    else:
        work, quiet_name = Path(tempfile.mkdtemp(prefix="calibration-hog-")), "quiet"
        uri = f"sqlite:///{work / 'mlflow.db'}"
        before = load()
        quiet_s = benchmark([*base, "--experiment", "quiet", "--sittings", "2"], work / "home", uri)
        print(f"quiet run (--sittings 2): {quiet_s:.0f} s (load {before} -> {load()})", flush=True)
    cores = os.cpu_count() or 1
    with hogs(cores):
        time.sleep(2)
        before = load()
        # --busy-ok: the hog is the point (the benchmark would wait for quiet, then stop)
        hogged = "hog" if not args.work else f"hog-{int(time.time())}"
        seconds = benchmark([*base, "--experiment", hogged, "--busy-ok"], work / "home", uri)
        after = load()
    quiet, rows = records(uri, quiet_name), records(uri, hogged)
    flagged = sum(r.get("stability") == "UNSTABLE" for r in rows.values())
    print(
        f"4. with {cores} hog(s): UNSTABLE {flagged} of {len(rows)} "
        f"({100 * flagged / max(len(rows), 1):.1f}%) in {seconds:.0f} s (load {before} -> {after})"
    )
    for figure in ("throughput", "speedup"):
        held, total, off = 0, 0, []
        for k, r in rows.items():
            q = quiet.get(k, {})
            low, high = q.get(f"{figure}_rerun_low"), q.get(f"{figure}_rerun_high")
            if r.get(figure) is None or low is None or (figure == "speedup" and k[1] == "identity"):
                continue
            total += 1
            marked = r.get("stability") == "UNSTABLE"
            held += marked or low <= r[figure] <= high
            ratio = max(r[figure] / q[figure], q[figure] / r[figure]) if q.get(figure) else 1.0
            if ratio > 1.25 and not marked:
                off.append((k, round(ratio, 2)))
        share = f"{held} of {total} ({100 * held / total:.1f}%)" if total else "none"
        print(f"   {figure}s marked UNSTABLE or inside the quiet run's re-run interval: {share}")
        print(f"   {figure}s more than 25% off the quiet run's, unmarked: {len(off)} {off[:5]}")
    print(f"   (store and home kept in {work})")


@contextlib.contextmanager
def checkout(rev: str):
    path = Path(tempfile.mkdtemp(prefix="calibration-before-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO)


def versus(args, label: str, cell: list[str]) -> None:
    with checkout(args.before) as old:
        times: dict[str, list[float]] = {"before": [], "after": []}
        for i in range(args.rounds):
            sides = [("before", old), ("after", REPO)]
            for side, tree in sides if i % 2 == 0 else sides[::-1]:
                work = Path(tempfile.mkdtemp(prefix=f"calibration-{side}-"))
                before = load()
                seconds = benchmark(cell, work / "home", f"sqlite:///{work / 'mlflow.db'}", tree)
                times[side].append(seconds)
                print(f"   {side}: {seconds:.1f} s (load {before} -> {load()})", flush=True)
        b, a = statistics.median(times["before"]), statistics.median(times["after"])
        print(f"{label}: before {b:.1f} s, after {a:.1f} s: {b / a:.2f}x  (load {load()})")


def windows(args) -> None:
    """The sample duration: eager and TorchScript of one model in one process, measured in
    interleaved rounds at several window lengths, sides alternating; per length, the spread
    of the per-round log ratio and of each side's window rates, and the rounds the default
    precision needs."""
    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.measure.harness import Meter
    from mlflow_ngraph.measure.rounds import PRECISION, RoundPolicy, run_rounds
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.models.registry import load_model
    from mlflow_ngraph.run.supply import EngineSupply

    home = Path(tempfile.mkdtemp(prefix="calibration-windows-"))
    model = load_model(args.model_name, dict(args.model_params))
    supply = EngineSupply(home, "cpu", "cpu", "throughput")
    settings = MeasureSettings(warmup=5, repetitions=1, min_duration_s=0.0)
    engines = {}
    for name, flags in (("identity", {}), ("torchscript", {})):
        compiler = get_compiler(name)
        engine = compiler.compile(model, compiler.resolve_flags(flags), supply.context(1))
        engine.prepare(model.random_input(1))
        engines[name] = engine
    print(f"{'window':>8} {'rounds':>6} {'sd log ratio':>12} {'sd log rate':>11} "
          f"{'rounds for +-2%':>15} {'speedup':>8}")  # fmt: skip
    for window_s in args.windows:
        meters = {n: Meter(e, 1, settings) for n, e in engines.items()}
        policy = RoundPolicy(window_s=window_s, min_rounds=args.count, precision=1e-9,
                             max_s=window_s * args.count)  # fmt: skip
        figures = run_rounds(meters, settings, "identity", policy)
        ts = figures["torchscript"]
        ratios = [
            math.log(a.rate / b.rate)
            for a, b in zip(meters["torchscript"].windows, meters["identity"].windows)
        ]
        sd = statistics.stdev(ratios)
        rates = [math.log(w.rate) for w in meters["identity"].windows]
        need = math.ceil((1.96 * sd / math.log1p(PRECISION)) ** 2)
        print(f"{window_s:8.3f} {len(ratios):6d} {sd:12.4f} {statistics.stdev(rates):11.4f} "
              f"{need:15d} {ts.speedup:8.3f}  (load {load()})", flush=True)  # fmt: skip


def aa(args) -> None:
    """A/A: the speedup of each engine over a second copy of itself (see the module's
    docstring)."""
    import numpy as np

    from mlflow_ngraph.compilers.registry import get_compiler
    from mlflow_ngraph.measure import rounds
    from mlflow_ngraph.measure.settings import MeasureSettings
    from mlflow_ngraph.measure.stability import short_reason
    from mlflow_ngraph.run import isolation
    from mlflow_ngraph.run.worker import CellTask

    home = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="calibration-aa-"))
    seen: dict[str, tuple] = {}
    paired = rounds.paired_figures

    def spy(windows, base):  # the rounds' last call holds every window
        seen["windows"] = (list(windows), list(base))
        return paired(windows, base)

    rounds.paired_figures = spy
    settings = MeasureSettings(warmup=10, repetitions=100, min_duration_s=1.0)
    print(f"A/A on {args.model} bs{args.batch_size}: each engine against a copy of itself in "
          f"another worker, the default stop rule, {args.repeats} repeats")  # fmt: skip
    summary = []
    for compiler in args.compilers:
        flags = get_compiler(compiler).resolve_flags({})
        rows, unpaired = [], 0
        for _ in range(args.repeats):
            got: dict[str, dict] = {}

            def events(name, got=got):
                def on_event(kind, payload):
                    if kind == "record":
                        got[name] = payload[1]
                    elif kind == "failed":  # said, not counted as a missing record
                        got[name] = {"status": "FAILED", "reason": payload[1]}

                return on_event

            cells = [
                isolation.GroupCell(
                    n,
                    CellTask(
                        name=n,
                        model_name=args.model_name,
                        model_params=args.model_params,
                        compiler=compiler,
                        flags=flags,
                        batch_sizes=[args.batch_size],
                        device="cpu",
                        device_kind="cpu",
                        home=str(home),
                        tolerance=1e-3,
                        log_file=str(home / "worker.log"),
                        measure=settings,
                    ),
                    events(n),
                )
                for n in ("a", "b")
            ]
            before = load()
            task = cells[0].task
            isolation.run_group(cells, [args.batch_size], "a", settings, task.policy(), 0, 900)
            record = got.get("b")
            if not record or record.get("status") != "OK":
                print(f"   {compiler}: not measured ({record and record.get('reason')})")
                continue
            m = record["metrics"]
            low, high = m.get("speedup_ci_low"), m.get("speedup_ci_high")
            if m.get("speedup_paired") is None or low is None:
                reason = (record.get("stability") or {}).get("reason") or "-"
                print(f"   {compiler}: no paired speedup with an interval ({m.get('windows')} "
                      f"windows; the copy's worker: {cells[0].death or 'alive'}; "
                      f"{reason[:300]})")  # fmt: skip
                unpaired += 1
                continue
            w, b = seen["windows"]
            logs = np.array(rounds._log_ratios(w, b))  # the rounds' own pairing
            mad = 1.4826 * float(np.median(abs(logs - np.median(logs))))
            stable = (record.get("stability") or {}).get("stable")
            r_low, r_high = m.get("speedup_rerun_low"), m.get("speedup_rerun_high")
            rerun = (r_low, r_high) if r_low is not None and r_high is not None else None
            # "beyond noise" as the tool calls a lead over the baseline (measure/verdict.py):
            # on the re-run interval where the host has a spread, else the sitting's; never
            # where either side is UNSTABLE
            # where the host has no spread yet the tool says "beyond this run's noise"
            # (judged on the sitting interval), counted apart from "beyond noise"
            judged = rerun or (low, high)
            beyond = bool(stable) and not judged[0] <= 1.0 <= judged[1]
            rows.append((m["speedup_paired"], low, high, stable, logs.std(ddof=1), mad, rerun,
                         beyond and rerun is not None, beyond and rerun is None))  # fmt: skip
            shown = f", re-run [{rerun[0]:.3f}-{rerun[1]:.3f}]" if rerun else ", no re-run interval"
            called = ", beyond noise" if rerun else ", beyond this run's noise"
            print(f"   {compiler}: {m['speedup_paired']:.3f}x [{low:.3f}-{high:.3f}]{shown} "
                  f"{len(logs)} rounds, sd of the per-round log ratio {logs.std(ddof=1):.3f} "
                  f"(MAD-based {mad:.3f}), {'STABLE' if stable else 'UNSTABLE'}"
                  f"{'' if stable else ': ' + short_reason(record['stability'].get('reason') or '')}"
                  f"{called if beyond else ''}  "
                  f"(load {before} -> {load()})", flush=True)  # fmt: skip
        isolation.shutdown()
        if rows:
            held = sum(1 for r in rows if r[1] is not None and r[1] <= 1.0 <= r[2])
            marked = sum(1 for r in rows if not r[3])
            width = statistics.median((r[2] - r[1]) / 2 / r[0] for r in rows if r[1])
            reruns = [r[6] for r in rows if r[6]]
            rerun_held = sum(1 for lo, hi in reruns if lo <= 1.0 <= hi)
            summary.append(f"{compiler}: 1.0 inside the sitting interval {held}/{len(rows)}, "
                           f"inside the re-run interval {rerun_held}/{len(reruns)}; "
                           f"beyond noise called {sum(r[7] for r in rows)}/{len(rows)} "
                           f"(beyond this run's noise, where the home had no spread yet: "
                           f"{sum(r[8] for r in rows)}/{len(rows)}); "
                           f"UNSTABLE {marked}/{len(rows)} (and {unpaired} with no paired "
                           f"speedup); median sitting half-width "
                           f"+-{100 * width:.1f}%")  # fmt: skip
    rounds.paired_figures = paired
    for line in summary:
        print("   " + line)


def _groups(path: Path) -> dict[tuple, dict]:
    """(model, params, batch size) -> the last attempt's line of a windows log."""
    out = {}
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except json.JSONDecodeError:  # a line torn by a kill
            continue
        key = (line["model"], json.dumps(line["model_params"], sort_keys=True), line["batch_size"])
        out[key] = line
    return out


def _engines(line: dict) -> dict[str, tuple[str, list, list | None]]:
    """label -> (cell name, its windows, the baseline's windows or None) of one group."""
    from mlflow_ngraph.measure.harness import Window

    def ws(name):
        return [Window(*w) for w in line["engines"][name]["windows"]]

    base = line.get("baseline")
    out = {}
    for name, e in line["engines"].items():
        label = e["compiler"] + json.dumps(e["flags"], sort_keys=True)
        out[label] = (name, ws(name), ws(base) if base and name != base else None)
    return out


def _blocks_interval(logs: list[float], count: int = 4):
    """(figure, its 95% interval) of Student's t over ``count`` contiguous block means of
    the log values ``logs`` (what a slow drift within the run makes of a t interval)."""
    from scipy import stats

    if len(logs) < 2 * count:
        return None
    n = len(logs)
    means = [statistics.fmean(logs[i * n // count : (i + 1) * n // count]) for i in range(count)]
    centre = statistics.fmean(means)
    h = stats.t.ppf(0.975, count - 1) * statistics.stdev(means) / math.sqrt(count)
    return math.exp(centre), (math.exp(centre - h), math.exp(centre + h))


def study(args) -> None:
    """Interval methods against a re-run: for each way of making a throughput's or a
    speedup's interval from the windows a ``repeat`` logged, the share of intervals that
    overlap the other run's, the share holding the other run's figure, the median
    half-width, and the share narrow enough to be STABLE."""
    from mlflow_ngraph.measure import rounds as R

    work = Path(args.work)
    one, two = _groups(work / "windows-1.jsonl"), _groups(work / "windows-2.jsonl")

    def tp_current(own, _base, screen):
        own = R.screened(own) if screen else own
        t, ci, _, _ = R.throughput_figures([w for w in own if w is not None])
        return (t, ci) if ci else None

    def tp_blocks(own, _base, screen):
        own = [w for w in (R.screened(own) if screen else own) if w is not None]
        return _blocks_interval([math.log(w.rate) for w in own])

    def sp_current(own, base, screen):
        if base is None:
            return None
        if screen:
            own, base = R.screened(own), R.screened(base)
        s, ci, _ = R.paired_figures(own, base)
        return (s, ci) if ci else None

    def sp_blocks(own, base, screen):
        if base is None:
            return None
        if screen:
            own, base = R.screened(own), R.screened(base)
        return _blocks_interval(R._log_ratios(own, base))

    methods = [
        ("throughput", "t over windows, all windows (before)", tp_current, False, 0.10),
        ("throughput", "t over windows, disturbed left out (now)", tp_current, True, 0.10),
        ("throughput", "t over 4 blocks of windows, disturbed left out", tp_blocks, True, 0.10),
        ("speedup", "signed rank over rounds, all rounds (before)", sp_current, False, 0.05),
        ("speedup", "signed rank over rounds, disturbed left out (now)", sp_current, True, 0.05),
        ("speedup", "t over 4 blocks of rounds, disturbed left out", sp_blocks, True, 0.05),
    ]
    print(f"{'figure':10} {'interval':52} {'n':>4} {'overlap':>8} {'holds':>6} "
          f"{'half-width':>10} {'narrow':>7} {'overlap|narrow':>14}")  # fmt: skip
    for kind, label, fn, screen, limit in methods:
        rows = []
        for key in one.keys() & two.keys():
            a, b = _engines(one[key]), _engines(two[key])
            for eng in a.keys() & b.keys():
                if kind == "throughput" and a[eng][2] is not None:
                    continue  # a compiled engine's throughput is not what it is judged on
                x, y = fn(a[eng][1], a[eng][2], screen), fn(b[eng][1], b[eng][2], screen)
                if x is None or y is None:
                    continue
                (mx, (lx, hx)), (my, (ly, hy)) = x, y
                overlap = lx <= hy and ly <= hx
                holds = lx <= my <= hx
                wx, wy = max(hx / mx - 1, 1 - lx / mx), max(hy / my - 1, 1 - ly / my)
                rows.append((overlap, holds, wx, wx <= limit and wy <= limit))
        if not rows:
            continue
        n = len(rows)
        narrow = [r for r in rows if r[3]]
        print(f"{kind:10} {label:52} {n:4d} {sum(r[0] for r in rows) / n:8.0%} "
              f"{sum(r[1] for r in rows) / n:6.0%} {statistics.median(r[2] for r in rows):10.1%} "
              f"{len(narrow) / n:7.0%} "
              f"{sum(r[0] for r in narrow) / max(len(narrow), 1):14.0%}")  # fmt: skip


def host(args) -> None:
    """Fixed workloads in turn, 0.1 s windows each (see the module's docstring)."""
    import itertools

    import torch

    from mlflow_ngraph.measure.hostprobe import MemoryProbe

    torch.set_num_threads(os.cpu_count() or 1)
    square = torch.randn(256, 256)
    sums = {mb: torch.randn(mb * 2**20 // 4) for mb in (2, 32, 512)}
    work = {"matmul 256 (in cache)": (lambda: square @ square, 2 * 256**3 / 1e9, "GFLOP/s")}
    for mb, x in sums.items():
        where = {2: "L2", 32: "L3", 512: "memory"}[mb]
        work[f"sum {mb} MB ({where})"] = ((lambda x=x: x.sum()), mb * 2**20 / 1e9, "GB/s")
    probe = MemoryProbe()  # the tool's: one thread, 64 MB
    probe.read()
    work["probe: sum 64 MB, 1 thread"] = (probe._data.sum, probe._data.nbytes / 1e9, "GB/s")
    # an add just past ATen's grain size (32,768): two threads meet at its end, so it costs
    # what the cores take to start and join a parallel region, as every operator of an
    # eager engine does
    a, b = torch.randn(65536), torch.randn(65536)
    work["add 64K floats, threads join"] = ((lambda: torch.add(a, b)), 1e-3, "k ops/s")
    blocks = torch.nn.Sequential(
        *[torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True) for _ in range(3)]
    ).eval()
    tokens = torch.randn(8, 64, 256)

    def attention():
        with torch.inference_mode():
            blocks(tokens)

    work["attention block bs8, eager"] = (attention, 8, "samples/s")

    def window(fn, size):
        n, began = 0, time.perf_counter()
        while time.perf_counter() - began < 0.1:
            fn()
            n += 1
        return n * size / (time.perf_counter() - began)

    for fn, size, _ in work.values():  # warm-up
        window(fn, size)
    before, rows, end = load(), [], time.monotonic() + args.seconds
    while time.monotonic() < end:
        rows.append({name: window(fn, size) for name, (fn, size, _) in work.items()})
    round_s = args.seconds / len(rows)
    print(f"host: {len(rows)} rounds of {len(work)} windows of 0.1 s over {args.seconds:.0f} s "
          f"(load {before} -> {load()})")  # fmt: skip
    slow_of = {}
    for name, (_, _, unit) in work.items():
        rates = [r[name] for r in rows]
        median = statistics.median(rates)
        ordered = sorted(rates)
        low = statistics.median(ordered[: len(ordered) // 2])
        high = statistics.median(ordered[len(ordered) // 2 :])
        slow = [x < 0.85 * median for x in rates]
        slow_of[name] = slow
        fast_share = sum(x > 1.15 * median for x in rates) / len(rates)
        stretches = [len(list(g)) for k, g in itertools.groupby(slow) if k]
        stay = statistics.median(stretches) * round_s if stretches else 0.0
        print(f"   {name}: median {median:.1f} {unit}; faster half {high:.1f}, slower half "
              f"{low:.1f} ({high / low:.2f}x); 15% or more under the median "
              f"{100 * sum(slow) / len(rates):.0f}% of windows, over it "
              f"{100 * fast_share:.0f}%; a slow stretch lasts {stay:.1f} s (median of "
              f"{len(stretches)})")  # fmt: skip
    l3, memory = slow_of["sum 32 MB (L3)"], slow_of["sum 512 MB (memory)"]
    both = sum(a and b for a, b in zip(l3, memory))
    print(f"   slow L3 windows that were slow memory windows: {both} of {sum(l3)}; "
          f"slow memory windows: {sum(memory)} of {len(rows)}")  # fmt: skip
    _beside_the_engine(rows, "attention block bs8, eager")


def _beside_the_engine(rows: list[dict], engine: str) -> None:
    """Each workload's rate in the rounds where ``engine`` ran under 0.8x its median, over
    its own median, and the correlation of their logs: which reading tracks the engine."""
    import numpy as np

    own = np.array([r[engine] for r in rows])
    slow = own < 0.8 * np.median(own)
    print(f"   rounds where the {engine} ran under 0.8x its median: {int(slow.sum())} of "
          f"{len(rows)}; there, each workload over its median (elsewhere), "
          "correlation:")  # fmt: skip
    for name in rows[0]:
        rate = np.array([r[name] for r in rows])
        there = np.median(rate[slow]) / np.median(rate) if slow.any() else float("nan")
        corr = float(np.corrcoef(np.log(rate), np.log(own))[0, 1])
        print(f"     {name}: {there:.2f}x ({np.median(rate[~slow]) / np.median(rate):.2f}x), "
              f"{corr:+.2f}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "what",
        choices=[*"repeat coverage hog walltime paper windows aa study host".split()],
    )
    p.add_argument(
        "--work", help="study: the folder a repeat printed (its windows logs); repeat: runs "
        "into that folder's store and home (warm engine caches, its history); aa: the home "
        "(its history gives the re-run spread); hog: a repeat's folder, whose last run "
        "(--runs, --sittings) is the quiet one the hogged run is held against",
    )  # fmt: skip
    p.add_argument("--compilers", nargs="+", default=["identity", "onnxruntime", "openvino"])
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="aa: groups per engine")
    p.add_argument("--windows", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3, 1.0])
    p.add_argument("--model", default="mha_block:width=128,depth=1")
    p.add_argument("--count", type=int, default=30, help="rounds per window length")
    p.add_argument("--spec", default="default")
    p.add_argument(
        "--rerun-sd", type=float, default=None,
        help="repeat: the benchmark's --rerun-sd (default: the spread the home's history measures)",
    )  # fmt: skip
    p.add_argument("--runs", type=int, default=3, help="repeat: runs into one home (>= 2)")
    p.add_argument(
        "--sittings", type=int, default=1,
        help="repeat: the benchmark's --sittings (each run's spread measured by the run itself)",
    )  # fmt: skip
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--label",
        help="repeat, coverage: the runs' experiment name before its -N (a repeat into an "
        "earlier one's --work, named apart from its runs; windows-<rest>-N.jsonl)",
    )
    p.add_argument("--before", default="f3ab2ff", help="the revision to compare against")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds of before/after")
    p.add_argument("--seconds", type=float, default=120.0, help="host: how long to probe")
    args = p.parse_args()
    name, _, params = args.model.partition(":")
    args.model_name = name
    args.model_params = dict(
        (k, int(v) if v.isdigit() else v) for k, v in (p.split("=") for p in params.split(",") if p)
    )
    if args.what == "windows":
        windows(args)
    elif args.what == "host":
        host(args)
    elif args.what == "aa":
        aa(args)
    elif args.what == "study":
        study(args)
    elif args.what == "repeat":
        repeat(args)
    elif args.what == "coverage":  # again, from the runs a repeat left in --work
        uri = f"sqlite:///{Path(args.work) / 'mlflow.db'}"
        label = args.label or (f"calibration-s{args.sittings}" if args.sittings else "calibration")
        coverage([records(uri, f"{label}-{i}") for i in range(1, args.runs + 1)])
    elif args.what == "hog":
        hog(args)
    elif args.what == "walltime":
        versus(args, "4. wall time, empty caches", ["--spec", args.spec, "--device", args.device])
    else:
        versus(args, "5. one OpenVINO cell, paper protocol", PAPER_CELL)


if __name__ == "__main__":
    main()
