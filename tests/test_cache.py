"""``mlflow-ngraph cache``: the size of a real home's caches after a benchmark, and pruning
them (all, down to a size, or what went unused) without touching the journals."""

from __future__ import annotations

import os
import re
import time

from mlflow_ngraph.cache import entries
from tests._support import TINY


def _benchmark(run_cli, tracking_uri) -> None:
    code, _, err = run_cli("benchmark", *TINY, "--compiler", "identity", "--compiler",
                           "onnxruntime", "--tracking-uri", tracking_uri, "-q")  # fmt: skip
    assert code == 0, err


def test_cache_shows_the_size_of_each_part(run_cli, tracking_uri, home):
    _benchmark(run_cli, tracking_uri)
    code, out, err = run_cli("cache")
    assert code == 0, err
    assert f"caches in {home}:" in out
    engines = next(line for line in out.splitlines() if line.startswith("engines"))
    count = int(engines.split()[1])
    assert count == len([e for e in entries(home) if e.part == "engines"]) >= 2
    assert re.search(r"\d+(\.\d)? [KMG]?B", engines)
    assert "mlflow-ngraph cache --prune" in out


def test_prune_keeps_the_journals_and_the_most_recently_used(run_cli, tracking_uri, home):
    _benchmark(run_cli, tracking_uri)
    found = sorted(entries(home), key=lambda e: e.bytes)
    old, recent = found[0], found[-1]
    past = time.time() - 30 * 86400
    for entry in found:
        if entry is not recent:
            os.utime(entry.path, (past, past))
    code, out, err = run_cli("cache", "--prune", "--older-than", "14")
    assert code == 0, err
    left = entries(home)
    assert [e.path for e in left] == [recent.path] and not old.path.exists()
    assert "removed" in out and "freed" in out
    assert list((home / "journals").glob("*.jsonl"))  # what a re-run resumes from stays
    code, out, _ = run_cli("cache", "--prune", "--max-size", "0")
    assert code == 0 and entries(home) == []
    assert list((home / "journals").glob("*.jsonl"))


def test_a_bad_size_is_one_line(run_cli):
    code, out, err = run_cli("cache", "--prune", "--max-size", "lots")
    assert code == 2 and "Traceback" not in err
    assert err.strip() == "error: --max-size 'lots' is not a size: expected e.g. 500M or 2G"
    code, _, err = run_cli("cache", "--max-size", "1G")
    assert code == 2 and "add --prune" in err
