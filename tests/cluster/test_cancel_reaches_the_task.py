"""A cancel reaches a device's task even where the cluster was started with SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess

from tests._support import PYTHON, REPO

# Ray's ray.cancel raises KeyboardInterrupt in a running task with _thread.interrupt_main,
# as this probe does; the probe runs as a Ray worker of a cluster started from a background
# job or under nohup runs: with SIGINT ignored
PROBE = """
import _thread, time
from mlflow_ngraph.cluster import sweep
if FIX:
    sweep._interruptible()
try:
    _thread.interrupt_main()
    time.sleep(0.5)
    print("ran on")
except KeyboardInterrupt:
    print("cancelled")
"""


def _probe(fix: bool) -> str:
    done = subprocess.run(
        [PYTHON, "-c", f"FIX = {fix}\n{PROBE}"], cwd=REPO, capture_output=True, text=True,
        timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_task_with_sigint_ignored_is_made_interruptible():
    assert _probe(fix=False) == "ran on"  # what a cancel met before: it was lost
    assert _probe(fix=True) == "cancelled"
