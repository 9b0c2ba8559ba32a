"""The gate's error rates and time, measured: ``python bench/bench_gate.py --other-python
/tmp/venv-ov2025/bin/python`` (alone on the host: each gate first waits for a quiet host, as
a user's does; ``--count`` fewer gates for a quick look). Its three parts, with issue 41's
counts and bars:

1. A/A: the same engine as champion and challenger, 20 gates: "slower" at most 1 of 20;
2. planted slowdown: the challenger the same engine with a fixed extra delay of 10% of its
   time (a busy wait of 10% of each window's own time, the test-only
   ``MLFLOW_NGRAPH_GATE_PLANTED_DELAY``), 20 gates: "slower" at least 19 of 20;
3. a real upgrade: the champion's worker on this environment's OpenVINO, the challenger's on
   another environment's (``--other-python``: a venv with another OpenVINO and a .pth to
   this one's packages; docs/gate.md's upgrade recipe), on resnet18 at batch 1 and 8: the
   verdict, the ratio and its interval, and the gate's time (under 3 minutes a batch size).

At the end, one table: every gate's verdict, ratio, interval, time and the host's load,
then each part's figure against its bar.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

SMALL = "conv_block:width=32,depth=2,image_size=64@onnxruntime:intra_op_num_threads=1"
#: the bars of issue 41 (per 20 gates), and the upgrade's seconds a batch size
AA_SLOWER_AT_MOST, PLANTED_SLOWER_AT_LEAST, UPGRADE_S = 1, 19, 180
VENV_RECIPE = (
    "python3.11 -m venv /tmp/venv-ov2025 && /tmp/venv-ov2025/bin/pip install "
    "openvino==2025.4.1 && echo $(python -c 'import sysconfig; print(sysconfig.get_paths()"
    '["purelib"])\') > /tmp/venv-ov2025/lib/python3.11/site-packages/main.pth'
)


def gate(root: str, champion: str, challenger: str, *extra: str, env=None) -> dict:
    """One gate as a user runs it; its JSON result with ``took`` (seconds, start to end)
    and ``load`` (the 1-minute load average at its end)."""
    command = [sys.executable, "-m", "mlflow_ngraph", "gate", "--champion", champion,
               "--challenger", challenger, "--format", "json",
               "--tracking-uri", f"sqlite:///{root}/mlflow.db", *extra]  # fmt: skip
    began = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    took = time.monotonic() - began
    try:
        result = json.loads(done.stdout)
    except ValueError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        result = {"verdict": "error", "error": last[:200]}
    return {**result, "took": took, "load": os.getloadavg()[0]}


def row(part: str, result: dict) -> str:
    def num(key: str) -> str:
        value = result.get(key)
        return f"{value:.3f}" if isinstance(value, (int, float)) else "-"

    interval = f"[{num('low')}, {num('high')}]"
    return (
        f"{part:<16} {result['verdict']:<8} {num('ratio'):>6} {interval:<15} "
        f"{result.get('rounds', '-')!s:>6} {result['took']:>7.0f} {result['load']:>5.2f}"
        + (f"  {result['error']}" if result.get("error") else "")
    )


def series(root: str, name: str, count: int, env=None) -> list[dict]:
    """``count`` gates of the small engine against itself (``env``: the planted delay)."""
    results = []
    for i in range(count):
        result = gate(root, SMALL, SMALL, "--budget", "30s", env=env)
        results.append(result)
        print(row(f"{name} {i + 1}/{count}", result), flush=True)
    return results


def upgrade(root: str, other_python: str, model: str, compiler: str) -> list[dict]:
    results = []
    for b in (1, 8):
        spec = f"{model}@{compiler}"
        result = gate(root, spec, spec, "--batch-size", str(b), "--budget", "90s",
                      "--challenger-python", other_python)  # fmt: skip
        result["batch_size"] = b
        results.append(result)
        print(row(f"upgrade bs{b}", result), flush=True)
    return results


def slower(results: list[dict]) -> int:
    return sum(r["verdict"] == "slower" for r in results)


def met(ok: bool, count: int = 20) -> str:
    if count != 20:
        return "the bar is for 20 gates"
    return "met" if ok else "NOT met"


def summary(aa: list[dict], planted: list[dict], upgraded: list[dict]) -> list[str]:
    """Each part's figure against issue 41's bar."""
    lines = []
    if aa:
        verdicts = {v: sum(r["verdict"] == v for r in aa) for v in {r["verdict"] for r in aa}}
        lines.append(f"A/A: slower {slower(aa)} of {len(aa)} (bar: at most "
                     f"{AA_SLOWER_AT_MOST} of 20; {met(slower(aa) <= AA_SLOWER_AT_MOST, len(aa))}"
                     f"); all verdicts {verdicts}")  # fmt: skip
    if planted:
        ratios = sorted(r["ratio"] for r in planted if isinstance(r.get("ratio"), float))
        median = f"{ratios[len(ratios) // 2]:.3f}" if ratios else "-"
        ok = slower(planted) >= PLANTED_SLOWER_AT_LEAST
        lines.append(f"planted 10%: slower {slower(planted)} of {len(planted)} (bar: at least "
                     f"{PLANTED_SLOWER_AT_LEAST} of 20; {met(ok, len(planted))}); median ratio "
                     f"{median} (1/1.1 = 0.909 by construction)")  # fmt: skip
    for r in upgraded:
        runtimes = (r.get("champion", {}).get("runtime"), r.get("challenger", {}).get("runtime"))
        lines.append(f"upgrade bs{r['batch_size']}: {r['verdict']}, {runtimes[0]} -> "
                     f"{runtimes[1]}, the gate took {r['took']:.0f} s (bar: under "
                     f"{UPGRADE_S} s; {met(r['took'] < UPGRADE_S)})")  # fmt: skip
    return lines


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20, help="Gates of A/A and of planted.")
    parser.add_argument("--other-python", help="The upgrade's challenger environment.")
    parser.add_argument("--compiler", default="openvino", help="The upgraded runtime.")
    parser.add_argument("--upgrade-model", default="resnet18", help="The upgrade's model.")
    parser.add_argument("--skip", default="", help="aa,planted,upgrade to leave out")
    args = parser.parse_args()
    if "upgrade" not in args.skip and not args.other_python:
        parser.error(f"the upgrade needs --other-python (or --skip upgrade): {VENV_RECIPE}")
    return args


def main() -> None:
    args = arguments()
    root = tempfile.mkdtemp(prefix="bench-gate-")
    os.environ.setdefault("MLFLOW_NGRAPH_HOME", os.path.join(root, "home"))
    print(f"bench_gate: {SMALL}; {args.count} gates a part; load {os.getloadavg()[0]:.2f}")
    aa = [] if "aa" in args.skip else series(root, "A/A", args.count)
    planted = []
    if "planted" not in args.skip:
        env = {"MLFLOW_NGRAPH_GATE_PLANTED_DELAY": "0.1"}
        planted = series(root, "planted", args.count, env)
    upgraded = (
        []
        if "upgrade" in args.skip
        else upgrade(root, args.other_python, args.upgrade_model, args.compiler)
    )
    print(f"\n{'gate':<16} {'verdict':<8} {'ratio':>6} {'95% CI':<15} {'rounds':>6} "
          f"{'seconds':>7} {'load':>5}")  # fmt: skip
    for name, results in (("A/A", aa), ("planted", planted)):
        for i, result in enumerate(results):
            print(row(f"{name} {i + 1}", result))
    for result in upgraded:
        print(row(f"upgrade bs{result['batch_size']}", result))
    print()
    print("\n".join(summary(aa, planted, upgraded)))


if __name__ == "__main__":
    main()
