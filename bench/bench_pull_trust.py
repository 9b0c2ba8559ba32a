"""What verifying signed records costs: ``pull`` of an experiment's fastest engine with the
code of another checkout (``--before``, e.g. ``git archive`` of a commit without signed
records) and with this one, interleaved, as fresh processes (target: after / before at most
1.2); then the time to sign one result as a share of the time it was measured (target: at
most 2%), for every result the producer's home journaled in the experiment.

Usage (a store a benchmark wrote with this code, and that benchmark's home)::

    git archive <commit> mlflow_ngraph | tar -x -C /tmp/before
    MLFLOW_NGRAPH_HOME=/tmp/h mlflow-ngraph benchmark --spec default --tracking-uri sqlite:///s.db
    .venv/bin/python bench/bench_pull_trust.py --before /tmp/before --home /tmp/h \\
        --tracking-uri sqlite:///s.db -e ngraph-default --model resnet18
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def one_pull(code: Path, args: argparse.Namespace, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "mlflow_ngraph", "pull", "-e", args.experiment,
               "--device", args.device, "--model", args.model, "-o", str(out),
               "--allow-unstable", "--tracking-uri", args.tracking_uri]  # fmt: skip
    # the producer's home: its own key is trusted (the code before ignores it)
    env = {**os.environ, "PYTHONPATH": str(code), "MLFLOW_NGRAPH_HOME": str(args.home)}
    env.pop("MLFLOW_NGRAPH_SIGNING_KEY", None)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pull with {code} failed: {done.stderr[-2000:]}")
    return took


def pulls(args: argparse.Namespace) -> float:
    """Interleaved pulls; prints both medians and returns after / before."""
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):
            times["before"].append(one_pull(args.before, args, Path(tmp) / "before"))
            times["after"].append(one_pull(HERE, args, Path(tmp) / "after"))
    for name, values in times.items():
        print(
            f"{name:6s} pull (fresh process): median {statistics.median(values):.2f} s "
            f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
        )
    return statistics.median(times["after"]) / statistics.median(times["before"])


def signing_shares(args: argparse.Namespace) -> list[tuple[float, float]]:
    """(seconds to sign, seconds measured) of every result the home journaled, each signed
    again (with the producer's key, into a scratch run of the same store)."""
    sys.path.insert(0, str(HERE))
    from mlflow_ngraph.keys import private_path
    from mlflow_ngraph.tracking.journal import Journal
    from mlflow_ngraph.tracking.mlflow_log import connect
    from mlflow_ngraph.tracking.provenance import Producer

    os.environ.pop("MLFLOW_NGRAPH_SIGNING_KEY", None)
    client = connect(args.tracking_uri)
    producer = Producer(private_path(args.home))
    experiment = client.get_experiment_by_name("bench-signing") or None
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment("bench-signing")
    )
    scratch = client.create_run(experiment_id).info.run_id
    shares = []
    for path in sorted((args.home / "journals").glob("*.jsonl")):
        for state in Journal(path).cells.values():
            for b, record in state.measured.items():
                measured = (record.get("metrics") or {}).get("duration_s")
                if not measured or state.description is None:
                    continue
                start = time.perf_counter()
                producer.sign(client, scratch, experiment_id, b, record, state.description)
                shares.append((time.perf_counter() - start, float(measured)))
    client.delete_run(scratch)
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="Checkout of the old code.")
    parser.add_argument("--home", type=Path, required=True, help="The benchmark's home.")
    parser.add_argument("--tracking-uri", required=True)
    parser.add_argument("-e", "--experiment", required=True)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    ratio = pulls(args)
    print(
        f"pull, after / before: {ratio:.3f} (target <= 1.2): {'met' if ratio <= 1.2 else 'NOT met'}"
    )
    shares = signing_shares(args)
    if not shares:
        raise SystemExit(f"{args.home} journals no measured result to time signing with")
    fractions = sorted(sign / measured for sign, measured in shares)
    worst = fractions[-1]
    each = statistics.median(sign for sign, _ in shares)
    print(
        f"signing {len(shares)} results: median {1000 * each:.1f}"
        f" ms each; share of its measuring time: median {100 * statistics.median(fractions):.2f}%"
        f", max {100 * worst:.2f}% (target <= 2%): {'met' if worst <= 0.02 else 'NOT met'}"
    )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
