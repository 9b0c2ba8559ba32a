"""A measuring process keeps the memory it frees: a buffer allocated again after it was freed
costs no page faults (measure/memory.py)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure import memory
from mlflow_ngraph.run import environment as env

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the kept heap is set through glibc's mallopt",
)

# in a fresh process: the policy applied, then the page faults of allocating, filling and
# freeing a 48 MiB buffer (an inference's activation), after the first time
_FAULTS = """
import ctypes, json, resource
from mlflow_ngraph.measure.memory import keep_freed_memory
applied = keep_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 48 * 2**20
def fill():
    p = libc.malloc(size)
    libc.memset(p, 1, size)
    libc.free(p)
fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    fill()
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps([applied, (after - before) / 5]))
"""


def _faults(policy: str | None) -> tuple[str, float]:
    environ = {k: v for k, v in os.environ.items() if k != memory.MALLOC_ENV}
    if policy is not None:
        environ[memory.MALLOC_ENV] = policy
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], env=environ, capture_output=True, text=True, check=True
    )
    applied, faults = json.loads(out.stdout)
    return applied, faults


@glibc
def test_a_kept_heap_serves_a_freed_buffer_again_without_page_faults():
    applied, kept = _faults(None)  # the default
    assert applied.startswith("keep")
    system, defaults = _faults("system")
    assert system == "system"
    pages = 48 * 2**20 // 4096
    # glibc's defaults map a buffer this size afresh each time: every page faults in again
    assert defaults > 0.9 * pages
    assert kept < 0.01 * pages


def test_the_policy_is_named_in_the_environment_record(monkeypatch):
    monkeypatch.delenv(memory.MALLOC_ENV, raising=False)
    assert env.environment("cpu", "cpu")["malloc"] == memory.record()["malloc"]
    monkeypatch.setenv(memory.MALLOC_ENV, "system")
    assert memory.record() == {"malloc": "system"}


def test_a_policy_that_is_no_choice_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(memory.MALLOC_ENV, "jemalloc")
    with pytest.raises(NgraphError, match=r"MLFLOW_NGRAPH_MALLOC='jemalloc' .* keep or system"):
        memory.record()
