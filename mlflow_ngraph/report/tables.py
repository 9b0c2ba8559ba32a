"""The compare tables, as pure functions of the DataFrame that ``query`` builds.

Pipeline: :func:`prepare` (labels, latest run per cell, validity, relative metrics
recomputed from throughputs with :mod:`mlflow_ngraph.measure.metrics`), then :func:`select`
(what the user asked to see; baselines were already attached, so filtering never loses
them), then one function per table: :func:`cells_table`, :func:`family_table` (Table VI),
:func:`depth_table` (Tables VII/VIII), :func:`compile_table` (Table III), :func:`flips_table`
(ranking flips).

A relative metric that cannot be computed is NaN, and the ``missing`` column says why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from mlflow_ngraph.measure import metrics
from mlflow_ngraph.measure.verdict import (
    BEYOND_RUN,
    parted,
    speedup_interval,
    throughputs_interval,
)
from mlflow_ngraph.models.registry import family_of
from mlflow_ngraph.tracking import schema

IDENTITY = "identity"
UNSTABLE = schema.STABILITY_UNSTABLE
RELATIVE = ("speedup", "rtr", "ase", "bsr")
#: the ratio of the throughputs, shown beside a paired speedup where the two part
RATIO = "throughput_ratio"
BLOCK_FAMILIES = ("conv_block", "mha_block")
#: the block builders' defaults (models/registry.py), for runs that did not log the param
BLOCK_DEFAULTS = {"conv_block": {"width": 64, "depth": 1}, "mha_block": {"width": 128, "depth": 1}}
#: the paper's Table VI batch-size ranges
DEFAULT_RANGES = ((2, 4), (8, 16))
#: the paper's Tables VII/VIII report batch sizes 8 and 16
DEFAULT_DEPTH_BATCHES = (8, 16)
#: the paper's family order (Table IV), then any other family alphabetically
FAMILY_ORDER = ("resnet", "efficientnet", "deit", "swin", "convnext", *BLOCK_FAMILIES)

#: metric columns the tables read; absent ones are added as NaN so every table has them
METRIC_COLUMNS = (
    schema.M_THROUGHPUT,
    schema.M_THROUGHPUT_STD,
    schema.M_THROUGHPUT_CI_LOW,
    schema.M_THROUGHPUT_CI_HIGH,
    schema.M_LATENCY_P50,
    schema.M_LATENCY_P99,
    schema.M_CPU,
    schema.M_COMPILE,
    schema.M_CACHE_HIT,
    schema.M_MAX_ABS_ERROR,
    schema.M_VALID,
    schema.M_REPETITIONS,
    schema.M_WINDOWS,
    schema.M_SPEEDUP_PAIRED,
    schema.M_SPEEDUP_CI_LOW,
    schema.M_SPEEDUP_CI_HIGH,
    schema.M_THROUGHPUT_RERUN_LOW,
    schema.M_THROUGHPUT_RERUN_HIGH,
    schema.M_SPEEDUP_RERUN_LOW,
    schema.M_SPEEDUP_RERUN_HIGH,
    schema.M_LATENCY_SAMPLES,
)
#: z of a two-sided 95% normal interval: turns an interval back into a std for the noise draws
Z95 = 1.959963984540054
#: fewest repetitions behind an interval (the harness logs none below it either): with fewer,
#: a measurement has no interval anywhere, never a zero-width one
MIN_INTERVAL_REPETITIONS = 3
#: draws of the parametric bootstrap of Kendall's tau
TAU_DRAWS = 2000
NO_THROUGHPUT = "no throughput measured"
NOT_USABLE = "no relative metrics: not an OK measurement"
CPU_STD = f"{schema.M_CPU}_std"  # not in the schema yet: used when a runner logs it
#: every metric the tables read (the query keeps only these)
READ_METRICS = frozenset((*METRIC_COLUMNS, CPU_STD))


def _list(series: pd.Series) -> list:
    """A column as a Python list (iterating an Arrow-backed column value by value is slow)."""
    return series.tolist()


# --- preparation ------------------------------------------------------------------------
def prepare(raw: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Labels, latest run per cell, validity and relative metrics.

    Returns:
        The enriched frame, and how many superseded runs were left out.
    """
    frame = add_labels(raw)
    frame, superseded = latest_per_cell(frame)
    frame = add_validity(drop_undefined_spreads(frame))
    return add_relative_metrics(frame), superseded


def add_labels(raw: pd.DataFrame) -> pd.DataFrame:
    """``model_label``, ``compiler_label``, ``cell_key`` and ``baseline_key`` columns."""
    frame = raw.copy()
    for column in METRIC_COLUMNS:
        if column not in frame:
            frame[column] = np.nan
    frame["stability"] = frame["stability"].fillna("") if "stability" in frame else ""
    frame["moved"] = frame["moved"].fillna("") if "moved" in frame else ""
    reason = frame.get("stability_reason")
    frame["stability_reason"] = reason.fillna("") if reason is not None else ""
    frame["family"] = [
        fam if isinstance(fam, str) and fam else family_of(str(model))
        for fam, model in zip(_list(frame["family"]), _list(frame["model"]), strict=True)
    ]
    frame["model_label"] = [
        f"{m}:{p}" if p else str(m)
        for m, p in zip(_list(frame["model"]), _list(frame["model_params"]), strict=True)
    ]
    frame["baseline_key"] = (
        frame["device"].astype(str) + "|" + frame["model_label"] + "|" + frame["scenario"]
    )
    frame["cell_key"] = (
        frame["baseline_key"] + "|" + frame["compiler"].astype(str) + "|" + frame["flags"]
    )
    frame["compiler_label"] = compiler_labels(frame)
    return frame


def compiler_labels(frame: pd.DataFrame) -> pd.Series:
    """The compiler name, plus the flags that differ when it ran with several flag sets."""
    labels = frame["compiler"].astype(str)
    flag_columns = [c for c in frame.columns if c.startswith(schema.P_FLAG_PREFIX)]
    for compiler, rows in frame.groupby("compiler"):
        differing = [c for c in flag_columns if rows[c].nunique(dropna=False) > 1]
        if not differing:
            continue
        values = rows[differing].fillna("").astype(str)
        text = [
            ",".join(
                f"{c[len(schema.P_FLAG_PREFIX) :]}={v}" for c, v in zip(differing, row, strict=True)
            )
            for row in values.itertuples(index=False, name=None)
        ]
        labels.loc[rows.index] = [f"{compiler}[{t}]" for t in text]
    return labels


def latest_per_cell(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Keep only the newest run of each cell (a re-run supersedes; MLflow keeps the old)."""
    runs = frame.drop_duplicates("run_id")[["run_id", "cell_key", "start_time"]]
    latest = runs.sort_values("start_time", kind="stable").groupby("cell_key").tail(1)
    kept = frame[frame["run_id"].isin(set(latest["run_id"]))]
    return kept.reset_index(drop=True), len(runs) - len(latest)


def drop_undefined_spreads(frame: pd.DataFrame) -> pd.DataFrame:
    """``throughput_std`` missing where the run logged one repetition: the spread of a
    single value is undefined (the harness logs 0), never shown as ``± 0``."""
    out = frame.copy()
    single = out[schema.M_REPETITIONS] < 2
    out[schema.M_THROUGHPUT_STD] = out[schema.M_THROUGHPUT_STD].where(~single.fillna(False))
    return out


def add_validity(frame: pd.DataFrame) -> pd.DataFrame:
    """``status`` per row: the batch size's tag (else the run's), INVALID where that batch's
    output check failed, OK where no status was written but the check passed (a result whose
    tags a kill tore off, or a cell still running), UNKNOWN otherwise."""
    out = frame.copy()
    status = out["status"].fillna("").astype(str).replace("", "UNKNOWN")
    status = status.where(~((status == "UNKNOWN") & (out[schema.M_VALID] == 1)), schema.STATUS_OK)
    out["status"] = status.where(~(out[schema.M_VALID] == 0), schema.STATUS_INVALID)
    return out


def _series_by_run(frame: pd.DataFrame, column: str) -> dict[str, dict[int, float]]:
    ok = frame[frame[column].notna() & frame["batch_size"].notna()]
    out: dict[str, dict[int, float]] = {}
    for run_id, batch, value in zip(
        _list(ok["run_id"]), _list(ok["batch_size"]), _list(ok[column]), strict=True
    ):
        out.setdefault(run_id, {})[int(batch)] = float(value)
    return out


def _identity_runs(frame: pd.DataFrame) -> dict[str, str]:
    """baseline key -> run id of the identity run (the newest, if several flag sets ran)."""
    ident = frame[frame["compiler"] == IDENTITY].drop_duplicates("run_id")
    ident = ident.sort_values("start_time", kind="stable")
    return dict(zip(_list(ident["baseline_key"]), _list(ident["run_id"]), strict=True))


def add_relative_metrics(frame: pd.DataFrame) -> pd.DataFrame:
    """speedup, RTR, ASE, BSR, the identity's throughput and CPU, CPU reduction, ``missing``.

    Recomputed from the logged throughputs (logged relative metrics are ignored), of OK
    measurements only (:func:`is_result`, ``schema.is_usable``: the rule the logged values
    follow too): an INVALID or FAILED row is no baseline and gets no relative metric.
    """
    usable = frame[is_result(frame)]
    tput = _series_by_run(usable, schema.M_THROUGHPUT)
    cpu = _series_by_run(usable, schema.M_CPU)
    baseline = _identity_runs(frame)
    rel = {
        run: metrics.relative_metrics(series, tput.get(baseline.get(key, ""), None))
        for run, key, series in _run_series(frame, tput)
    }
    rows = [
        _row_values(run, b, key, tput, cpu, baseline, rel)
        for run, b, key in zip(
            _list(frame["run_id"]),
            _list(frame["batch_size"]),
            _list(frame["baseline_key"]),
            strict=True,
        )
    ]
    measured = frame[schema.M_THROUGHPUT].notna().tolist()
    for row, status, error, has_t in zip(
        rows, _list(frame["status"]), _list(frame["error"].fillna("")), measured, strict=True
    ):
        if row[-1] == NO_THROUGHPUT and has_t:
            row[-1] = f"{NOT_USABLE} ({status})"
        elif row[-1] == NO_THROUGHPUT and (status != "OK" or error):
            row[-1] = f"{NO_THROUGHPUT} ({status}{': ' + error if error else ''})"
    columns = [*RELATIVE, "identity_throughput", "identity_cpu_percent", "cpu_reduction_pct"]
    values = pd.DataFrame(rows, columns=[*columns, "missing"], index=frame.index)
    out = frame.drop(columns=[c for c in values.columns if c in frame], errors="ignore")
    out = pd.concat([out, values], axis=1)
    out[columns] = out[columns].astype(float)
    # a speedup measured in rounds with its baseline (the Hodges-Lehmann estimate of the
    # per-round ratios) stands in for the ratio of the two throughputs, as in the logged values;
    # the ratio is kept beside it (add_intervals shows it where the two part)
    paired = out[schema.M_SPEEDUP_PAIRED].astype(float)
    use = out["speedup"].notna() & paired.notna() & (out["compiler"] != IDENTITY)
    out[RATIO] = out["speedup"].where(use)
    out.loc[use, "speedup"] = paired[use]
    return add_intervals(out, baseline)


def _bounds(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each row's 95% throughput interval: the logged one; else the interval of the mean,
    throughput -+ t(0.975, n - 1) x std / sqrt(n), over the n values ``throughput_std`` is
    the spread of: the windows where the run logged them (a window's rate is the unit;
    dividing its spread by the requests' count made the interval too narrow by about the
    square root of the requests per window), else the repetitions of a record from before
    windows; else NaN. With fewer than 3 of them, or no spread, the interval is missing,
    never zero wide."""
    from scipy import stats

    tput = frame[schema.M_THROUGHPUT].to_numpy(dtype=float, na_value=np.nan)
    std = frame[schema.M_THROUGHPUT_STD].to_numpy(dtype=float, na_value=np.nan)
    low = frame[schema.M_THROUGHPUT_CI_LOW].to_numpy(dtype=float, na_value=np.nan)
    high = frame[schema.M_THROUGHPUT_CI_HIGH].to_numpy(dtype=float, na_value=np.nan)
    n = frame[schema.M_REPETITIONS].to_numpy(dtype=float, na_value=np.nan)
    windows = frame[schema.M_WINDOWS].to_numpy(dtype=float, na_value=np.nan)
    n = np.where(np.isnan(windows), n, windows)
    enough = n >= MIN_INTERVAL_REPETITIONS  # False where n is not known
    count = np.where(enough, n, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        half = stats.t.ppf(0.975, count - 1) * std / np.sqrt(count)
    half = np.where(std > 0, half, np.nan)
    missing = np.isnan(low) | np.isnan(high)
    low = np.where(missing, tput - half, low)
    high = np.where(missing, tput + half, high)
    too_few = n < MIN_INTERVAL_REPETITIONS  # a logged count below 3: no interval at all
    return np.where(too_few, np.nan, low), np.where(too_few, np.nan, high)


def _pair(low: float, high: float) -> tuple[float, float] | None:
    return None if math.isnan(low) or math.isnan(high) else (low, high)


def add_intervals(frame: pd.DataFrame, baseline: dict[str, str]) -> pd.DataFrame:
    """The identity's interval beside each row, a 95% interval of the speedup, and the ratio
    of the throughputs where it parts from the paired speedup.

    The speedup's interval follows the one rule the summary follows too
    (:func:`mlflow_ngraph.measure.verdict.speedup_interval`): the paired rounds' interval
    wherever it holds the speedup, else the two throughputs' intervals combined in log space
    around it. An identity row's speedup is 1 by definition: no interval. ``throughput_ratio``
    (with its interval) is kept only where it and the paired speedup part by more than their
    intervals (:func:`mlflow_ngraph.measure.verdict.parted`), NaN elsewhere.
    """
    out = frame.copy()
    low, high = _bounds(out)
    tput = out[schema.M_THROUGHPUT].to_numpy(dtype=float, na_value=np.nan)
    key_of = {}
    for i, (run, b) in enumerate(zip(_list(out["run_id"]), _list(out["batch_size"]), strict=True)):
        if not pd.isna(b):
            key_of[(run, int(b))] = i
    ident = np.full((4, len(out)), np.nan)  # identity's interval, then its re-run interval
    rerun = [
        out[name].to_numpy(dtype=float, na_value=np.nan)
        if name in out
        else np.full(len(out), np.nan)
        for name in (schema.M_THROUGHPUT_RERUN_LOW, schema.M_THROUGHPUT_RERUN_HIGH)
    ]
    stability = _list(out["stability"])
    ident_stability = [""] * len(out)
    shown = np.full((2, len(out)), np.nan)
    ratio = np.full((3, len(out)), np.nan)  # the ratio and its interval, where they part
    rows = zip(_list(out["baseline_key"]), _list(out["batch_size"]), _list(out["compiler"]))
    for i, (key, b, compiler) in enumerate(rows):
        j = key_of.get((baseline.get(key, ""), int(b))) if not pd.isna(b) else None
        if j is None:
            continue
        ident[:, i] = low[j], high[j], rerun[0][j], rerun[1][j]
        ident_stability[i] = stability[j]
        if compiler != IDENTITY:
            shown[:, i], ratio[:, i] = _speedup_figures(
                out.iloc[i], tput[i], _pair(low[i], high[i]), tput[j], _pair(low[j], high[j])
            )
    out["identity_ci_low"], out["identity_ci_high"] = ident[:2]
    out["identity_rerun_low"], out["identity_rerun_high"] = ident[2:]
    out["identity_stability"] = ident_stability
    out["speedup_ci_low"], out["speedup_ci_high"] = shown
    out[RATIO], out[f"{RATIO}_ci_low"], out[f"{RATIO}_ci_high"] = ratio
    return out


def _speedup_figures(row: pd.Series, own: float, own_ci, base: float, base_ci):
    """(the speedup's interval as shown, (the ratio of the throughputs, its interval) where
    the two part; NaN where not) of one compiled row, by the rules of
    :mod:`mlflow_ngraph.measure.verdict`."""
    nan2, nan3 = (math.nan, math.nan), (math.nan, math.nan, math.nan)
    speedup = float(row["speedup"])
    if math.isnan(speedup):
        return nan2, nan3
    paired_ci = _pair(float(row[schema.M_SPEEDUP_CI_LOW]), float(row[schema.M_SPEEDUP_CI_HIGH]))
    interval = speedup_interval(speedup, paired_ci, own, own_ci, base, base_ci)
    value = float(row[RATIO])
    ratio_ci = (
        None if math.isnan(value) else throughputs_interval(value, own, own_ci, base, base_ci)
    )
    parts = (value, *ratio_ci) if ratio_ci and parted(interval, ratio_ci) else nan3
    return (interval or nan2), parts


def _run_series(frame: pd.DataFrame, tput: dict) -> list[tuple[str, str, dict]]:
    runs = frame.drop_duplicates("run_id")
    return [
        (r, k, tput[r])
        for r, k in zip(_list(runs["run_id"]), _list(runs["baseline_key"]), strict=True)
        if r in tput
    ]


def _row_values(run, batch, key, tput, cpu, baseline, rel) -> list:
    if pd.isna(batch) or int(batch) not in tput.get(run, {}):
        return [None] * 7 + [NO_THROUGHPUT]
    b = int(batch)
    ident_run = baseline.get(key)
    ident_t = tput.get(ident_run, {}).get(b) if ident_run else None
    ident_cpu = cpu.get(ident_run, {}).get(b) if ident_run else None
    values = rel[run][b]
    reduction = _reduction_pct(cpu.get(run, {}).get(b), ident_cpu)
    return [*(values[m] for m in RELATIVE), ident_t, ident_cpu, reduction] + [
        _missing_reason(tput, run, b, key, ident_run)
    ]


def _reduction_pct(value: float | None, identity: float | None) -> float | None:
    """CPU reduction against the identity, in percent (positive = less CPU)."""
    ratio = metrics.speedup(value, identity)  # a guarded ratio: None on a missing input
    if ratio is None and value == 0 and identity:
        ratio = 0.0  # a compiled engine that used no measurable CPU: a 100 % reduction
    return None if ratio is None else 100.0 * (1.0 - ratio)


def _missing_reason(tput: dict, run: str, batch: int, key: str, ident_run: str | None) -> str:
    reasons = []
    own = tput.get(run, {})
    ident = tput.get(ident_run, {}) if ident_run else {}
    device, model, _ = key.split("|", 2)
    if ident_run is None:
        reasons.append(f"speedup, bsr: no identity run for {model} on {device}")
    elif batch not in ident:
        reasons.append(f"speedup, bsr: identity not measured OK at batch {batch}")
    if 1 not in own:
        reasons.append("rtr, ase, bsr: no OK batch-1 throughput")
    elif ident_run is not None and 1 not in ident:
        reasons.append("bsr: identity has no OK batch-1 throughput")
    return "; ".join(reasons)


# --- selection --------------------------------------------------------------------------
def select(
    frame: pd.DataFrame,
    compilers: Sequence[str] = (),
    batch_sizes: Sequence[int] = (),
    valid_only: bool = False,
    flags: Mapping[str, Sequence[str]] | None = None,
) -> pd.DataFrame:
    """The rows the user asked to see (relative metrics already hold their baselines)."""
    keep = pd.Series(True, index=frame.index)
    if compilers:
        keep &= frame["compiler"].isin(list(compilers))
    if batch_sizes:
        keep &= frame["batch_size"].isin(list(batch_sizes)).fillna(False).astype(bool)
    if valid_only:
        keep &= frame["status"] == schema.STATUS_OK
    for key, values in (flags or {}).items():
        column = frame[key] if key in frame else pd.Series("", index=frame.index)
        keep &= column.isin(list(values))
    return frame[keep].reset_index(drop=True)


def is_result(frame: pd.DataFrame) -> pd.Series:
    """Rows that hold a usable measurement (``schema.is_usable``: status OK; throughput
    measured): the only ones relative metrics, aggregates and rankings are made of."""
    usable = frame["status"].map(schema.is_usable).astype(bool)
    return usable & frame[schema.M_THROUGHPUT].notna()


def compiler_rank(label: str) -> tuple[int, str]:
    """Sort key: the identity first, then compilers by name."""
    return (0 if label == IDENTITY else 1, label)


def family_rank(family: str) -> tuple[int, str]:
    """Sort key: the paper's family order, then other families by name."""
    return (FAMILY_ORDER.index(family) if family in FAMILY_ORDER else len(FAMILY_ORDER), family)


def _sort(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    def key(series: pd.Series) -> pd.Series:
        if series.name == "compiler":
            return series.map(lambda v: compiler_rank(str(v)))
        if series.name == "family":
            return series.map(lambda v: family_rank(str(v)))
        return series

    return frame.sort_values(list(columns), key=key, kind="stable").reset_index(drop=True)


def _drop_if_single(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Drop columns that carry one value only (e.g. scenario when one scenario ran)."""
    single = [c for c in columns if c in frame and frame[c].nunique(dropna=False) <= 1]
    return frame.drop(columns=single)


# --- tables -----------------------------------------------------------------------------
CELL_COLUMNS = [
    "device",
    "model",
    "compiler",
    "batch_size",
    schema.M_THROUGHPUT,
    schema.M_THROUGHPUT_STD,
    schema.M_THROUGHPUT_CI_LOW,
    schema.M_THROUGHPUT_CI_HIGH,
    schema.M_THROUGHPUT_RERUN_LOW,
    schema.M_THROUGHPUT_RERUN_HIGH,
    schema.M_LATENCY_P50,
    schema.M_CPU,
    "speedup",
    "speedup_ci_low",
    "speedup_ci_high",
    schema.M_SPEEDUP_RERUN_LOW,
    schema.M_SPEEDUP_RERUN_HIGH,
    RATIO,
    f"{RATIO}_ci_low",
    f"{RATIO}_ci_high",
    *RELATIVE[1:],
    "cpu_reduction_pct",
    schema.M_MAX_ABS_ERROR,
    "status",
    "stability",
    "stability_reason",
    "missing",
    "family",
    "model_params",
    "flags",
    "scenario",
    "experiment_id",
    "run_id",
    "error",
    "moved",
]


def cells_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per device x model x compiler x batch size, with every relative metric."""
    out = frame.assign(model=frame["model_label"], compiler=frame["compiler_label"])
    out = out[CELL_COLUMNS]
    return _sort(out, ["device", "model", "compiler", "batch_size"])


def range_label(low: int, high: int) -> str:
    """``bs2-4`` (``bs8`` for a one-size range)."""
    return f"bs{low}" if low == high else f"bs{low}-{high}"


def family_table(
    frame: pd.DataFrame, ranges: Sequence[tuple[int, int]] = DEFAULT_RANGES
) -> pd.DataFrame:
    """Table VI: throughput and CPU % by family x compiler x device over batch-size ranges.

    Each value is the mean over the family's models and the range's batch sizes; the ``_std``
    beside it is the pooled measurement std (the paper's ± is repetition noise, not the spread
    between models of different sizes). CPU std needs ``cpu_percent_std`` from the runner.
    """
    measured = frame[is_result(frame)]
    keys = ["family", "compiler_label", "device", "scenario"]
    out = measured[keys].drop_duplicates()
    for low, high in ranges:
        out = out.merge(_range_aggregate(measured, keys, low, high), on=keys, how="left")
        cells = f"cells_{range_label(low, high)}"
        out[cells] = out[cells].fillna(0).astype(int)
    out = out.rename(columns={"compiler_label": "compiler"})
    return _drop_if_single(_sort(out, ["family", "compiler", "device"]), ["scenario"])


def _range_aggregate(measured: pd.DataFrame, keys: list[str], low: int, high: int) -> pd.DataFrame:
    """Mean throughput and CPU, pooled stds and the cell count over one batch-size range."""
    tag = range_label(low, high)
    part = measured[measured["batch_size"].between(low, high).fillna(False).astype(bool)]
    cpu_std = part[CPU_STD] if CPU_STD in part else pd.Series(np.nan, index=part.index)
    part = part.assign(_t2=part[schema.M_THROUGHPUT_STD] ** 2, _c2=cpu_std**2)
    agg = part.groupby(keys, dropna=False).agg(
        t=(schema.M_THROUGHPUT, "mean"),
        t2=("_t2", "mean"),
        c=(schema.M_CPU, "mean"),
        c2=("_c2", "mean"),
        n=(schema.M_THROUGHPUT, "size"),
    )
    return pd.DataFrame(
        {
            f"throughput_{tag}": agg["t"],
            f"throughput_{tag}_std": np.sqrt(agg["t2"]),  # pooled: root mean square of stds
            f"cpu_percent_{tag}": agg["c"],
            f"cpu_percent_{tag}_std": np.sqrt(agg["c2"]),
            f"cells_{tag}": agg["n"],
        }
    ).reset_index()


def block_params(frame: pd.DataFrame) -> pd.DataFrame:
    """Block rows with integer ``depth`` and ``width`` and the ``other_params`` of the block."""
    blocks = frame[frame["family"].isin(BLOCK_FAMILIES)].copy()
    for name in ("depth", "width"):
        column = f"{schema.P_MODEL_PARAM_PREFIX}{name}"
        given = blocks[column] if column in blocks else pd.Series(None, index=blocks.index)
        default = blocks["family"].map(lambda f, n=name: BLOCK_DEFAULTS[f][n])
        blocks[name] = pd.to_numeric(given, errors="coerce").fillna(default).astype(int)
    blocks["other_params"] = [
        ",".join(p for p in text.split(",") if p and p.split("=")[0] not in ("depth", "width"))
        for text in blocks["model_params"]
    ]
    return blocks


def depth_table(
    frame: pd.DataFrame, batch_sizes: Sequence[int] = DEFAULT_DEPTH_BATCHES
) -> pd.DataFrame:
    """Tables VII/VIII: depth slope and retention of the speedup, by block x device x
    compiler x width, for each batch size (baseline: identity at the same width, depth and
    batch size)."""
    blocks = block_params(frame[is_result(frame) & frame["speedup"].notna()])
    blocks = blocks[blocks["compiler"] != IDENTITY]
    keys = ["model", "device", "compiler_label", "width", "other_params", "scenario"]
    means = blocks.groupby([*keys, "batch_size", "depth"], dropna=False)["speedup"].mean()
    series: dict[tuple, dict[int, dict[int, float]]] = {}
    for index, value in means.items():
        by_batch = series.setdefault(index[:-2], {})
        by_batch.setdefault(int(index[-2]), {})[int(index[-1])] = float(value)
    rows = [
        {**dict(zip(keys, key, strict=True)), **_depth_values(series[key], batch_sizes)}
        for key in series
    ]
    columns = [*keys, *_depth_columns(batch_sizes), "depths", "note"]
    out = pd.DataFrame(rows, columns=columns).rename(columns={"compiler_label": "compiler"})
    out = _sort(out, ["model", "device", "compiler", "width"])
    return _drop_if_single(out, ["other_params", "scenario"])


def _depth_columns(batch_sizes: Sequence[int]) -> list[str]:
    return [f"{name}_bs{b}" for b in batch_sizes for name in ("slope", "retention")]


def _depth_values(by_batch: dict[int, dict[int, float]], batch_sizes: Sequence[int]) -> dict:
    """Slope and retention at each batch size from {batch: {depth: speedup}}."""
    depths = sorted({d for speedups in by_batch.values() for d in speedups})
    row: dict = {"depths": ",".join(map(str, depths))}
    notes = []
    for b in batch_sizes:
        speedups = by_batch.get(b, {})
        row[f"slope_bs{b}"] = metrics.depth_slope(list(speedups), list(speedups.values()))
        row[f"retention_bs{b}"] = metrics.retention(speedups)
        if len(speedups) < 2:
            notes.append(f"bs{b}: {len(speedups)} depth(s) measured")
        elif 1 not in speedups:
            notes.append(f"bs{b}: no depth-1 run, no retention")
    row["note"] = "; ".join(notes)
    return row


def compile_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Table III: compile seconds by model x batch size (rows) and device x compiler.

    The identity (nothing compiled) and cache hits (``compile_s`` is then a cache load) are
    left out.
    """
    part = frame[
        (frame["compiler"] != IDENTITY)
        & frame[schema.M_COMPILE].notna()
        & ~(frame[schema.M_CACHE_HIT] == 1)
        & frame["batch_size"].notna()
    ]
    index = ["model_label", "batch_size"]
    if part["scenario"].nunique() > 1:
        index.append("scenario")
    if part.empty:
        return pd.DataFrame(columns=["model", "batch_size"])
    pivot = part.pivot_table(
        index=index, columns=["device", "compiler_label"], values=schema.M_COMPILE, aggfunc="mean"
    )
    pivot.columns = [f"{device} {compiler} [s]" for device, compiler in pivot.columns]
    return pivot.reset_index().rename(columns={"model_label": "model"})


def payback_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Samples after which each compile is paid back against eager, by model x batch size
    (rows) and device x compiler: ``compile_s / (1/T_identity - 1/T_c)``, ``never`` where
    the compiler is not faster. Cache hits (no compile paid) and identity are left out."""
    part = frame[
        is_result(frame)
        & (frame["compiler"] != IDENTITY)
        & frame[schema.M_COMPILE].notna()
        & ~(frame[schema.M_CACHE_HIT] == 1)
        & frame["batch_size"].notna()
    ]
    if part.empty:
        return pd.DataFrame(columns=["model", "batch_size"])
    part = part.assign(
        payback=[
            metrics.payback(c, i, s, int(b))
            for c, i, s, b in zip(
                _list(part[schema.M_COMPILE]),
                _list(part["identity_throughput"]),
                _list(part["speedup"]),
                _list(part["batch_size"]),
                strict=True,
            )
        ]
    )
    part = part[part["payback"].notna()]
    if part.empty:
        return pd.DataFrame(columns=["model", "batch_size"])
    pivot = part.pivot_table(
        index=["model_label", "batch_size"],
        columns=["device", "compiler_label"],
        values="payback",
        aggfunc="max",
    )
    pivot.columns = [f"{device} {compiler} [inferences]" for device, compiler in pivot.columns]
    pivot = pivot.astype(object).map(lambda v: "never" if v == math.inf else v)
    return pivot.reset_index().rename(columns={"model_label": "model"})


def pareto_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per device and model, the measurements no other beats on both throughput (higher)
    and p99 latency (lower), over every valid configuration and batch size (a tune's trials
    included)."""
    part = frame[
        is_result(frame) & frame[schema.M_THROUGHPUT].notna() & frame[schema.M_LATENCY_P99].notna()
    ]
    columns = ["device", "model", "batch_size", "compiler", "throughput", "latency_p99_ms",
               "speedup"]  # fmt: skip
    rows = []
    for (device, model), group in part.groupby(["device", "model_label"], sort=True):
        ordered = group.sort_values([schema.M_THROUGHPUT, schema.M_LATENCY_P99],
                                    ascending=[False, True])  # fmt: skip
        best = math.inf
        for _, row in ordered.iterrows():
            if row[schema.M_LATENCY_P99] < best:
                best = row[schema.M_LATENCY_P99]
                rows.append([device, model, row["batch_size"], row["compiler_label"],
                             row[schema.M_THROUGHPUT], row[schema.M_LATENCY_P99],
                             row["speedup"]])  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def kendall_tau(first: Sequence[float], second: Sequence[float]) -> float | None:
    """Kendall's tau-b between two score lists (scipy's; ``None`` when either is all ties)."""
    from scipy import stats

    if len(first) < 2:
        return None
    tau = stats.kendalltau(first, second).statistic
    return None if tau is None or math.isnan(tau) else float(tau)


def _tau_b(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each row pair of two (draws x items) arrays, vectorized: the sum
    of the products of the pairwise order signs over the root of the non-tied pair counts
    (what scipy computes for one pair of lists)."""
    i, j = np.triu_indices(first.shape[1], k=1)
    a, b = np.sign(first[:, i] - first[:, j]), np.sign(second[:, i] - second[:, j])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (a * b).sum(axis=1) / np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))


def tau_interval(
    first: Sequence[float],
    first_sd: Sequence[float],
    second: Sequence[float],
    second_sd: Sequence[float],
    draws: int = TAU_DRAWS,
) -> tuple[float, float] | None:
    """A 95% interval of Kendall's tau under the measurements' own noise: a parametric
    bootstrap drawing every throughput from a normal with its standard deviation (from its
    logged interval). With a handful of models a resampling of models says little; the
    question here is whether the two rankings could differ by noise alone. ``None`` when an
    item's spread is unknown (taking it as 0 would narrow the interval by a guess)."""
    sd1, sd2 = np.asarray(first_sd, dtype=float), np.asarray(second_sd, dtype=float)
    if len(first) < 2 or np.any(np.isnan(sd1)) or np.any(np.isnan(sd2)):
        return None
    rng = np.random.default_rng(0)
    x = rng.normal(first, sd1, size=(draws, len(first)))
    y = rng.normal(second, sd2, size=(draws, len(second)))
    taus = _tau_b(x, y)
    taus = taus[~np.isnan(taus)]
    if not taus.size:
        return None
    low, high = np.percentile(taus, [2.5, 97.5])
    return float(low), float(high)


def swapped_pairs(
    names: Sequence[str], first: Sequence[float], second: Sequence[float]
) -> list[tuple[str, str]]:
    """Pairs ordered one way by ``first`` and the other by ``second``, each as (faster under
    ``first``, faster under ``second``)."""
    return [(names[i], names[j]) for i, j in _swapped(first, second)]


def _swapped(first: Sequence[float], second: Sequence[float]) -> list[tuple[int, int]]:
    """Index pairs (faster under ``first``, the other) that ``second`` orders the other way."""
    out = []
    for i in range(len(first)):
        for j in range(i + 1, len(first)):
            a, b = first[i] - first[j], second[i] - second[j]
            if a * b < 0:
                out.append((i, j) if a > 0 else (j, i))
    return out


def _separate(low: Sequence[float], high: Sequence[float], i: int, j: int) -> bool | None:
    """Whether the intervals of items i and j do not overlap (``None``: one is unknown)."""
    values = (low[i], high[i], low[j], high[j])
    if any(v is None or math.isnan(v) for v in values):
        return None
    return high[i] < low[j] or high[j] < low[i]


def _judged(group: dict[str, list], i: int, j: int, pairs) -> tuple[bool | None, bool]:
    """(whether items ``i`` and ``j`` separate, on re-run intervals): judged on the first
    of ``pairs`` (low and high column names, whether they are re-run intervals) that holds
    both items' intervals; ``(None, False)`` where none does."""
    for low, high, rerun in pairs:
        found = _separate(group[low], group[high], i, j)
        if found is not None:
            return found, rerun
    return None, False


def _noise_verdict(sides: list[tuple[bool | None, bool]]) -> str:
    """The words of :func:`mlflow_ngraph.measure.verdict.noise_text` for both rankings'
    sides, each (separate, on re-run intervals): ``beyond noise`` where both separate on
    re-run intervals, ``beyond this run's noise`` where a side was judged on this run's
    alone, ``within noise`` when either overlaps, ``noise unknown`` when an interval is
    missing."""
    beyond = [b for b, _ in sides]
    if any(b is False for b in beyond):
        return "within noise"
    if any(b is None for b in beyond):
        return "noise unknown"
    return "beyond noise" if all(on for _, on in sides) else BEYOND_RUN


def _order(names: Sequence[str], scores: Sequence[float]) -> str:
    ranked = sorted(zip(names, scores, strict=True), key=lambda pair: (-pair[1], pair[0]))
    return " > ".join(name for name, _ in ranked)


FLIP_COLUMNS = [
    "device",
    "batch_size",
    "compiler",
    "among",
    "level",
    "n",
    "kendall_tau",
    "tau_ci_low",
    "tau_ci_high",
    "swapped",
    "beyond_noise",
    "swapped_pairs",
    "identity_order",
    "compiler_order",
]


def flips_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Ranking flips: per device x batch size x compiler, the order of models (and of
    families, when a family holds several models) by identity throughput against the
    compiler's order, the pairs that swap, and Kendall's tau. Off-the-shelf models rank
    among themselves (``among = models``), block configurations among their block's."""
    part = frame[
        is_result(frame) & frame["identity_throughput"].notna() & (frame["compiler"] != IDENTITY)
    ]
    # blocks rank among configurations of their own block, never against whole models
    part = part.assign(among=part["family"].where(part["family"].isin(BLOCK_FAMILIES), "models"))
    keys = ["device", "batch_size", "compiler_label", "among", "scenario"]
    models = part.groupby(keys, dropna=False)["model_label"].nunique().to_dict()
    rows = []
    for level, column in (("model", "model_label"), ("family", "family")):
        for key, group in _rankings(part, keys, column).items():
            if level == "family" and len(group["names"]) == models[key]:
                continue  # one model per family: the family ranking repeats the model one
            row = _flip_row(group)
            if row is not None:
                labels = ["device", "batch_size", "compiler", "among", "scenario"]
                rows.append({**dict(zip(labels, key, strict=True)), "level": level, **row})
    out = pd.DataFrame(rows, columns=[*FLIP_COLUMNS, "scenario"])
    out = _sort(out, ["device", "batch_size", "compiler", "among", "level"])
    return _drop_if_single(out, ["scenario"])


def _rankings(part: pd.DataFrame, keys: list[str], column: str) -> dict[tuple, dict]:
    """group key -> the items (values of ``column``) with their identity and compiler
    throughputs and 95% intervals (means over the group's rows of each item: for a family,
    the mean of its models' throughputs and of their interval ends; an end is missing when
    any of its models' is, never the end of the others alone)."""
    values = [
        "identity_throughput",
        "identity_ci_low",
        "identity_ci_high",
        "identity_rerun_low",
        "identity_rerun_high",
        schema.M_THROUGHPUT,
        "ci_low",
        "ci_high",
        schema.M_THROUGHPUT_RERUN_LOW,
        schema.M_THROUGHPUT_RERUN_HIGH,
        "speedup_ci_low",
        "speedup_ci_high",
        schema.M_SPEEDUP_RERUN_LOW,
        schema.M_SPEEDUP_RERUN_HIGH,
        "unstable",
        "identity_unstable",
    ]
    low, high = _bounds(part)
    missing = [v for v in values if "rerun" in v and v not in part]  # none logged
    part = part.assign(
        **{name: np.nan for name in missing},
        ci_low=low,
        ci_high=high,
        unstable=(part["stability"] == UNSTABLE).astype(float),
        identity_unstable=(part["identity_stability"] == UNSTABLE).astype(float),
    )
    grouped = part.groupby([*keys, column], dropna=False)[values]
    means = grouped.mean().where(grouped.count().eq(grouped.size(), axis=0))
    out: dict[tuple, dict[str, list]] = {}
    for index, row in zip(means.index, means.itertuples(index=False, name=None), strict=True):
        group = out.setdefault(index[:-1], {"names": [], **{v: [] for v in values}})
        group["names"].append(str(index[-1]))
        for name, value in zip(values, row, strict=True):
            group[name].append(float(value))
    return out


def _unstable_sides(group: dict[str, list], i: int, j: int) -> str:
    """Which figures of the swapped pair ``i``, ``j`` are UNSTABLE (an item's compiled
    figure by its name, its eager one as ``<name> eager``; a family's where any of its
    models' is), in words; empty where every one is STABLE or not judged."""
    names = group["names"]
    sides = [names[k] for k in (i, j) if group["unstable"][k] > 0]
    sides += [f"{names[k]} eager" for k in (i, j) if group["identity_unstable"][k] > 0]
    return " and ".join(sides)


def _flip_row(group: dict[str, list]) -> dict | None:
    names = group["names"]
    if len(names) < 2:
        return None  # a ranking needs two items
    ident, comp = group["identity_throughput"], group[schema.M_THROUGHPUT]
    pairs = _swapped(ident, comp)
    # a flip needs the identity order to hold and the speedups to reverse it: the compiled
    # model that overtakes must have the larger speedup, beyond the speedups' intervals
    # (paired with identity in their rounds, so the host's drift between models cancels):
    # their re-run intervals where the host has measured its spread between sittings, else
    # this run's; the compiler throughputs' intervals where a speedup has none. The eager
    # order is judged on eager's re-run intervals where they exist, else on this run's.
    verdicts = []
    for i, j in pairs:
        noise = _unstable_sides(group, i, j)
        if noise:  # an order of two figures is judged only where both are STABLE
            verdicts.append(f"not judged: {noise} UNSTABLE")
            continue
        compiled = _judged(group, i, j, (
            (schema.M_SPEEDUP_RERUN_LOW, schema.M_SPEEDUP_RERUN_HIGH, True),
            (schema.M_THROUGHPUT_RERUN_LOW, schema.M_THROUGHPUT_RERUN_HIGH, True),
            ("speedup_ci_low", "speedup_ci_high", False), ("ci_low", "ci_high", False),
        ))  # fmt: skip
        ident_side = _judged(group, i, j, (
            ("identity_rerun_low", "identity_rerun_high", True),
            ("identity_ci_low", "identity_ci_high", False),
        ))  # fmt: skip
        verdicts.append(_noise_verdict([ident_side, compiled]))
    sd = {
        side: [(h - lo) / (2 * Z95) for lo, h in zip(group[f"{p}ci_low"], group[f"{p}ci_high"])]
        for side, p in (("identity", "identity_"), ("compiler", ""))
    }
    interval = tau_interval(ident, sd["identity"], comp, sd["compiler"])
    return {
        "n": len(names),
        "kendall_tau": kendall_tau(ident, comp),
        "tau_ci_low": interval[0] if interval else None,
        "tau_ci_high": interval[1] if interval else None,
        "swapped": len(pairs),
        "beyond_noise": sum(v in ("beyond noise", BEYOND_RUN) for v in verdicts),
        "swapped_pairs": "; ".join(
            f"{names[i]} > {names[j]} ({v})" for (i, j), v in zip(pairs, verdicts, strict=True)
        ),
        "identity_order": _order(names, ident),
        "compiler_order": _order(names, comp),
    }


# --- why a table is empty ---------------------------------------------------------------
#: what fills the depth tables: a depth x width grid of the blocks, in its own experiment
FILL_DEPTH = (
    "`mlflow-ngraph blocks --small` measures a depth x width grid of the blocks into "
    "ngraph-blocks, then `mlflow-ngraph compare -e ngraph-blocks --table depth`"
)


def why_empty(name: str, frame: pd.DataFrame, depth_batches: Sequence[int]) -> str:
    """Why table ``name`` has no row for ``frame`` (the rows compare selected), in words
    that name what would fill it."""
    results = frame[is_result(frame)]
    if results.empty:
        return "no OK measurement among these runs (see the per-cell table's status)"
    if name == "depth":
        return _why_no_depth(results, depth_batches)
    if name == "compile":
        return ("every engine came from the engine cache (its compile_s is a load) or only "
                "identity ran")  # fmt: skip
    if name == "flips":
        return ("a ranking needs two models or more measured with identity and a compiler "
                "at one batch size on one device")  # fmt: skip
    return "nothing to aggregate"


def _why_no_depth(results: pd.DataFrame, depth_batches: Sequence[int]) -> str:
    blocks = block_params(results)
    if blocks.empty:
        return f"these runs hold no conv_block or mha_block; {FILL_DEPTH}"
    if not (blocks["compiler"] == IDENTITY).any():
        return f"the blocks have no identity run, the baseline of their speedups; {FILL_DEPTH}"
    measured = sorted(int(b) for b in blocks["batch_size"].dropna().unique())
    if not set(measured) & set(depth_batches):
        return (
            f"the blocks were measured at batch size(s) {', '.join(map(str, measured))}, the "
            f"depth tables read {', '.join(map(str, depth_batches))} (choose with --batch-size)"
        )
    return f"no block speedup at those batch sizes; {FILL_DEPTH}"


def single_depth_note(frame: pd.DataFrame) -> str | None:
    """A note when the depth table has rows but no slope: every block at one depth."""
    if frame.empty or "depths" not in frame:
        return None
    if frame["depths"].map(lambda d: "," in str(d)).any():
        return None
    shown = ", ".join(sorted({f"{m} d{d}" for m, d in zip(frame["model"], frame["depths"])}))
    return (
        f"Tables VII/VIII: each block was measured at one depth ({shown}); a slope needs two "
        f"or more: {FILL_DEPTH}"
    )
