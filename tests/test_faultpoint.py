"""The named fault points' own behaviour (the kills they stage are tested in test_faults)."""

from __future__ import annotations

import threading
import time

import pytest

from mlflow_ngraph import faultpoint


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch):
    monkeypatch.setattr(faultpoint, "_seen", {})


def test_hold_waits_at_its_point_until_the_file_is_gone(tmp_path, monkeypatch):
    gate = tmp_path / "gate"
    gate.touch()
    monkeypatch.setenv(faultpoint.ENV, f"record_logged@2:hold={gate}")
    faultpoint.point("record_logged")  # the first pass goes through
    threading.Timer(0.5, gate.unlink).start()
    started = time.monotonic()
    faultpoint.point("record_logged")
    assert time.monotonic() - started >= 0.45
    assert not gate.exists()


def test_a_hold_without_its_file_goes_through_and_an_unknown_action_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(faultpoint.ENV, f"indexed:hold={tmp_path / 'absent'}")
    faultpoint.point("indexed")  # returns at once
    monkeypatch.setenv(faultpoint.ENV, "indexed@2:pause")
    with pytest.raises(ValueError, match="unknown action 'pause'"):
        faultpoint.point("indexed")
