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
    Host,
    Item,
    Timings,
    cost_of,
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


def test_sittings_of_slow_requests_are_priced_each_to_its_share_of_the_floors(tmp_path):
    """--sittings N with the repetitions floor binding (0.5 s a request, 100 of them): each
    sitting takes ceil(100 / N) requests (MeasureSettings.per_sitting), not all 100."""
    timings = Timings(tmp_path)
    timings.record(
        timing_key("conv", "openvino", {}, 8),
        {"request_s": 0.5, "measured_s": 50.0, "attempts": 1, "compile_s": 4.0},
    )
    items = [("conv", "openvino", {}, 8)]
    rounds = MeasureSettings(warmup=0, repetitions=100, min_duration_s=1.0)
    one = Estimate.of(items, rounds, Timings(tmp_path), retries=0).costs[0]
    two = Estimate.of(items, rounds, Timings(tmp_path), retries=0, sittings=2).costs[0]
    assert one >= 50  # the floor: 100 requests of 0.5 s
    # two sittings of 50 requests each: a worker start and an engine load more, not 50 s
    assert two - one == approx(OVERHEAD_S + min(4.0, LOAD_S))


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


#: the default experiment: 4 models x 5 CPU compilers x batch 1-8, 3 warm-up and 10
#: requests over at least 0.5 s, one retry of an UNSTABLE figure
DEFAULT = MeasureSettings(warmup=3, repetitions=10, min_duration_s=0.5)
DEFAULT_ITEMS = [
    (m, c, {}, b)
    for m in ("resnet18", "deit3_small_patch16_224", "conv_block", "mha_block")
    for c in ("identity", "torchscript", "inductor", "onnxruntime", "openvino")
    for b in (1, 2, 4, 8)
]


def test_the_default_experiment_is_priced_within_a_quarter_of_its_wall_on_a_quiet_and_a_busy_host(
    tmp_path,
):
    """Empty caches, nothing timed: a quiet 2-core host took 10m41s, a busy one (load 4-8,
    other processes taking every core) 33 min; without a look at the host it said 31 min for
    both."""
    quiet = Estimate.of(DEFAULT_ITEMS, DEFAULT, Timings(tmp_path), host=Host(0.02, False))
    busy = Estimate.of(DEFAULT_ITEMS, DEFAULT, Timings(tmp_path), host=Host(0.97, True))
    unsampled = Estimate.of(DEFAULT_ITEMS, DEFAULT, Timings(tmp_path))
    assert quiet.total_s == approx(641, rel=0.25)
    assert busy.total_s == approx(33 * 60, rel=0.25)
    assert unsampled.total_s == approx(31 * 60, rel=0.05)  # a run that did not look: as before
    said = describe(busy.total_s, 0, 80, busy.host)
    assert "about 36 min" in said and "other processes taking 97% of the CPU" in said
    assert "load" not in describe(quiet.total_s, 0, 80, quiet.host)


def test_the_estimate_scales_with_the_measured_load(tmp_path):
    items = [("m", "onnxruntime", {}, 1), ("m", "openvino", {}, 8)]

    def total(host):
        return Estimate.of(items, DEFAULT, Timings(tmp_path), host=host).total_s

    # other processes' share of the cores is taken from the run's own seconds
    assert total(Host(1.0, True)) == approx(total(Host(0.5, True)) * 2.0 / 1.5)
    assert total(Host(0.2, False)) == approx(total(Host(0.0, False)) * 1.2)
    # busy beyond the stability rule: the rounds run to the cap and more are measured again
    assert total(Host(0.3, True)) > total(Host(0.3, False)) * 1.5
    assert Host(7.0).slowdown == 2.0  # never more than every core


def test_a_known_item_is_rescaled_from_the_load_it_was_timed_under(tmp_path):
    timings = Timings(tmp_path)
    key = timing_key("conv", "openvino", {}, 8)
    record = _record(0.6, 100)
    record["metrics"]["host_other_cpu_percent"] = 50.0
    cost = cost_of(record)
    assert cost["others"] == 0.5
    timings.record(key, cost)
    item = [("conv", "openvino", {}, 8)]
    then = Estimate.of(item, PAPER, Timings(tmp_path), retries=0, host=Host(0.5, True))
    now = Estimate.of(item, PAPER, Timings(tmp_path), retries=0, host=Host(0.0, False))
    assert then.total_s == approx(now.total_s * 1.5)
