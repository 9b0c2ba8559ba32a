"""How far the time-left estimate is from the truth.

Runs ``mlflow-ngraph benchmark -q`` in a subprocess and reads its stderr as it comes: the
estimate said at the start, then after each finished cell the ``about X left`` of its line.
Each is set against what was really left (the run's end less the moment the line came).
Two runs in one home: ``cold`` (nothing timed on this host before) and ``learned`` (the same
models and compilers, one more repetition, so every batch size is measured again and its
earlier cost is known).

Printed per run and line: the moment, the estimate of what is left, the truth, and the
relative error ``estimate / truth - 1``; then per run the start's error and the median
absolute error of the live lines.

    python bench/bench_estimate.py                      # conv_block w32 d2, 3 compilers
    python bench/bench_estimate.py --spec default       # the default experiment (~20 min)
    python bench/bench_estimate.py --model conv_block:width=64,depth=2 --compiler openvino \\
        --batch-sizes 1,8 --repetitions 100             # the OpenVINO cell of issue 21
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_UNITS = {"h": 3600, "m": 60, "s": 1}
#: a line with less than this left to run is not judged (the view's clock reads whole seconds)
TAIL_S = 10.0


def seconds_of(text: str) -> float:
    """``1h02m``, ``3m07s`` (the view's durations) as seconds."""
    return float(sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([hms])", text)))


def run(args: list[str], home: Path, uri: str) -> list[tuple[float, float, str]]:
    """(moment, estimate of what is left, the line) of each estimate the run wrote, and a
    last entry for its end."""
    command = [sys.executable, "-m", "mlflow_ngraph", "benchmark", "-q", "--home", str(home),
               "--tracking-uri", uri, *args]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True)  # fmt: skip
    seen = []
    for line in proc.stderr:
        now = time.monotonic() - start
        said = re.search(r"estimated time (\S+)", line)
        left = re.search(r"about (\S+) left\)", line)
        if said:
            seen.append((now, seconds_of(said.group(1)), line.strip()))
        elif left:
            seen.append((now, seconds_of(left.group(1)), line.strip()))
        elif re.match(r"\[\d+/\d+\] ", line):  # the last cell: nothing left to say
            seen.append((now, 0.0, line.strip()))
    proc.wait()
    if proc.returncode:
        raise SystemExit(f"the benchmark exited with {proc.returncode}")
    return seen + [(time.monotonic() - start, 0.0, "end")]


def report(name: str, seen: list[tuple[float, float, str]]) -> None:
    end = seen[-1][0]
    print(f"\n{name}: {end:.0f} s")
    print(f"{'at s':>7} {'said left':>9} {'true left':>9} {'error':>7}  line")
    errors = []
    for moment, left, line in seen[:-1]:
        truth = end - moment
        # the last seconds are the summary and the results index, after the last cell's line
        error = left / truth - 1 if truth > TAIL_S else None
        if error is not None and moment > seen[0][0]:
            errors.append(abs(error))
        shown = f"{error:+7.0%}" if error is not None else "      -"
        print(f"{moment:7.0f} {left:9.0f} {truth:9.0f} {shown}  {line[:60]}")
    first = seen[0]
    live = statistics.median(errors) if errors else float("nan")
    print(f"{name}: start estimate {first[1]:.0f} s for {end - first[0]:.0f} s "
          f"({first[1] / (end - first[0]) - 1:+.0%}); live lines: median |error| "
          f"{live:.0%} over {len(errors)}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", help="a spec (instead of --model/--compiler)")
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--compiler", action="append", default=[])
    p.add_argument("--batch-sizes", default="1,4")
    p.add_argument("--repetitions", type=int, default=10)
    p.add_argument("--home", type=Path, help="a home to keep (default: a fresh temporary one)")
    o = p.parse_args()
    models = o.model or ([] if o.spec else ["conv_block:width=32,depth=2"])
    compilers = o.compiler or ([] if o.spec else ["identity", "onnxruntime", "openvino"])
    base = ["--spec", o.spec] if o.spec else ["--batch-sizes", o.batch_sizes]
    base += [a for m in models for a in ("--model", m)]
    base += [a for c in compilers for a in ("--compiler", c)]
    with tempfile.TemporaryDirectory() as tmp:
        home = o.home or Path(tmp) / "home"
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        cold = run([*base, "--repetitions", str(o.repetitions)], home, uri)
        report("cold", cold)
        learned = run([*base, "--repetitions", str(o.repetitions + 1)], home, uri)
        report("learned", learned)


if __name__ == "__main__":
    main()
