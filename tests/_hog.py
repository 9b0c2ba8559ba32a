"""A competing load for the noise tests: busy processes that are not descendants of the
test (started through a shell that exits at once), so no process tree counts them as its
own, as with another user's job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def cpu_hog(tmp_path: Path, processes: int = 2):
    """``processes`` busy loops, detached from the caller, until the block ends."""
    pids_file = tmp_path / "hog.pids"
    loop = "while True: pass"
    script = " ".join(
        f"{sys.executable} -c '{loop}' & echo $! >> {pids_file};" for _ in range(processes)
    )
    subprocess.run(["sh", "-c", script], check=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
        if len(pids) == processes:
            break
        time.sleep(0.05)
    try:
        time.sleep(0.3)  # let them reach the loop
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
