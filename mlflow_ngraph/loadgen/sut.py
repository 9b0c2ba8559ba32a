"""The system under test LoadGen drives: a runner (the engine in this process, or a served
model over HTTP) behind LoadGen's SUT and QSL callbacks.

A runner runs one batch of sample indices in one of its request slots; slots run at once
from their own threads. SingleStream and MultiStream run each query inside LoadGen's
``issue_query`` (the next query comes only after this one completes); Offline and Server
queue the query's samples in batches of at most ``runner.batch`` and ``runner.slots``
dispatcher threads take them, so a Poisson arrival never waits on LoadGen's issuing thread.
"""

from __future__ import annotations

import logging
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from mlflow_ngraph.loadgen.settings import (
    MULTISTREAM_SAMPLES,
    QSL_SAMPLES,
    SCENARIOS,
    SERVER_PERCENTILE,
    STREAM_PERCENTILES,
    LoadgenSettings,
    early_stopping_floor,
)
from mlflow_ngraph.loadgen.summary import ScenarioResult, parse_logs

log = logging.getLogger(__name__)

#: seconds of the runner's own pace measured before LoadGen starts: LoadGen sizes its
#: pre-generated queries from the expected latency or rate, and an expectation far off
#: ends a run before its minimum duration (INVALID)
CALIBRATE_S = 1.0
#: Offline's expected rate over the calibrated one (a run up to this much over its minimum
#: duration rather than one that ends short of it)
OFFLINE_MARGIN = 1.5


class Runner(Protocol):
    batch: int  # samples one run takes (a shorter batch is padded)
    slots: int  # runs that may be in flight at once

    def run(self, slot: int, indices: list[int]) -> None: ...


def lg():
    """LoadGen's Python bindings, or a one-line error naming the extra."""
    try:
        import mlperf_loadgen
    except ImportError as exc:
        from mlflow_ngraph.errors import NgraphError

        raise NgraphError(
            "MLPerf LoadGen is not installed: pip install -e '.[loadgen]' "
            f"(mlcommons-loadgen; {exc})"
        ) from None
    return mlperf_loadgen


class Dispatcher:
    """LoadGen's SUT callbacks over a runner. ``inline``: each query runs in
    ``issue_query`` (one query in flight: SingleStream, MultiStream)."""

    def __init__(self, runner: Runner, inline: bool) -> None:
        self.runner = runner
        self.inline = inline
        self.work: queue.Queue = queue.Queue()
        self.error: str | None = None  # the first failure of a run (the result is INVALID)
        self.threads = [
            threading.Thread(target=self._drain, args=(slot,), daemon=True)
            for slot in range(0 if inline else runner.slots)
        ]
        for thread in self.threads:
            thread.start()

    def issue(self, samples: list[Any]) -> None:
        size = self.runner.batch
        batches = [samples[i : i + size] for i in range(0, len(samples), size)]
        if self.inline:
            for batch in batches:
                self._run(0, batch)
            return
        for batch in batches:
            self.work.put(batch)

    def flush(self) -> None:
        """LoadGen's flush: nothing is held back (no batching window)."""

    def _drain(self, slot: int) -> None:
        while True:
            batch = self.work.get()
            if batch is None:
                return
            self._run(slot, batch)

    def _run(self, slot: int, batch: list[Any]) -> None:
        try:
            self.runner.run(slot, [s.index for s in batch])
        except Exception as exc:  # noqa: BLE001 - said as the run's reason; LoadGen must not hang
            self.error = self.error or f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        mod = lg()
        mod.QuerySamplesComplete([mod.QuerySampleResponse(s.id, 0, 0) for s in batch])

    def close(self) -> None:
        for _ in self.threads:
            self.work.put(None)
        for thread in self.threads:
            thread.join(timeout=30)


def calibrate(runner: Runner, seconds: float = CALIBRATE_S) -> tuple[float, float]:
    """(median seconds of one batch alone, samples/s with every slot busy): what LoadGen's
    expected latency and rate are set from. Also the warm-up."""
    indices = list(range(runner.batch))
    times, end = [], time.perf_counter() + seconds / 2
    while time.perf_counter() < end or len(times) < 3:
        t0 = time.perf_counter()
        runner.run(0, indices)
        times.append(time.perf_counter() - t0)
    counts = [0] * runner.slots
    stop = time.perf_counter() + seconds / 2

    def busy(slot: int) -> None:
        while time.perf_counter() < stop:
            runner.run(slot, indices)
            counts[slot] += 1

    t0 = time.perf_counter()
    threads = [threading.Thread(target=busy, args=(s,)) for s in range(runner.slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = sum(counts) * runner.batch / (time.perf_counter() - t0)
    return statistics.median(times), rate


def test_settings(
    scenario: str, settings: LoadgenSettings, pace: tuple[float, float], qps: float | None
):
    """LoadGen's TestSettings of one run (performance mode, the run's minimums)."""
    mod = lg()
    latency_s, rate = pace
    s = mod.TestSettings()
    s.scenario = getattr(mod.TestScenario, SCENARIOS[scenario][0])
    s.mode = mod.TestMode.PerformanceOnly
    s.min_duration_ms = int(settings.min_duration_s * 1000)
    s.min_query_count = settings.min_queries
    # fewer could never pass early stopping, however fast the runner: where the duration
    # ends first (a slow engine, a busy host) the run goes on to this count, not INVALID
    if scenario == "server":
        s.min_query_count = max(settings.min_queries, early_stopping_floor())
    elif scenario in STREAM_PERCENTILES:
        floor = early_stopping_floor(STREAM_PERCENTILES[scenario], over=1)
        s.min_query_count = max(settings.min_queries, floor)
    # expectations on the fast side: LoadGen pre-generates more queries than it needs and
    # stops once both minimums are met; on the slow side it would run out early
    s.single_stream_expected_latency_ns = max(1000, int(latency_s * 0.5e9))
    batches = -(-MULTISTREAM_SAMPLES // settings.max_batch)
    s.multi_stream_expected_latency_ns = max(1000, int(latency_s * batches * 0.5e9))
    s.multi_stream_samples_per_query = MULTISTREAM_SAMPLES
    s.single_stream_target_latency_percentile = STREAM_PERCENTILES["singlestream"]
    s.multi_stream_target_latency_percentile = STREAM_PERCENTILES["multistream"]
    # Offline issues expected rate x duration samples in one query: too few ends the run
    # before its minimum duration (INVALID), so the larger of the two paces, and a margin
    s.offline_expected_qps = max(1.0, rate, settings.max_batch / latency_s) * OFFLINE_MARGIN
    s.server_target_qps = float(qps or rate)
    s.server_target_latency_ns = int(settings.latency_bound_ms * 1e6)
    s.server_target_latency_percentile = SERVER_PERCENTILE
    return s


def run_scenario(
    runner: Runner,
    scenario: str,
    settings: LoadgenSettings,
    outdir: Path,
    pace: tuple[float, float],
    qps: float | None = None,
) -> ScenarioResult:
    """One LoadGen run of ``scenario`` on ``runner``; its logs in ``outdir``. A run that
    ended before its minimum duration because the runner beat the pace its queries were
    generated for (measured a moment before, on a host that may have been busier then)
    runs once more, sized from what LoadGen measured: LoadGen's advice, to raise Offline's
    expected rate or lower a stream's expected latency (:func:`_measured_pace`)."""
    result = _run_once(runner, scenario, settings, outdir, pace, qps)
    short = result.details.get("result_min_duration_met") is False
    measured = _measured_pace(scenario, result.details, settings, pace)
    if not result.valid and short and measured is not None:
        log.info("%s ended before its minimum duration, its queries generated for %.3f ms a "
                 "batch and %.1f samples/s where it ran at %.3f ms and %.1f: once more, sized "
                 "from what it measured", scenario, 1000 * pace[0], pace[1],
                 1000 * measured[0], measured[1])  # fmt: skip
        result = _run_once(runner, scenario, settings, outdir, measured, qps)
    return result


def _measured_pace(
    scenario: str, details: dict, settings: LoadgenSettings, pace: tuple[float, float]
) -> tuple[float, float] | None:
    """The pace (seconds a batch, samples per second) LoadGen measured in a run of
    ``scenario`` that was generated for ``pace``, where the runner beat it (None: it did
    not, or there is no such figure: the Server's pace is its target, searched for)."""
    latency_s, rate = pace
    if scenario == "offline":
        got = float(details.get("result_samples_per_second") or 0)
        return (latency_s, got) if got > rate else None
    if scenario == "singlestream":
        got = float(details.get("result_mean_latency_ns") or 0) / 1e9
    elif scenario == "multistream":  # a query is the batches of its 8 samples, in turn
        batches = -(-MULTISTREAM_SAMPLES // settings.max_batch)
        got = float(details.get("result_mean_query_latency_ns") or 0) / 1e9 / batches
    else:
        return None
    return (got, rate) if 0 < got < latency_s else None


def _run_once(runner: Runner, scenario: str, settings: LoadgenSettings, outdir: Path,
              pace: tuple[float, float], qps: float | None) -> ScenarioResult:  # fmt: skip
    mod = lg()
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    output = mod.LogOutputSettings()
    output.outdir = str(outdir)
    output.copy_summary_to_stdout = False
    log_settings = mod.LogSettings()
    log_settings.log_output = output
    log_settings.enable_trace = False
    dispatcher = Dispatcher(runner, inline=SCENARIOS[scenario][1] == "latency")
    sut = mod.ConstructSUT(dispatcher.issue, dispatcher.flush)
    qsl = mod.ConstructQSL(QSL_SAMPLES, QSL_SAMPLES, _nothing, _nothing)
    try:
        s = test_settings(scenario, settings, pace, qps)
        mod.StartTestWithLogSettings(sut, qsl, s, log_settings)
    finally:
        dispatcher.close()
        mod.DestroyQSL(qsl)
        mod.DestroySUT(sut)
    result = parse_logs(scenario, outdir)
    if dispatcher.error:
        result.valid = False
        result.reason = f"the system under test failed: {dispatcher.error}"
    return result


def _nothing(indices: list[int]) -> None:
    """The QSL's load and unload: the samples are staged once, before LoadGen starts."""
