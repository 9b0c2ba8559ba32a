"""MLflow naming conventions, in one place: every writer and reader of runs uses these.

Child runs (one per device x model x compiler x flags) carry the params ``device``, ``model``,
``compiler``, ``family``, ``parameter_count``, ``model.<init param>``, ``flag.<compiler
flag>`` and the measurement settings. Per-batch metrics are logged stepped (``throughput``
at ``step = batch size``), and those in ``FLAT_METRICS`` also flat (``throughput.bs8``),
because MLflow's search and runs table only see the value at the highest step.
"""

from __future__ import annotations

# --- params -----------------------------------------------------------------------------
P_DEVICE = "device"
P_MODEL = "model"
P_COMPILER = "compiler"
P_FAMILY = "family"
P_PARAMETER_COUNT = "parameter_count"
P_MODEL_PARAM_PREFIX = "model."
P_FLAG_PREFIX = "flag."
P_SCENARIO = "scenario"

# --- tags -------------------------------------------------------------------------------
T_ROLE = "ngraph.role"  # "benchmark" (parent), "cell" (child), "report", "project" (ngraph-ray)
T_CELL_KEY = "ngraph.cell_key"
#: on a run made by find_or_create_run: when its creator saw the create come back (seconds
#: since the epoch, after the run had landed): clients racing to make one run keep the
#: earliest landed, so a create that was slow to land never displaces a settled run
T_LANDED = "ngraph.landed"
T_SPEC_HASH = "ngraph.spec_hash"
T_STATUS = "ngraph.status"  # OK, INVALID (output check failed), FAILED
T_ERROR = "ngraph.error"
#: why the host kept a cell's run from finishing (full disk, read-only home, no memory)
T_HOST_ERROR = "ngraph.host_error"
T_DEVICE = "ngraph.device"
T_DEVICE_KIND = "ngraph.device_kind"
T_HOST = "ngraph.host"
T_PARENT = "mlflow.parentRunId"
T_LAST_PARENT = "ngraph.last_parent"  # on a cell: the benchmark run that last logged to it
T_INDEX_TIME = "ngraph.index.time"  # on a parent: when its results index was written (ms)
T_INDEX_RUNS = "ngraph.index.runs"  # on a parent: how many cell runs the index holds

T_STABILITY = "ngraph.stability"  # STABLE / UNSTABLE (any batch size unstable), and .bs<b>
T_STABILITY_REASON = "ngraph.stability.reason"  # .bs<b>: why a batch size is UNSTABLE
T_STOP_REASON = "ngraph.stop_reason"  # .bs<b>: precision, max_duration
#: .bs<b>: how the figure moved against the same engine measured earlier on this host,
#: where it moved beyond what the intervals allow (measure/history.py)
T_MOVED = "ngraph.moved"
#: .bs<b>: the spread between sittings behind the re-run intervals, or why there are none
T_RERUN = "ngraph.rerun"
#: .bs<b>: each sitting's figures, where the figure was measured in several (--sittings)
T_SITTINGS = "ngraph.sittings"
T_ATTEMPTS = "ngraph.attempts"  # .bs<b>: measurements made of a batch size (--stable-retries)
T_REFERENCE = "ngraph.reference"  # what the outputs were checked against
T_SWEEP = "ngraph.sweep"  # the sweep id of every run a sweep started
T_TUNE = "ngraph.tune"  # on a cell: the tune run whose trial it is (its role stays "cell")
T_TUNE_KEY = "ngraph.tune_key"  # on a tune run: what it searches (its resume key)
#: on a loadgen cell run (role "loadgen"): what it measures (its resume key); per scenario
#: ``ngraph.loadgen.<scenario>.validity`` (VALID / INVALID, LoadGen's verdict) and ``.reason``
T_LOADGEN_KEY = "ngraph.loadgen_key"
T_LOADGEN = "ngraph.loadgen"

STABILITY_STABLE = "STABLE"
STABILITY_UNSTABLE = "UNSTABLE"

STATUS_OK = "OK"
STATUS_INVALID = "INVALID"
STATUS_FAILED = "FAILED"
#: a batch size the host could not measure (full disk, read-only home, no memory): never
#: written to the store, measured again by a plain re-run
STATUS_HOST_FAILED = "HOST_FAILED"


def is_usable(status: str | None) -> bool:
    """Whether a measurement with this status enters a relative metric (speedup, RTR, ASE,
    BSR, CPU reduction), on either side of the ratio: only an OK one. An INVALID engine's
    outputs were wrong, so its throughput is no baseline (identity throughput for speedup,
    T_c(1) for RTR / ASE, ASE_identity for BSR) and no result; a FAILED one has none. The
    one rule for the values logged to MLflow (``tracking/journal.py``) and those ``compare``
    recomputes (``report/tables.py``)."""
    return status == STATUS_OK


# --- per-batch metrics (stepped by batch size, and flat as "<name>.bs<batch>") -----------
M_THROUGHPUT = "throughput"  # samples/s: samples measured / seconds measured
M_THROUGHPUT_STD = "throughput_std"
M_LATENCY_MEAN = "latency_mean_ms"
M_LATENCY_STD = "latency_std_ms"
M_LATENCY_P50 = "latency_p50_ms"
M_LATENCY_P90 = "latency_p90_ms"
M_LATENCY_P99 = "latency_p99_ms"
M_CV = "cv"  # coefficient of variation of the windows' rates
M_REPETITIONS = "repetitions"  # requests measured (one inference of one batch each)
M_WINDOWS = "windows"  # windows measured (one per round when interleaved)
M_WINDOW_S = "window_s"  # the windows' target length
# windows left out of the figures: the process lost CPU during them (measure/rounds.py)
M_WINDOWS_DISTURBED = "windows_disturbed"
# where a re-run on this host is expected to land, 95% (measure/history.py): the sitting's
# interval (``*_ci_low`` / ``*_ci_high``) widened by the spread between sittings this host
# showed (its sd of the log and degrees of freedom); not logged where none was measured
M_THROUGHPUT_RERUN_LOW = "throughput_rerun_low"
M_THROUGHPUT_RERUN_HIGH = "throughput_rerun_high"
M_SPEEDUP_RERUN_LOW = "speedup_rerun_low"
M_SPEEDUP_RERUN_HIGH = "speedup_rerun_high"
M_RERUN_SD = "rerun_sd"  # the spread between sittings the speedup's re-run interval used
M_RERUN_DF = "rerun_df"  # its degrees of freedom
#: what a result's re-run interval is (``--sittings`` settles it at the run's end)
RERUN_METRICS = (
    M_THROUGHPUT_RERUN_LOW, M_THROUGHPUT_RERUN_HIGH, M_SPEEDUP_RERUN_LOW, M_SPEEDUP_RERUN_HIGH,
    M_RERUN_SD, M_RERUN_DF,
)  # fmt: skip
# the sittings the figure combines (``--sittings``: measure/sittings.py); absent: one
M_SITTINGS = "sittings"
# what each interval rests on (measure/rounds.py): rounds, the lag-1 autocorrelation of
# their values (an interval is widened where it is positive beyond chance), and whether
# the drift between the rounds' halves could be judged (1) or there were too few rounds (0)
M_ROUNDS = "rounds"
M_SPEEDUP_ROUNDS = "speedup_rounds"  # the paired rounds the speedup's interval rests on
M_THROUGHPUT_AUTOCORR = "throughput_autocorr"
M_SPEEDUP_AUTOCORR = "speedup_autocorr"
M_DRIFT_CHECKED = "drift_checked"
# the figures with the disturbed windows kept in, where the screen left some out
M_THROUGHPUT_UNSCREENED = "throughput_unscreened"
M_SPEEDUP_UNSCREENED = "speedup_unscreened"
# the host's state around the rounds (measure/hostprobe.py): the probe's median reading (the
# two threads' meeting in adds/s, or with MLFLOW_NGRAPH_HOST_PROBE=memory the memory's speed in
# GB/s), the rounds read, those that met its slow state (under 75% of the host's fast state),
# and the figure's change in those rounds against the rest, where their intervals part
M_HOST_JOIN_RATE = "host_join_rate"
M_MEMORY_SPEED = "memory_speed_gbs"
M_HOST_STATE_ROUNDS = "host_state_rounds"
M_HOST_SLOW_ROUNDS = "host_slow_rounds"
M_HOST_STATE_MOVED = "host_state_moved"
# order-statistic 95% intervals of the latency percentiles (p99 only from 299 requests)
M_LATENCY_P50_LOW = "latency_p50_low_ms"
M_LATENCY_P50_HIGH = "latency_p50_high_ms"
M_LATENCY_P90_LOW = "latency_p90_low_ms"
M_LATENCY_P90_HIGH = "latency_p90_high_ms"
M_LATENCY_P99_LOW = "latency_p99_low_ms"
M_LATENCY_P99_HIGH = "latency_p99_high_ms"
M_THROUGHPUT_HALFWIDTH = "throughput_halfwidth"  # relative half-width of its 95% interval
M_LATENCY_SAMPLES = "latency_samples"  # per-request latencies behind the percentiles
M_INTERLEAVED = "interleaved"  # 1: measured in rounds with the model's other engines
M_HOST_DRIFT = "host_drift"  # the baseline's spread across rounds (sd of log rate)
# the speedup measured in rounds with identity (Hodges-Lehmann of the per-round ratios; the
# logged speedup where there is one) and its 95% interval
M_SPEEDUP_PAIRED = "speedup_paired"
M_SPEEDUP_CI_LOW = "speedup_ci_low"
M_SPEEDUP_CI_HIGH = "speedup_ci_high"
M_SPEEDUP_HALFWIDTH = "speedup_halfwidth"
M_DURATION = "duration_s"
M_CPU = "cpu_percent"  # process CPU time / wall time / logical cores * 100
M_RSS = "peak_rss_mb"
M_COMPILE = "compile_s"  # seconds spent getting the engine in this run (cache load on a hit)
M_CACHE_HIT = "cache_hit"
M_FIRST_INFERENCE = "first_inference_ms"
M_ENGINE_SIZE = "engine_size_mb"
M_MAX_ABS_ERROR = "max_abs_error"
M_MAX_REL_ERROR = "max_rel_error"
M_COSINE = "cosine_similarity"
M_VALID = "valid"  # 1 when the output check passed
M_OUTPUTS_CHECKED = "outputs_checked"  # outputs of the model compared with the reference
M_THROUGHPUT_CI_LOW = "throughput_ci_low"  # 95% interval of the throughput
M_THROUGHPUT_CI_HIGH = "throughput_ci_high"
# what the host did during the measured window (noise that is not the engine's)
M_HOST_OTHER_CPU = "host_other_cpu_percent"  # CPU time of other processes, % of all cores
M_HOST_STEAL = "host_steal_percent"  # hypervisor steal time, % of all cores
M_HOST_LOAD = "host_load_avg"  # 1-minute load average at the end of the window
M_CPU_FREQ = "cpu_freq_mhz"  # mean current CPU frequency over the window, where exposed
M_CPU_THROTTLE = "cpu_throttle_events"  # thermal throttle events during the window
M_VALIDITY_WARNINGS = "validity_warnings"  # tracer / precision-fallback warnings of a cell
M_PARALLEL_REQUESTS = "parallel_requests"  # requests the runtime ran at once
M_REQUESTS_PER_REP = "requests_per_repetition"
# samples measured / seconds measured: the throughput itself under the rounds protocol;
# under the paper protocol (measure/paper.py) throughput is the mean of b / t_i, this beside it
M_THROUGHPUT_OVERALL = "throughput_overall"
# how the engine was built (Engine.compile_metrics; TVM's tuning)
M_TUNING_S = "tuning_s"
M_TRIALS = "trials"
M_TUNED = "tuned"  # 1 when a tuning database covered the engine's tasks
# GPU figures over exactly the measured windows (measure/nvml.py GpuWindows): utilisation
# from NVML's timestamped samples inside the windows (this process's where NVML attributes
# them, else the device's), the samples it rests on, this process's peak GPU memory and the
# device's (every process on it)
M_GPU_UTIL = "gpu_util_percent"
M_GPU_UTIL_SAMPLES = "gpu_util_samples"
M_GPU_MEM = "gpu_mem_mb"
M_GPU_DEVICE_MEM = "gpu_device_mem_mb"
# energy over the window, where RAPL is readable (measure/energy.py; the method and, where
# it is not, why, are in the environment record): package + dram, and per domain as
# ``<metric>.<domain>`` (``power_w.package``, ``power_w.dram``; see ``domain_key``)
M_ENERGY_PER_SAMPLE = "energy_j_per_sample"  # joules / samples measured in the window
M_POWER = "power_w"  # joules / window seconds
#: ``gpu``: NVML's total-energy counter (power x time where the GPU lacks it), beside the CPU's
ENERGY_DOMAINS = ("package", "dram", "gpu")
# relative metrics (need T_c(1) and the identity baseline of the same device and model)
M_SPEEDUP = "speedup"
#: T_c / T_identity, the ratio of the two throughputs (the paper's speedup), logged beside
#: the speedup, which is the paired estimate where the engines were measured in rounds
M_SPEEDUP_RATIO = "speedup_ratio"
M_RTR = "rtr"
M_ASE = "ase"
M_BSR = "bsr"
#: samples after which the compile time is paid back against identity (inf: never)
M_PAYBACK = "payback_inferences"


#: the per-batch metrics also logged flat (``throughput.bs8``): what the runs table sorts on,
#: what a search filters on and what ``compare`` reads from the results index. Every other
#: per-batch metric (latency mean/std, repetitions, durations, host noise, engine size, ...)
#: is logged stepped only: MLflow draws it as one chart over batch size. Flat copies of all
#: of them made a cell run show ~135 charts, most of them single points.
FLAT_METRICS = frozenset(
    {
        M_THROUGHPUT,
        M_THROUGHPUT_STD,
        M_THROUGHPUT_CI_LOW,
        M_THROUGHPUT_CI_HIGH,
        M_LATENCY_P50,
        M_LATENCY_P99,
        M_LATENCY_SAMPLES,
        M_THROUGHPUT_RERUN_LOW,
        M_THROUGHPUT_RERUN_HIGH,
        M_SPEEDUP_RERUN_LOW,
        M_SPEEDUP_RERUN_HIGH,
        M_CV,
        M_REPETITIONS,  # what an interval of the mean needs (report/tables.py's fallback)
        M_WINDOWS,  # the values throughput_std is the spread of (the same fallback)
        M_CPU,
        M_ENERGY_PER_SAMPLE,
        M_COMPILE,
        M_CACHE_HIT,
        M_MAX_ABS_ERROR,
        M_MAX_REL_ERROR,
        M_VALID,
        M_SPEEDUP,
        M_SPEEDUP_RATIO,
        M_SPEEDUP_PAIRED,
        M_SPEEDUP_CI_LOW,
        M_SPEEDUP_CI_HIGH,
        M_RTR,
        M_ASE,
        M_BSR,
        M_PAYBACK,
    }
)


#: every per-batch metric named above
METRICS = frozenset(v for k, v in dict(globals()).items() if k.startswith("M_"))


#: the MLflow view's per-model copies (tracking/ui.py): ``<model>/throughput``, stepped by
#: batch size, its STABLE figures; ``<model>/throughput UNSTABLE`` the others: one chart
#: panel per model, the noise drawn apart and left out of the axis range
VIEW_METRICS = (M_THROUGHPUT, M_SPEEDUP)
VIEW_UNSTABLE = " UNSTABLE"


def view_metric(model_title: str, metric: str, stable: bool = True) -> str:
    """``mha_block d2 w64``, ``speedup`` -> ``mha_block d2 w64/speedup`` (``... UNSTABLE``)."""
    return f"{model_title}/{metric}" + ("" if stable else VIEW_UNSTABLE)


def is_schema_metric(key: str) -> bool:
    """Whether ``key`` is a metric this module names, flat (``throughput.bs8``), per
    output (``max_abs_error_out1``) and the view's per-model copies included."""
    _, slash, tail = key.rpartition("/")
    if slash:
        return tail.removesuffix(VIEW_UNSTABLE) in VIEW_METRICS
    flat = parse_flat_key(key)
    base = flat[0] if flat else key
    stem, sep, index = base.rpartition("_out")
    if sep and index.isdigit():
        base = stem
    stem, sep, domain = base.rpartition(".")
    if sep and domain in ENERGY_DOMAINS:
        base = stem
    return base in METRICS


def domain_key(metric: str, domain: str) -> str:
    """``power_w``, ``dram`` -> ``power_w.dram``: one energy domain's share of a metric."""
    return f"{metric}.{domain}"


def times_file(batch_size: int) -> str:
    """The artifact holding every timed request of the paper protocol at a batch size (CSV:
    ``request,time_ms``), in the cell's run."""
    return f"protocol/paper_times_bs{batch_size}.csv"


def flat_key(metric: str, batch_size: int) -> str:
    """``throughput``, 8 -> ``throughput.bs8``."""
    return f"{metric}.bs{batch_size}"


def runtime_key(setting: str, batch_size: int) -> str:
    """``threads``, 8 -> ``runtime.bs8.threads``: what the runtime chose at one batch size
    (a param; ``runtime.threads`` holds the first batch size's value)."""
    return f"runtime.bs{batch_size}.{setting}"


def output_key(metric: str, index: int) -> str:
    """``max_abs_error``, 1 -> ``max_abs_error_out1``: one output's check of a multi-output
    model (the unsuffixed metric is the worst over outputs)."""
    return f"{metric}_out{index}"


def parse_flat_key(key: str) -> tuple[str, int] | None:
    """``throughput.bs8`` -> (``throughput``, 8); ``None`` for other keys."""
    metric, dot, tail = key.rpartition(".bs")
    if not dot or not tail.isdigit():
        return None
    return metric, int(tail)
