"""A competing load for the noise tests: busy processes that are not descendants of the
test (started through a shell that exits at once), so no process tree counts them as its
own, as with another user's job.

Each hog writes its pid to a file of its own block (two hogs in one test never wait on each
other's pids), stays in the test's process group, and ends by itself when the test's process
is gone or after ``limit`` seconds, so a test killed mid-block leaves no busy loop behind for
the tests after it to measure. Tests that use it are ``serial``: they run alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

# a busy loop that checks every ~10 ms whether the test (its pid) is still there
_LOOP = """
import os, time
end = time.monotonic() + {limit}
while time.monotonic() < end:
    for _ in range(20000):
        pass
    try:
        os.kill({owner}, 0)
    except OSError:
        break
"""


@contextmanager
def cpu_hog(tmp_path: Path, processes: int = 2, limit: float = 300):
    """``processes`` busy loops, detached from the caller, until the block ends."""
    handle, name = tempfile.mkstemp(prefix="hog-", suffix=".pids", dir=tmp_path)
    os.close(handle)
    pids_file = Path(name)
    loop = _LOOP.format(limit=limit, owner=os.getpid())
    script = " ".join(
        f"{sys.executable} -c '{loop}' & echo $! >> {pids_file};" for _ in range(processes)
    )
    subprocess.run(["sh", "-c", script], check=True)
    pids = [int(p) for p in pids_file.read_text().split()]  # the shell has written them
    try:
        assert len(pids) == processes, pids
        time.sleep(0.3)  # let them reach the loop
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
