"""The gate's result as plain data, and as text, markdown (a GitHub Actions step summary),
JSON and JUnit XML (a CI test report). Values from the store pass through
:func:`mlflow_ngraph.text.visible` before a terminal sees them."""

from __future__ import annotations

import json
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from mlflow_ngraph.gate.verdict import percent

FORMATS = ("text", "markdown", "json", "junit")
#: result format version: a reader can tell what fields to expect
VERSION = 1


def headline(result: dict[str, Any]) -> str:
    """The verdict in one line: ``slower: -8.8% (95% CI -10.1% .. -7.4%), tolerance +-3%``."""
    verdict = result["verdict"]
    if verdict == "invalid":
        reason = result["outputs"]["reason"]
        return f"invalid: the challenger's outputs differ from the champion's ({reason})"
    low, high = result.get("low"), result.get("high")
    interval = f" (95% CI {percent(low)} .. {percent(high)})" if low is not None else ""
    return (
        f"{verdict}: the challenger's throughput {percent(result.get('ratio'))} against the "
        f"champion's{interval}, tolerance +-{100 * result['tolerance']:g}%"
    )


def _side_lines(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for key in ("label", "throughput", "runtime", "python"):
        values = []
        for role in ("champion", "challenger"):
            side = result[role]
            value = side.get(key)
            values.append(f"{value:.1f} samples/s" if isinstance(value, float) else str(value))
        rows.append((key, *values))
    return rows


def as_text(result: dict[str, Any]) -> str:
    from mlflow_ngraph.text import visible

    lines = [headline(result)]
    for key, champion, challenger in _side_lines(result):
        lines.append(f"  {key:<11} champion {champion}  |  challenger {challenger}")
    lines.append(
        "  not measured: the outputs differ"
        if result["verdict"] == "invalid"
        else f"  measured   {result['rounds']} rounds in {result['seconds']:.0f} s; interval: "
        f"{result.get('interval_kind')} ({result.get('interval_source')})"
    )
    if result.get("run_id"):
        lines.append(f"  MLflow run {result['run_id']} (experiment {result.get('experiment')})")
    if result.get("planted_delay"):
        lines.append(f"  TEST ONLY: planted delay {result['planted_delay']:g} on the challenger")
    for note in result.get("notes", []):
        lines.append(f"  {note}")
    return "\n".join(visible(line) for line in lines)


def as_markdown(result: dict[str, Any]) -> str:
    def cell(text: Any) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    out = [f"### Gate: **{result['verdict']}**", "", cell(headline(result)), ""]
    out += ["| | champion | challenger |", "| --- | --- | --- |"]
    out += [f"| {k} | {cell(a)} | {cell(b)} |" for k, a, b in _side_lines(result)]
    out += ["", f"{result['rounds']} rounds in {result['seconds']:.0f} s"]
    if result.get("run_id"):
        out[-1] += f"; MLflow run `{result['run_id']}`"
    out += [f"- {cell(note)}" for note in result.get("notes", [])]
    return "\n".join(out)


def as_junit(result: dict[str, Any]) -> str:
    """One test case, ``gate``: a failure on slower and invalid, skipped on unsure."""
    verdict = result["verdict"]
    body = ""
    if verdict in ("slower", "invalid"):
        body = f"<failure message={quoteattr(headline(result))}/>"
    elif verdict == "unsure":
        body = f"<skipped message={quoteattr(headline(result))}/>"
    failures = int(verdict in ("slower", "invalid"))
    skipped = int(verdict == "unsure")
    out = escape(json.dumps(result, indent=1, default=str))
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="mlflow-ngraph gate" tests="1" failures="{failures}" '
        f'skipped="{skipped}" time="{result["seconds"]:.1f}">\n'
        f'  <testcase classname="gate" name={quoteattr(result["challenger"]["label"])} '
        f'time="{result["seconds"]:.1f}">{body}<system-out>{out}</system-out></testcase>\n'
        "</testsuite>"
    )


def render(result: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"version": VERSION, **result}, indent=2, default=str)
    if fmt == "markdown":
        return as_markdown(result)
    if fmt == "junit":
        return as_junit(result)
    return as_text(result)
