"""Environment variables by which the package's processes hand settings to each other.

Below the cluster (which sets them for a device's benchmark) and the tracking code (which
reads them into the runs it writes), so that each reads them downward.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: the name of the device a sweep task benchmarks (two hosts of one profile stay apart)
ENV_DEVICE_NAME = "MLFLOW_NGRAPH_DEVICE_NAME"
#: the id of the sweep a benchmark belongs to (tagged on every run it logs)
ENV_SWEEP_ID = "MLFLOW_NGRAPH_SWEEP_ID"
#: the run every device's benchmark run is nested under (the ``mlflow run`` run of the
#: ``ngraph-ray`` project backend)
ENV_PARENT_RUN = "MLFLOW_NGRAPH_PARENT_RUN_ID"
#: the run of the ``mlflow-ngraph tune`` whose trials a benchmark measures (tagged on every
#: cell it logs: ``ngraph.tune``)
ENV_TUNE_RUN = "MLFLOW_NGRAPH_TUNE_RUN_ID"
#: seconds of the look at the host before a run measures (default 3; the test suite, whose
#: runs go on whatever the host does, looks briefly)
ENV_HOST_SAMPLE_S = "MLFLOW_NGRAPH_HOST_SAMPLE_S"


@contextlib.contextmanager
def environment(values: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for ``None``, remove) environment variables for the block; restored after."""
    saved = {k: os.environ.get(k) for k in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: TEST ONLY (bench/bench_gate.py's planted slowdown): the share of each window's own time a
#: ``mlflow-ngraph gate``'s challenger worker busy-waits at its end (``0.1``: the same engine
#: 10% slower by construction). Nothing else reads it; a gate run with it set says so on
#: every output and tags its run ``ngraph.gate.planted_delay``.
ENV_GATE_PLANTED_DELAY = "MLFLOW_NGRAPH_GATE_PLANTED_DELAY"
