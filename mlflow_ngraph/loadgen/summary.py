"""LoadGen's verdict and figures, read from its own logs: ``mlperf_log_detail.txt`` (one
``:::MLLOG {json}`` record a line: ``result_validity``, the rules met, the counts) and
``mlperf_log_summary.txt`` (the percentiles). Nothing here computes a figure LoadGen did not
report; an INVALID result keeps its figures only for the record, never as a result."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUMMARY_FILE = "mlperf_log_summary.txt"
DETAIL_FILE = "mlperf_log_detail.txt"
PREFIX = ":::MLLOG "
NS_PER_MS = 1e6

#: the rules LoadGen checks, as its detail log names them -> how the reason says one unmet
RULES = {
    "result_perf_constraints_met": "the latency bound was not held",
    "result_min_duration_met": "the minimum duration was not met",
    "result_min_queries_met": "the minimum query count was not met",
    "early_stopping_met": "early stopping was not satisfied",
}
#: LoadGen's early-stopping advice: "Processed N queries. Would need to run at least M more
#: queries, with the run being successful if every additional query were under latency."
PROCESSED = re.compile(r"Processed (\d+) queries")
MORE = re.compile(r"Would need to run at least (\d+) more queries")
PERCENTILE = re.compile(r"^\s*(\d+(?:\.\d+)?) percentile latency \(ns\)\s*:\s*(\d+)", re.M)


@dataclass
class ScenarioResult:
    """One LoadGen run: its verdict, the reason when INVALID, and its figures (metric
    name -> value, the scenario's prefix included: ``server.qps``)."""

    scenario: str
    valid: bool
    reason: str = ""
    figures: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # LoadGen's result_* records

    @property
    def validity(self) -> str:
        return "VALID" if self.valid else "INVALID"

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "valid": self.valid,
            "reason": self.reason,
            "figures": dict(self.figures),
            "details": dict(self.details),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScenarioResult:
        return cls(
            data["scenario"], bool(data["valid"]), data.get("reason", ""),
            {k: float(v) for k, v in data.get("figures", {}).items()},
            dict(data.get("details", {})),
        )  # fmt: skip


def read_detail(text: str) -> dict[str, Any]:
    """Every ``:::MLLOG`` record's key -> value (the last one of a key wins); a torn or
    foreign line is skipped."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            record = json.loads(line[len(PREFIX) :])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "key" in record:
            out[str(record["key"])] = record.get("value")
    return out


def percentiles_ms(summary: str) -> dict[float, float]:
    """The summary's ``NN.NN percentile latency (ns)`` lines, in ms."""
    return {float(p): int(ns) / NS_PER_MS for p, ns in PERCENTILE.findall(summary)}


def invalid_reason(detail: dict[str, Any]) -> str:
    """Why LoadGen said INVALID, in its own terms: each unmet rule, then its advice."""
    unmet = [text for key, text in RULES.items() if detail.get(key) is False]
    advice = str(detail.get("result_invalid_reason") or "").strip()
    early = " ".join(str(detail.get("early_stopping_result") or "").split())
    if detail.get("early_stopping_met") is False and early:
        advice = f"{advice} {early}".strip()
    return "; ".join(unmet + ([advice] if advice else [])) or "LoadGen said INVALID"


def queries_needed(detail: dict[str, Any]) -> int | None:
    """The query count LoadGen's early stopping says a run needs (what it processed plus the
    more it asks for), or None when it asked for nothing."""
    text = " ".join(str(detail.get("early_stopping_result") or "").split())
    more = MORE.search(text)
    if detail.get("early_stopping_met") is not False or not more:
        return None
    done = PROCESSED.search(text)
    return (int(done.group(1)) if done else int(detail.get("result_query_count") or 0)) + int(
        more.group(1)
    )


def figures(scenario: str, detail: dict[str, Any], summary: str) -> dict[str, float]:
    """The scenario's figures as LoadGen reported them (names carry the unit)."""
    pct = percentiles_ms(summary)
    out: dict[str, float] = {}
    if scenario == "singlestream":
        estimate = detail.get("early_stopping_latency_ss")
        out["singlestream.p90_ms"] = (estimate or 0) / NS_PER_MS or pct.get(90.0, 0.0)
        out["singlestream.p90_measured_ms"] = pct.get(90.0, 0.0)  # the run's own, no bound
        out["singlestream.p99_ms"] = pct.get(99.0, 0.0)
        out["singlestream.qps"] = float(detail.get("result_qps_with_loadgen_overhead") or 0)
    elif scenario == "multistream":
        estimate = detail.get("early_stopping_latency_ms")
        out["multistream.p99_ms"] = (estimate or 0) / NS_PER_MS or pct.get(99.0, 0.0)
        out["multistream.p50_ms"] = pct.get(50.0, 0.0)
    elif scenario == "offline":
        out["offline.samples_per_s"] = float(detail.get("result_samples_per_second") or 0)
    elif scenario == "server":
        out["server.qps"] = float(detail.get("result_completed_samples_per_sec") or 0)
        out["server.scheduled_qps"] = float(detail.get("result_scheduled_samples_per_sec") or 0)
        out["server.p99_ms"] = pct.get(99.0, 0.0)
        out["server.p50_ms"] = pct.get(50.0, 0.0)
    out[f"{scenario}.queries"] = float(detail.get("result_query_count") or 0)
    return {k: v for k, v in out.items() if v or k.endswith(".queries")}


def parse_logs(scenario: str, outdir: Path) -> ScenarioResult:
    """The result of the LoadGen run that wrote ``outdir``."""
    outdir = Path(outdir)
    detail_path, summary_path = outdir / DETAIL_FILE, outdir / SUMMARY_FILE
    if not detail_path.is_file() or not summary_path.is_file():
        return ScenarioResult(scenario, False, f"LoadGen wrote no logs in {outdir}")
    detail = read_detail(detail_path.read_text(errors="replace"))
    summary = summary_path.read_text(errors="replace")
    valid = detail.get("result_validity") == "VALID"
    kept = {k: v for k, v in detail.items() if k.startswith("result_") or k.startswith("early_")}
    return ScenarioResult(
        scenario, valid, "" if valid else invalid_reason(detail),
        figures(scenario, detail, summary), kept,
    )  # fmt: skip
