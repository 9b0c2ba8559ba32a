"""The selection rules of pull/register, on hand-made cell runs: the metric and its
direction, the latency cap, and INVALID, FAILED and baseline cells set aside with reasons."""

from __future__ import annotations

import math

import mlflow
import pytest

from mlflow_ngraph.deploy.select import candidates, rank
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import schema as S

CELLS = {
    # compiler: (status, {batch: (throughput, p50, p99, valid)})
    "identity": ("OK", {1: (100.0, 10.0, 12.0, 1.0)}),
    "onnxruntime": ("OK", {1: (300.0, 3.3, 9.0, 1.0), 8: (900.0, 8.0, 30.0, 1.0)}),
    "openvino": ("INVALID", {1: (500.0, 2.0, 2.5, 0.0)}),
    "torchscript": ("OK", {1: (250.0, 2.5, 3.0, 1.0)}),
    "tvm": ("FAILED", {}),
}


@pytest.fixture
def hand_made(tmp_path, tracking_uri):
    uri = tracking_uri
    client = mlflow.tracking.MlflowClient(uri)
    experiment_id = client.create_experiment("hand")
    for compiler, (status, batches) in CELLS.items():
        tags = {S.T_ROLE: "cell", S.T_STATUS: status, S.T_DEVICE: "xeon"}
        if status == "FAILED":
            tags[S.T_ERROR] = "tvm segfaulted"
        run = client.create_run(experiment_id, tags=tags)
        run_id = run.info.run_id
        for key, value in {
            S.P_DEVICE: "xeon", S.P_MODEL: "resnet18", S.P_COMPILER: compiler,
            S.P_FAMILY: "resnet", S.P_SCENARIO: "throughput",
        }.items():  # fmt: skip
            client.log_param(run_id, key, value)
        for b, (throughput, p50, p99, valid) in batches.items():
            values = {
                S.M_THROUGHPUT: throughput, S.M_LATENCY_P50: p50, S.M_LATENCY_P99: p99,
                S.M_VALID: valid, S.M_CV: 0.05,
            }  # fmt: skip
            for name, value in values.items():
                client.log_metric(run_id, S.flat_key(name, b), value, step=b)
        if compiler == "onnxruntime":  # its batch-8 figure is noise on the measuring host
            # where a re-run on the measuring host is expected to land (its spread measured)
            client.log_metric(run_id, S.flat_key(S.M_THROUGHPUT_RERUN_LOW, 1), 91.5, step=1)
            client.log_metric(run_id, S.flat_key(S.M_THROUGHPUT_RERUN_HIGH, 1), 108.5, step=1)
            client.set_tag(run_id, f"{S.T_STABILITY}.bs8", S.STABILITY_UNSTABLE)
            client.set_tag(run_id, f"{S.T_STABILITY}.bs1", S.STABILITY_STABLE)
        client.set_terminated(run_id)
    return client, uri


def _pick(client, uri, **kwargs):
    found = candidates(client, uri, "hand", "xeon", "resnet18", live=True)
    return rank(found, **kwargs)


def test_unstable_candidates_are_set_aside_unless_allowed(hand_made):
    from mlflow_ngraph.deploy.select import describe

    client, uri = hand_made
    selection = _pick(client, uri)
    best = selection.ranked[0]
    assert (best.compiler, best.batch_size) == ("onnxruntime", 1)
    unstable = [c for c in selection.excluded if c.reason.startswith("UNSTABLE")]
    assert [(c.compiler, c.batch_size) for c in unstable] == [("onnxruntime", 8)]
    listing = describe(selection)
    assert "1 UNSTABLE candidate(s) set aside" in listing
    assert "re-run CI" in listing and "91.5-108.5" in listing  # beside this run's interval
    allowed = _pick(client, uri, allow_unstable=True)
    assert (allowed.ranked[0].compiler, allowed.ranked[0].batch_size) == ("onnxruntime", 8)


def test_best_throughput_skips_invalid_failed_and_baseline(hand_made):
    client, uri = hand_made
    selection = _pick(client, uri, allow_unstable=True)
    best = selection.ranked[0]
    assert (best.compiler, best.batch_size) == ("onnxruntime", 8)
    reasons = {c.compiler: c.reason for c in selection.excluded}
    assert reasons["openvino"].startswith("INVALID")  # the fastest, but wrong outputs
    assert reasons["tvm"].startswith("FAILED") and "segfaulted" in reasons["tvm"]
    assert "no compiled engine" in reasons["identity"]


def test_latency_metric_is_lowest_first_and_the_cap_applies_to_p99(hand_made):
    client, uri = hand_made
    by_latency = _pick(client, uri, metric=S.M_LATENCY_P50, allow_unstable=True)
    assert [c.compiler for c in by_latency.ranked][:2] == ["torchscript", "onnxruntime"]
    capped = _pick(client, uri, max_latency_ms=10.0, allow_unstable=True)
    assert [(c.compiler, c.batch_size) for c in capped.ranked] == [
        ("onnxruntime", 1),
        ("torchscript", 1),
    ]
    over = next(c for c in capped.excluded if c.batch_size == 8)
    assert "p99 latency 30.00 ms over the cap of 10 ms" in over.reason
    assert all(not math.isnan(c.value(S.M_THROUGHPUT)) for c in capped.ranked)


def test_unknown_metric_is_an_error(hand_made):
    client, uri = hand_made
    with pytest.raises(NgraphError, match="unknown metric"):
        _pick(client, uri, metric="accuracy")


def _ranked(*figures, metric=S.M_THROUGHPUT):
    """Candidates best first: (compiler, throughput, its interval, its re-run interval or
    None, stability)."""
    from mlflow_ngraph.deploy.select import Candidate, Selection

    out = []
    for compiler, value, (low, high), rerun, stability in figures:
        metrics = {
            S.M_THROUGHPUT: value, S.M_THROUGHPUT_CI_LOW: low, S.M_THROUGHPUT_CI_HIGH: high,
            S.M_LATENCY_P50: 1000 / value,
        }  # fmt: skip
        if rerun:
            metrics[S.M_THROUGHPUT_RERUN_LOW], metrics[S.M_THROUGHPUT_RERUN_HIGH] = rerun
        where = ("r-" + compiler, "1", "cpu", "resnet18", compiler, "", 1)
        out.append(Candidate(*where, metrics, status="OK", stability=stability))
    return Selection(metric, out, [])


def test_the_pick_says_whether_its_lead_is_one_a_re_run_keeps():
    from mlflow_ngraph.deploy.select import describe, lead

    # this run's intervals separate, the re-run intervals (the host's spread) overlap
    both = [
        ("onnxruntime", 110.0, (108.0, 112.0), (99.0, 122.0), "STABLE"),
        ("openvino", 100.0, (98.0, 102.0), (90.0, 111.0), "STABLE"),
    ]
    said = lead(_ranked(*both))
    assert said.startswith("#1 leads #2 (resnet18 openvino bs1) by 1.10x in throughput")
    assert said.endswith(": within noise: a re-run may rank #2 first")
    # without a measured spread, this run's intervals judge it, and the words say so
    alone = [(c, v, ci, None, s) for c, v, ci, _, s in both]
    assert lead(_ranked(*alone)).endswith(": beyond this run's noise")
    listing = describe(_ranked(*alone))
    assert "re-run CI: none yet: this host's spread needs measuring" in listing
    assert "re-run CI: none yet" not in describe(_ranked(*both))
    # re-run intervals that separate: a lead a re-run keeps
    apart = [(*both[0][:3], (105.0, 116.0), "STABLE"), (*both[1][:3], (90.0, 104.0), "STABLE")]
    assert lead(_ranked(*apart)).endswith(": beyond noise")
    # an UNSTABLE side (--allow-unstable) is not judged; nor is a latency ranking
    noisy = [both[0], (*both[1][:4], "UNSTABLE")]
    assert lead(_ranked(*noisy)).endswith(": not judged: next UNSTABLE")
    by_latency = lead(_ranked(*both, metric=S.M_LATENCY_P50))
    assert "by 1.10x in latency_p50_ms: not judged" in by_latency
    assert lead(_ranked(both[0])) is None
