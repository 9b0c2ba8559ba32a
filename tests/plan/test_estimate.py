"""The time estimate: one model of a batch size's cost (prepare, warm-up, the rounds'
floors and cap, the attempts) said before a run and kept up to date while it runs, learned
from what earlier runs measured on this host."""

from __future__ import annotations

from pytest import approx

from mlflow_ngraph.measure.rounds import MAX_S
from mlflow_ngraph.measure.settings import MeasureSettings
from mlflow_ngraph.plan.estimate import (
    FACTOR_KEY,
    LOAD_S,
    OVERHEAD_S,
    Estimate,
    Item,
    Timings,
    describe,
    timing_key,
)
from tests._support import TINY

#: the issue's OpenVINO cell: 100 repetitions (the paper's protocol), batch 1 and 8
PAPER = MeasureSettings(warmup=10, repetitions=100, min_duration_s=1.0)


def _record(request_s: float, requests: int, compile_s: float = 3.0, attempts: int = 1) -> dict:
    return {
        "metrics": {"duration_s": request_s * requests, "repetitions": requests,
                    "compile_s": compile_s, "cache_hit": 0.0, "first_inference_ms": 10.0},
        "stability": {"attempts": attempts},
    }  # fmt: skip


def test_a_batch_size_never_seen_is_priced_at_the_rounds_cap(tmp_path):
    quick = MeasureSettings(warmup=0, repetitions=10, min_duration_s=0.5)
    est = Estimate.of([("m", "identity", {}, 1), ("m", "inductor", {}, 1)], quick,
                      Timings(tmp_path), retries=0)  # fmt: skip
    identity, inductor = est.costs
    assert identity >= MAX_S  # the cap: a figure never seen is not assumed to be precise early
    assert inductor - identity >= 40  # inductor's compile allowance
    assert est.known == 0
    assert "0 of them timed on this host before" in describe(est.total_s, est.known, 2)


def test_sittings_are_priced_each_to_its_share_of_the_cap_with_the_engine_loaded(tmp_path):
    """--sittings N: N sittings, each to 1/N of the default cap (the worker's), the engine
    built once and loaded in each later sitting's fresh workers."""
    quick = MeasureSettings(warmup=0, repetitions=10, min_duration_s=0.5)
    items = [("m", "inductor", {}, 1)]
    one = Estimate.of(items, quick, Timings(tmp_path), retries=0).costs[0]
    two = Estimate.of(items, quick, Timings(tmp_path), retries=0, sittings=2).costs[0]
    three = Estimate.of(items, quick, Timings(tmp_path), retries=0, sittings=3).costs[0]
    assert one < two < three  # a worker start and an engine load more per sitting
    # not twice the rounds: each sitting has its share of the cap; a start and a load more
    assert two - one == approx(OVERHEAD_S + LOAD_S)
    capped = MeasureSettings(warmup=0, repetitions=10, min_duration_s=0.5, max_duration_s=5.0)
    each = Estimate.of(items, capped, Timings(tmp_path), retries=0, sittings=2).costs[0]
    assert each - Estimate.of(items, capped, Timings(tmp_path), retries=0).costs[0] >= 5.0


def test_slow_requests_are_priced_by_the_repetitions_floor_not_the_cap(tmp_path):
    timings = Timings(tmp_path)
    # a batch of 8 took 0.6 s per request on this host: 100 requests need 60 s at least
    timings.record(
        timing_key("conv", "openvino", {}, 8),
        {"request_s": 0.6, "measured_s": 60.0, "attempts": 1, "compile_s": 4.0},
    )
    est = Estimate.of([("conv", "openvino", {}, 8)], PAPER, Timings(tmp_path), retries=1)
    assert est.known == 1
    assert 60 + 10 * 0.6 <= est.total_s < 80  # floor + warm-up, the engine from the cache


def test_a_batch_size_borrows_the_request_time_of_its_cell_at_another(tmp_path):
    items = [("conv", "identity", {}, 1), ("conv", "identity", {}, 8)]
    est = Estimate.of(items, PAPER, Timings(tmp_path), retries=0)
    before = est.costs[1]
    est.done(Item("conv", "identity", {}, 1), _record(0.1, 100), now=est.last + 20)
    # bs8: 8 x 0.1 s per request (scaled by the batch) x 100 requests
    assert len(est.costs) == 1 and est.costs[0] >= 80 > before
    assert est.left_s(now=est.last) == approx(est.factor * est.costs[0])


def test_what_is_left_counts_down_and_is_scaled_by_the_host_factor(tmp_path):
    quick = MeasureSettings(warmup=0, repetitions=10, min_duration_s=0.5)
    items = [("m", c, {}, b) for b in (1, 2) for c in ("identity", "onnxruntime")]
    est = Estimate.of(items, quick, Timings(tmp_path), retries=0)
    start = est.last
    assert est.left_s(now=start) == approx(est.total_s)  # the live figure starts at the said one
    assert est.left_s(now=start + 5) == approx(est.total_s - 5)
    # the current group (bs1's two engines) overrunning never takes it below bs2's share
    assert est.left_s(now=start + 10_000) == approx(est.factor * sum(est.costs[2:]))
    slow = 3 * est.costs[0]
    est.done(Item("m", "identity", {}, 1), _record(0.01, 50), now=start + slow)
    assert est.factor > 1  # the host is slower than the model says: what is left grows
    for item in items[1:]:
        est.done(Item(*item), _record(0.01, 50), now=est.last + 1)
    assert est.left_s() == 0
    factor = Timings(tmp_path).data[FACTOR_KEY]
    again = Estimate.of(items, quick, Timings(tmp_path), retries=0)
    assert again.factor == factor  # the next run starts from this host's factor


def test_run_prints_an_estimate_and_records_what_each_batch_size_cost(run_cli, tracking_uri, home):
    code, out, err = run_cli(
        "benchmark", *TINY, "--compiler", "identity", "--tracking-uri", tracking_uri
    )
    assert code == 0, err
    assert "estimated time: about" in err
    recorded = Timings(home).items()
    assert len(recorded) == 2
    assert all(r["request_s"] > 0 and r["measured_s"] > 0 and r["attempts"] >= 1 for r in recorded)
    assert Timings(home).factor is not None
