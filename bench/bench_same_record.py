"""The same record before and after a change of the code's layout: one spec benchmarked by
this checkout and by ``--before REV`` (a git revision, checked out into a temporary
worktree), each into a fresh store and home, then every run's params (names and values),
metric names, tag names and artifact paths set side by side, run by run (matched by the
run's role and name). What a measurement makes differ (the figures, times, run ids, the git
revision) is not compared; everything the record is made of is.

    python bench/bench_same_record.py --before 9b847b1
    python bench/bench_same_record.py --before 9b847b1 --spec default

Prints each difference and ``same record: yes`` or ``no``; exits 1 on a difference.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_calibration import checkout  # a revision in a temporary worktree

REPO = Path(__file__).resolve().parent.parent
#: a spec of seconds with every CPU compiler the default experiment runs
QUICK = [
    "--spec", "smoke", "--compiler", "identity", "--compiler", "torchscript",
    "--compiler", "onnxruntime", "--compiler", "openvino",
]  # fmt: skip
#: params and tags whose values describe the sitting, not the record's shape (a reason tag
#: is there only where that measurement was UNSTABLE)
VOLATILE = ("git", "host", "mlflow.source", "mlflow.user", "mlflow.runName", "ngraph.started",
            "ngraph.stability.reason")  # fmt: skip
#: params compared by presence only: an engine's manifest holds its build's own times
PRESENCE = ("manifest_sha256",)
#: metrics logged only where the measurement made them: p99 from 299 requests on, the
#: unscreened figure where the screen left windows out
CONDITIONAL = ("latency_p99", "_unscreened")


def benchmark(checkout_dir: Path, args: list[str], work: Path) -> str:
    uri = f"sqlite:///{work / 'mlflow.db'}"
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(work / "home"), "PYTHONPATH": str(checkout_dir)}
    for name in list(env):  # the suite's shortcuts must not reach a measured run
        if name.startswith("MLFLOW_NGRAPH_BENCHMARK_"):
            env.pop(name)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mlflow_ngraph", "benchmark", *args, "--device", "cpu",
         "--experiment", "same-record", "--tracking-uri", uri, "-q"],
        cwd=checkout_dir, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"benchmark at {checkout_dir} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    print(f"{checkout_dir}: {time.perf_counter() - t0:.0f} s", flush=True)
    return uri


def _volatile(key: str) -> bool:
    return any(part in key for part in VOLATILE)


def _artifacts(client, run_id: str, path: str = "") -> list[str]:
    out = []
    for item in client.list_artifacts(run_id, path or None):
        out += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return out


def record(uri: str) -> dict[tuple[str, str], dict]:
    """(role, run name) -> what its record is made of."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("same-record")
    out = {}
    for run in client.search_runs([experiment.experiment_id], max_results=10_000):
        tags = run.data.tags
        key = (tags.get("ngraph.role", "-"), run.info.run_name)
        out[key] = {
            "params": {
                k: ("(set)" if k.endswith(PRESENCE) else v)
                for k, v in run.data.params.items()
                if not _volatile(k)
            },
            "metrics": sorted(k for k in run.data.metrics if not any(c in k for c in CONDITIONAL)),
            "tags": sorted(k for k in tags if not _volatile(k)),
            "artifacts": sorted(_artifacts(client, run.info.run_id)),
        }
    return out


def compare(before: dict, after: dict) -> list[str]:
    problems = []
    for key in sorted(before.keys() | after.keys()):
        if key not in after or key not in before:
            problems.append(f"{key}: only {'before' if key in before else 'after'}")
            continue
        a, b = before[key], after[key]
        for part in ("metrics", "tags", "artifacts"):
            gone, new = set(a[part]) - set(b[part]), set(b[part]) - set(a[part])
            if gone or new:
                problems.append(f"{key} {part}: gone {sorted(gone)[:8]}, new {sorted(new)[:8]}")
        for name in sorted(a["params"].keys() | b["params"].keys()):
            if a["params"].get(name) != b["params"].get(name):
                problems.append(
                    f"{key} param {name}: {a['params'].get(name)!r} -> {b['params'].get(name)!r}"
                )
    return problems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, help="the git revision to compare against")
    p.add_argument("--spec", help="a spec (default: the smoke spec with four CPU compilers)")
    args = p.parse_args()
    bench_args = ["--spec", args.spec] if args.spec else QUICK
    work = Path(tempfile.mkdtemp(prefix="same-record-stores-"))
    with checkout(args.before) as old:
        before = record(benchmark(old, bench_args, work / "before"))
    after = record(benchmark(REPO, bench_args, work / "after"))
    problems = compare(before, after)
    for line in problems:
        print(line)
    print(f"{len(after)} runs; same record: {'no' if problems else 'yes'}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
