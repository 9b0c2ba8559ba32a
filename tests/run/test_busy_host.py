"""A busy host said before it costs time: ``benchmark`` beside a real CPU hog stops in one line
naming it (``--wait-quiet 0``), measures anyway under ``--busy-ok``, and a resume with
nothing left to do does not look at the host at all."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.measure import quiet
from tests._hog import cpu_hog
from tests._support import TINY

#: measured in this process with one compiler: the check is what is tested, not the engines
ARGS = [*TINY, "--compiler", "identity", "--isolation", "none", "--experiment", "busy"]


@pytest.fixture
def looking(monkeypatch):
    """The check as a user meets it (the suite's runs skip it), over a short sample, naming
    enough consumers that the hog is among them on a host busy with more than the test."""
    monkeypatch.setenv("MLFLOW_NGRAPH_BENCHMARK_BUSY_OK", "0")
    monkeypatch.setattr(quiet, "SAMPLE_S", 0.5)
    monkeypatch.setattr(quiet, "TOP", 12)


@pytest.mark.serial
def test_a_busy_host_stops_before_measuring_or_goes_on_when_told(
    run_cli, tracking_uri, tmp_path, looking
):
    uri = ["--tracking-uri", tracking_uri]
    with cpu_hog(tmp_path, processes=2) as pids:
        code, out, err = run_cli("benchmark", *ARGS, *uri, "--wait-quiet", "0")
        assert code == 2, err
        line = err.strip().splitlines()[-1]
        assert line.startswith("error: the host is busy (") and "--busy-ok" in line
        assert any(f"(pid {pid})" in line for pid in pids), line
        assert MlflowClient(tracking_uri).get_experiment_by_name("busy") is None  # no run left

        code, out, err = run_cli("benchmark", *ARGS, *uri, "--wait-quiet", "0", "--busy-ok")
        assert code == 0, err
        said = [line for line in err.splitlines() if "the host is busy" in line]
        assert len(said) == 1 and "measuring anyway (--busy-ok)" in said[0]
        assert "estimated time" in err.split(said[0])[1]  # the estimate after the look

        # a resume with nothing to do does not pay for a look (nor stop at a busy host)
        code, out, err = run_cli("benchmark", *ARGS, *uri, "--wait-quiet", "0")
    assert code == 0, err
    assert "nothing to do" in out + err and "the host is busy" not in err


@pytest.mark.parametrize("bad", ["-5", "soon"])
def test_a_bad_wait_quiet_is_one_line(run_cli, bad):
    code, out, err = run_cli("benchmark", *ARGS, "--wait-quiet", bad)
    assert code == 2
    assert err.strip().splitlines() == [
        f"error: wait-quiet must be a number of seconds >= 0 (0: do not wait), got {bad!r}"
    ]
