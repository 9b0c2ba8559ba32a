"""The look at the host before a run measures: a real competing load is seen and named, a
busy host is said in one line and waited for, measured anyway or stopped at."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.measure import quiet
from mlflow_ngraph.measure.quiet import HostCheck, HostLoad, parse_wait, sample_host
from tests._hog import cpu_hog

QUIET = HostLoad(3.0, 2, 0.4)
BUSY = HostLoad(97.0, 2, 4.2, (("python3", 4101, 50.0), ("python3", 4102, 46.0)))


def _sampler(*loads: HostLoad):
    """A sampler that finds ``loads`` in turn (the last one from then on)."""
    seen = list(loads)

    def sample(seconds: float) -> HostLoad:
        assert 0 < seconds <= 3.0
        return seen.pop(0) if len(seen) > 1 else seen[0]

    return sample


@pytest.mark.serial
def test_a_competing_load_is_seen_and_its_processes_named(tmp_path, monkeypatch):
    monkeypatch.setattr(quiet, "TOP", 12)  # named however busy the rest of the host is
    with cpu_hog(tmp_path, processes=2) as pids:
        load = sample_host(1.0)
    assert load.other_percent > 60  # two busy loops on the cores (beside this test's own)
    assert {pid for _, pid, _ in load.top} & set(pids)
    assert all(percent > 1.0 for _, _, percent in load.top)
    said = load.said()
    assert f"pid {next(p for _, p, _ in load.top if p in pids)}" in said
    assert "other processes" in said and "of the CPU" in said


def test_this_process_tree_is_not_counted_as_another():
    end = time.monotonic() + 0.8
    spinner = threading.Thread(
        target=lambda: [None for _ in iter(lambda: time.monotonic() < end, False)]
    )
    spinner.start()  # this process busy during the sample: none of it is another's
    load = sample_host(0.5)
    spinner.join()
    assert os.getpid() not in {pid for _, pid, _ in load.top}


def test_a_quiet_host_goes_on_without_a_word(caplog):
    check = HostCheck(25.0, wait_s=0, sampler=_sampler(QUIET))
    with caplog.at_level(logging.INFO, "mlflow_ngraph"):
        assert check.run() is QUIET
    assert caplog.records == []


def test_a_real_sample_passes_where_any_load_is_allowed():
    """--max-other-cpu 100: whatever the host does is allowed, so the real sample passes."""
    load = HostCheck(100.0, wait_s=0, sample_s=0.3).run()
    assert 0 <= load.other_percent <= 100 and load.cores >= 1


def test_a_busy_host_stops_the_run_in_one_line_naming_the_fix():
    check = HostCheck(25.0, wait_s=0, sampler=_sampler(BUSY))
    with pytest.raises(NgraphError) as raised:
        check.run()
    line = str(raised.value)
    assert "\n" not in line and raised.value.exit_code == 2
    assert "load 4.2" in line and "97% of the CPU" in line and "> 25% allowed" in line
    assert "python3 (pid 4101) 50%" in line and "(pid 4102)" in line
    assert "--busy-ok" in line and "--wait-quiet" in line


def test_busy_ok_says_it_once_and_goes_on(caplog):
    check = HostCheck(25.0, wait_s=300, busy_ok=True, sampler=_sampler(BUSY))
    with caplog.at_level(logging.INFO, "mlflow_ngraph"):
        assert check.run() is BUSY
    assert len(caplog.records) == 1
    assert "pid 4101" in caplog.text and "measuring anyway" in caplog.text


def test_a_host_that_goes_quiet_is_waited_for(caplog):
    check = HostCheck(25.0, wait_s=60, sampler=_sampler(BUSY, BUSY, QUIET))
    with caplog.at_level(logging.INFO, "mlflow_ngraph"):
        assert check.run() is QUIET
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "waiting up to 60 s" in lines[0] and "--busy-ok" in lines[0]
    assert "quiet now" in lines[1]


def test_a_host_that_stays_busy_ends_the_wait_with_the_fix():
    check = HostCheck(25.0, wait_s=0.3, sample_s=0.1, sampler=lambda s: BUSY)
    with pytest.raises(NgraphError, match="stayed busy for 0 s.*--busy-ok.*--wait-quiet"):
        check.run()


def test_ctrl_c_during_the_wait_ends_it_as_any_interrupt():
    def sample(seconds: float) -> HostLoad:
        if sample.calls:
            raise KeyboardInterrupt
        sample.calls += 1
        return BUSY

    sample.calls = 0
    with pytest.raises(KeyboardInterrupt):
        HostCheck(25.0, wait_s=60, sampler=sample).run()


def test_the_consumers_names_are_shown_visibly():
    load = HostLoad(50.0, 2, None, (("evil\x1b[2Jname", 7, 50.0),))
    assert "\x1b" not in load.said() and "(pid 7) 50%" in load.said()


@pytest.mark.parametrize("bad", ["-1", "abc", "inf", "nan", ""])
def test_a_bad_wait_is_one_line(bad):
    with pytest.raises(NgraphError, match="wait-quiet must be a number of seconds >= 0"):
        parse_wait(bad)
    assert parse_wait("0") == 0 and parse_wait("12.5") == 12.5
