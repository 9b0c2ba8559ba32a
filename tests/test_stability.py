"""Stability per batch size and per cell: tags, the warning line, and --stable-retries."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import schema as S
from tests._support import TINY


def _cell(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    return next(r for r in runs if r.data.tags.get(S.T_ROLE) == "cell")


def test_a_cv_above_the_threshold_is_unstable_retried_and_said(run_cli, tracking_uri):
    # no real measurement has a CV below 1e-9: every batch size is UNSTABLE
    code, out, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--experiment", "unstable",
        "--tracking-uri", tracking_uri, "--cv-threshold", "1e-9", "--stable-retries", "1",
        "--isolation", "none",
    )  # fmt: skip
    assert code == 0, err
    tags = _cell(tracking_uri, "unstable").data.tags
    assert tags[S.T_STABILITY] == S.STABILITY_UNSTABLE
    for b in (1, 2):
        assert tags[f"{S.T_STABILITY}.bs{b}"] == S.STABILITY_UNSTABLE
        assert "CV" in tags[f"{S.T_STABILITY_REASON}.bs{b}"]
        assert tags[f"{S.T_ATTEMPTS}.bs{b}"] == "2"
    assert "bs1 UNSTABLE: CV" in err and "--stable-retries" in err
    assert "kept the steadiest of 2 attempts" in err


def test_a_steady_measurement_is_stable(run_cli, tracking_uri):
    code, out, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--experiment", "stable",
        "--tracking-uri", tracking_uri, "--cv-threshold", "1000", "--stable-retries", "3",
    )  # fmt: skip
    assert code == 0, err
    tags = _cell(tracking_uri, "stable").data.tags
    assert tags[S.T_STABILITY] == S.STABILITY_STABLE
    assert tags[f"{S.T_STABILITY}.bs2"] == S.STABILITY_STABLE
    assert tags[f"{S.T_ATTEMPTS}.bs2"] == "1"
    assert f"{S.T_STABILITY_REASON}.bs2" not in tags
    assert "UNSTABLE" not in err


def test_retries_keep_a_stable_attempt_over_a_lower_cv_on_a_busy_host(monkeypatch):
    """Host load cannot be ordered on demand: hand-made attempts stand in for it."""
    from types import SimpleNamespace

    from mlflow_ngraph import worker
    from mlflow_ngraph.config import MeasureSettings

    monkeypatch.setattr(worker, "RETRY_PAUSE_S", 0)
    attempts = iter(
        [
            {"cv": 0.02, S.M_HOST_OTHER_CPU: 70.0},  # steady only because the host was busy
            {"cv": 0.01, S.M_HOST_OTHER_CPU: 60.0},
            {"cv": 0.06, S.M_HOST_OTHER_CPU: 3.0},  # a quiet window
        ]
    )

    def measure(engine, b, settings, gpu=False):
        data = next(attempts)
        return SimpleNamespace(cv=data["cv"], to_dict=lambda: dict(data))

    task = SimpleNamespace(
        name="cell", device_kind="cpu", measure=MeasureSettings(), cv_threshold=0.10,
        max_other_cpu=25.0, stable_retries=3,
    )  # fmt: skip
    best, stability, count = worker._steadiest(task, None, 1, measure)
    assert (best.cv, stability.stable, count) == (0.06, True, 3)
