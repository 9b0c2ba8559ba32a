"""What the host did over a window, and the throughput's interval: a competing load started
by the test is seen as other processes' CPU time and makes a cell UNSTABLE; intervals on
hand-made repetition times have the width the statistics say."""

from __future__ import annotations

import time

import psutil
import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.measure.sampler import ResourceSampler, _proc_stat
from mlflow_ngraph.tracking import schema as S
from tests._hog import cpu_hog
from tests._support import TINY


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.serial
def test_other_processes_cpu_is_seen(tmp_path):
    sampler = ResourceSampler()
    with cpu_hog(tmp_path, processes=2):
        sampler.start()
        time.sleep(1.0)
        noise = sampler.stop().host
    # two busy loops on this machine's cores: well over a quarter of all CPU time
    assert noise.other_cpu_percent is not None and noise.other_cpu_percent > 40
    assert noise.load_avg is not None and noise.steal_percent is not None


@pytest.mark.serial
def test_own_work_is_not_counted_as_other():
    # whatever else the host runs, other = machine busy - own: the spin's CPU is not in it
    cores = psutil.cpu_count(logical=True) or 1
    sampler = ResourceSampler()
    busy0, cpu0, wall0 = _proc_stat()[0], time.process_time(), time.perf_counter()
    sampler.start()
    _spin(1.0)  # one core busy with this process (less of one on a busy host)
    noise = sampler.stop().host
    busy1, cpu1, wall1 = _proc_stat()[0], time.process_time(), time.perf_counter()
    capacity = (wall1 - wall0) * cores
    busy_percent = 100 * (busy1 - busy0) / capacity
    own_percent = 100 * (cpu1 - cpu0) / capacity
    assert own_percent > 10, own_percent  # the spin did run
    assert noise.other_cpu_percent is not None
    # counted, other would equal the machine's busy share; excluded, it is short of it by own
    assert noise.other_cpu_percent <= busy_percent - 0.7 * own_percent, (
        noise.other_cpu_percent, busy_percent, own_percent,
    )  # fmt: skip


@pytest.mark.serial
def test_windows_are_summed_and_the_time_between_them_left_out(tmp_path):
    """Engines measured in rounds: a hog running between this engine's windows (another
    engine's turn) is not counted, and short windows together reach a judgement."""
    sampler = ResourceSampler()
    for _ in range(6):
        sampler.begin()
        _spin(0.1)
        sampler.end()
        with cpu_hog(tmp_path, processes=2):
            time.sleep(0.3)  # the other engines' turn
    usage = sampler.result()
    assert 0.6 <= usage.wall_s < 1.0  # six windows of 0.1 s, not the 2.4 s between them
    assert usage.host.other_cpu_percent is not None
    assert usage.cpu_percent > 20  # the spin, over the windows' time only


def test_a_short_window_does_not_judge_the_host():
    sampler = ResourceSampler()
    sampler.start()
    noise = sampler.stop().host  # well under HOST_MIN_WINDOW_S: ticks of 10 ms say nothing
    assert noise.other_cpu_percent is None and noise.steal_percent is None


def _cell(uri: str, experiment: str):
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return next(
        r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get(S.T_ROLE) == "cell"
    )


@pytest.mark.serial
def test_a_competing_load_makes_the_cell_unstable(run_cli, tracking_uri, tmp_path):
    args = list(TINY)
    args[args.index("--min-duration") + 1] = "0.8"  # long enough to read the host
    with cpu_hog(tmp_path, processes=2):
        code, out, err = run_cli(
            "benchmark", *args, "--compiler", "identity", "--experiment", "hog",
            "--tracking-uri", tracking_uri, "--max-interval", "0.99", "--stable-retries", "0",
        )  # fmt: skip
    assert code == 0, err
    run = _cell(tracking_uri, "hog")
    tags, metrics = run.data.tags, run.data.metrics
    assert tags[S.T_STABILITY] == S.STABILITY_UNSTABLE
    assert "other processes used" in tags[f"{S.T_STABILITY_REASON}.bs1"]
    assert metrics[S.M_HOST_OTHER_CPU] > 25
    assert "UNSTABLE (" in err and "other processes" in err  # the cell's line, short
    # the interval of every batch size was logged, flat too, around the throughput
    for b in (1, 2):
        assert (
            metrics[S.flat_key(S.M_THROUGHPUT_CI_LOW, b)]
            <= metrics[S.flat_key(S.M_THROUGHPUT, b)]
            <= metrics[S.flat_key(S.M_THROUGHPUT_CI_HIGH, b)]
        )
