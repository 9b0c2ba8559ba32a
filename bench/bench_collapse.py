"""The collapse of a threaded engine on a contended host, and what the screen reads of it.

A small model in eager PyTorch with its default intra-op threads (every core), measured in
100 ms windows alone, then beside one busy process; the same with one thread. Each line
prints the requests per second, the process's run delay per window second (its threads
runnable with no core free: ``wait_s``) and the share of the machine other processes took
(``other_s``): the two readings the screen judges a window on (docs/measurement.md).

    python bench/bench_collapse.py                       # mha_block width 256 depth 3, batch 1
    python bench/bench_collapse.py --model conv_block:width=64,depth=3 --windows 20
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def windows(module, x, count: int, sampler):
    import torch

    from mlflow_ngraph.measure.harness import run_delay_s

    out = []
    with torch.inference_mode():
        for _ in range(count):
            sampler.begin()
            wait0, n, t0 = run_delay_s(), 0, time.perf_counter()
            while time.perf_counter() - t0 < 0.1:
                module(x)
                n += 1
            seconds = time.perf_counter() - t0
            wait = (run_delay_s() or 0.0) - (wait0 or 0.0)
            sampler.end()
            other = sampler.last_other_s
            cores = os.cpu_count() or 1
            out.append(
                (n / seconds, wait / seconds, None if other is None else other / seconds / cores)
            )
    return out


def line(label: str, got) -> str:
    rates = [r for r, _, _ in got]
    waits = [w for _, w, _ in got]
    others = [o for _, _, o in got if o is not None]
    return (
        f"{label:28} {statistics.median(rates):9.0f}/s (windows {min(rates):.0f}-{max(rates):.0f})"
        f"  run delay {statistics.median(waits):.2f} s/s"
        f"  others {statistics.median(others) if others else float('nan'):.0%} of the machine"
        f"  (load {os.getloadavg()[0]:.2f})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mha_block:width=256,depth=3")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--windows", type=int, default=15)
    args = p.parse_args()
    import torch

    from mlflow_ngraph.measure.memory import keep_freed_memory
    from mlflow_ngraph.measure.sampler import ResourceSampler
    from mlflow_ngraph.models.registry import load_model

    keep_freed_memory()
    name, _, params = args.model.partition(":")
    kwargs = {k: int(v) for k, v in (item.split("=") for item in params.split(",") if item)}
    model = load_model(name, kwargs)
    x = torch.from_numpy(model.random_input(args.batch_size))
    sampler = ResourceSampler()
    threads = torch.get_num_threads()
    results = {}
    for n in (threads, 1):
        torch.set_num_threads(n)
        windows(model.module, x, 5, sampler)  # warm
        alone = windows(model.module, x, args.windows, sampler)
        # not a child of this process (the sampler counts its own children as its own): a
        # process of its own, as another program on the host is
        started = subprocess.run(
            ["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        hog = int(started.stdout.strip())
        try:
            time.sleep(0.3)
            beside = windows(model.module, x, args.windows, sampler)
        finally:
            os.kill(hog, signal.SIGKILL)
        print(line(f"{n} thread(s), alone", alone))
        print(line(f"{n} thread(s), beside one hog", beside))
        results[n] = statistics.median(r for r, _, _ in alone) / statistics.median(
            r for r, _, _ in beside
        )
    print(
        f"slower beside one busy process: {results[threads]:.1f}x with {threads} threads, "
        f"{results[1]:.1f}x with 1"
    )


if __name__ == "__main__":
    main()
