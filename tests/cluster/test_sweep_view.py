"""The sweep's live view against a real sqlite store and an unreachable server."""

from __future__ import annotations

import socket
import time

from mlflow_ngraph.cluster.spec import parse_sweep
from mlflow_ngraph.cluster.sweep import DeviceState, SweepOutcome, live_view, progress

SPEC = {
    "experiment": "view",
    "devices": [{"name": "cpu-b", "profile": "cpu"}, {"name": "cpu-c", "profile": "cpu"}],
    "models": [{"name": "conv_block", "params": {"width": 8, "depth": 1, "image_size": 32}}],
    "compilers": ["identity"],
}


def _cell(client, exp: str, device: str, status: str) -> None:
    run = client.create_run(exp, tags={"ngraph.role": "cell", "ngraph.device": device})
    client.set_terminated(run.info.run_id, status)


def test_a_device_is_counted_by_its_name_not_by_its_profile(tracking_uri):
    from mlflow_ngraph.tracking import mlflow_log as ml

    client = ml.connect(tracking_uri)
    exp = client.create_experiment("view")
    _cell(client, exp, "cpu", "FINISHED")  # a benchmark of the profile outside the sweep
    _cell(client, exp, "cpu", "FAILED")
    _cell(client, exp, "cpu-b", "FINISHED")
    cells = progress(tracking_uri, parse_sweep(SPEC))
    assert cells["cpu-b"]["done"] == 1 and cells["cpu-b"]["failed"] == 0
    assert cells["cpu-c"] == {"done": 0, "running": 0, "failed": 0, "current": "", "finished": []}


def test_an_unreachable_server_is_said_within_seconds_not_counted_as_nothing():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once closed
    start = time.time()
    assert progress(f"http://127.0.0.1:{port}", parse_sweep(SPEC)) is None
    assert time.time() - start < 15


def test_the_view_shows_a_missing_device_with_its_reason():
    sweep = parse_sweep(SPEC)
    outcome = SweepOutcome("s", {d.name: DeviceState(d) for d in sweep.devices})
    gone = outcome.states["cpu-c"]
    gone.state, gone.reason = "missing", "its node left mid-sweep and none joined within 5 s"
    view = live_view(outcome, {})
    row = next(line for line in view.splitlines() if line.startswith("cpu-c"))
    assert "missing" in row and "its node left mid-sweep" in row
    assert not outcome.ok
