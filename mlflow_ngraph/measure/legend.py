"""What each column of a results table means, in one line with its unit: the one legend the
summary, the MLflow descriptions and ``compare`` print under their tables (a column shown
without a line here fails ``tests/report/test_legend.py``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from mlflow_ngraph.measure.verdict import PARTED_REASON

#: the meaning of a column, by the header a table shows
COLUMNS = {
    "model": "the model (a block with its parameters)",
    "compiler": "the compiler, with the flags that tell two settings of it apart",
    "fastest": "the fastest valid compiler at that batch size (ranked on the paired speedups)",
    "bs": "batch size, samples per inference",
    "batch": "batch size, samples per inference",
    "batch_size": "batch size, samples per inference",
    "device": "the device the engines ran on",
    "scenario": "throughput (requests overlap) or latency (one request at a time)",
    "samples/s": "throughput, samples per second (the samples of the measured windows over "
    "their seconds)",
    "throughput": "throughput, samples per second [its 95% interval] (± the spread of one "
    "window's rate where no interval was logged)",
    "95% CI": "95% interval of the throughput, samples/s: this run's rounds on this host now",
    "p50 ms": "median latency of one request, milliseconds",
    "latency_p50_ms": "median latency of one request, milliseconds",
    "latency_p99_ms": "99th-percentile latency of one request, milliseconds",
    "CPU %": "CPU time of the engine's process over wall time, % of all cores",
    "cpu_percent": "CPU time of the engine's process over wall time, % of all cores",
    "speedup": "the speedup over eager (identity) at the same batch size, x: the paired "
    "estimate of the rounds (the median of the per-round ratios; the host's drift cancels) "
    "where they were measured together, else the ratio of the throughputs [its 95% interval]",
    "speedup CI": "95% interval of the speedup: the paired rounds' where it holds the "
    "speedup, else the two throughputs' intervals combined (the same rule in compare)",
    "re-run CI": "where a re-run on this host is expected to land, 95%, from the spread "
    "between sittings this host has shown (the speedup's; eager's row, and a row without a "
    "speedup, the throughput's)",
    "throughput re-run": "where a re-run's throughput is expected to land, 95%, samples/s",
    "speedup re-run": "where a re-run's speedup is expected to land, 95%, x",
    "drift %": "how much eager's rate moved from round to round while this was measured "
    "(sd of the log rate, %): the host's noise the pairing cancelled",
    "compile s": "seconds to get the engine: the compile, or a cache load on a hit",
    "payback": "inferences (requests of one batch each) after which the compile has paid "
    "for itself against eager; k = thousand, M = million; never: not faster than eager",
    "status": "OK, INVALID (the outputs differ from eager's beyond the tolerance) or FAILED",
    "stable": "UNSTABLE: this batch size's figure is noise on this host (interval wider "
    "than --max-interval, other processes took the CPU, or the host drifted); yes: judged "
    "stable; -: not judged",
    "stability": "UNSTABLE: this batch size's figure is noise on this host (interval wider "
    "than --max-interval, other processes took the CPU, or the host drifted); STABLE; empty: "
    "not judged",
    "note": "what else the run said of this row; resumed: measured by an earlier run, read back",
    "lead over": "the next-fastest valid row (eager included)",
    "next": "the next-fastest valid row (eager included)",
    "lead": "the winner's speedup over the next row's, x (same rounds where paired)",
    "noise": "beyond noise: the two figures' re-run intervals separate (a lead a re-run "
    "keeps); beyond this run's noise: the host has no spread between sittings yet (mlflow-"
    "ngraph calibrate measures it) and this run's intervals separate; within noise: they "
    "overlap; not judged: a side is UNSTABLE",
    "throughput_ratio": "T_c / T_eager, x [95% interval], shown only where it parts from the "
    f"paired speedup beyond both intervals: {PARTED_REASON}",
    "rtr": "RTR: throughput at this batch size over batch 1's, x (how the engine scales)",
    "ase": "ASE: RTR / batch size, 0-1 (1: the throughput grows with the batch)",
    "bsr": "BSR: the compiler's RTR over eager's, x (>1: it scales better than eager)",
    "cpu_reduction_pct": "CPU % saved against eager at the same batch size, % (negative: more)",
    "max_abs_error": "largest absolute difference of the outputs from eager's",
    "missing": "why a relative metric is missing",
    "family": "the model family (Table IV)",
    "width": "block width, channels (conv) or embedding size (attention)",
    "other_params": "the block's other parameters",
    "depths": "the depths (stacked blocks) measured",
    "among": "what the models are ranked among: off-the-shelf models, or one block's "
    "configurations",
    "level": "model: each model ranked; family: the mean of each family's models",
    "n": "items ranked",
    "kendall_tau": "Kendall's tau-b between the eager ranking and the compiler's, -1 to 1 "
    "(1: the same order)",
    "tau_ci_low": "95% interval of tau under the measurements' own noise, low end",
    "tau_ci_high": "95% interval of tau under the measurements' own noise, high end",
    "swapped": "pairs the compiler orders the other way from eager",
    "beyond_noise": "swapped pairs beyond noise: both rankings' intervals separate (their "
    "re-run intervals where the host has them, else this run's) and no figure of the pair "
    "is UNSTABLE",
    "swapped_pairs": "each swapped pair (in eager's order) and its verdict: beyond noise (on "
    "re-run intervals), beyond this run's noise (a side judged on this run's intervals "
    "alone), within noise, noise unknown, or not judged: UNSTABLE",
    "identity_order": "the models by eager throughput",
    "compiler_order": "the models by compiled throughput",
}

#: columns whose names carry a batch size, a range or a device: (pattern, meaning)
PATTERNS = (
    (r"throughput_bs[\d-]+", "mean throughput over the range's batch sizes and the family's "
     "models, samples/s ± pooled measurement std"),
    (r"cpu_percent_bs[\d-]+", "mean CPU over the range, % of all cores ± pooled std"),
    (r"cells_bs[\d-]+", "measurements behind the range's mean"),
    (r"slope_bs\d+", "least-squares slope of the speedup per added block, x per block"),
    (r"retention_bs\d+", "speedup at the deepest stack over at one block, x (1: kept)"),
    (r".+ \[s\]", "compile seconds of that device and compiler (cache hits left out)"),
    (r".+ \[inferences\]", "inferences (requests of one batch each) after which the compile "
     "pays for itself against eager; never: not faster"),
)  # fmt: skip


def meaning(header: str) -> str | None:
    """The one line that says what ``header`` means (``None``: not known)."""
    if header in COLUMNS:
        return COLUMNS[header]
    return next((text for pattern, text in PATTERNS if re.fullmatch(pattern, header)), None)


def legend(headers: Iterable[str], prefix: str = "  ") -> list[str]:
    """A line per column of ``headers`` (columns that share a meaning share a line), under
    a ``legend:`` line; a header with no meaning is left out (the test says so)."""
    lines, seen = ["legend:"], set()
    for header in headers:
        text = meaning(header)
        if text is None or (header, text) in seen:
            continue
        seen.add((header, text))
        lines.append(f"{prefix}{header}: {text}")
    return lines if len(lines) > 1 else []
