"""The driver's reaper: a driver killed with ``kill -9`` leaves nothing it started running,
in its own session (even a process that ignores SIGTERM) or in one a child made (a local
cluster's head runs in a session of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests._support import REPO, running

DRIVER = """
import subprocess, sys, time
from mlflow_ngraph.cluster.driver import start_reaper
start_reaper()
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
here = subprocess.Popen([sys.executable, "-c", stubborn])
own = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                       start_new_session=True)
print(here.pid, own.pid, flush=True)
time.sleep(600)
"""


def test_a_driver_killed_with_kill_9_leaves_nothing_it_startedrunning():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # as Driver.launch starts it
    children = [int(p) for p in driver.stdout.readline().split()]
    try:
        time.sleep(2.5)  # the reaper notes the sessions of the driver's family every second
        assert all(running(p) for p in children)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.time() + 20
        while any(running(p) for p in children) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in children if running(p)], "a process outlived its killed driver"
    finally:
        for p in children:
            if running(p):
                os.kill(p, signal.SIGKILL)
