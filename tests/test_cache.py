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


def test_cache_shows_each_part_then_prune_keeps_the_journals_and_the_most_recently_used(
    run_cli, tracking_uri, home
):
    _benchmark(run_cli, tracking_uri)  # one benchmark's home: what cache shows, then a prune
    code, out, err = run_cli("cache")
    assert code == 0, err
    assert f"caches in {home}:" in out
    engines = next(line for line in out.splitlines() if line.startswith("engines"))
    count = int(engines.split()[1])
    assert count == len([e for e in entries(home) if e.part == "engines"]) >= 2
    assert re.search(r"\d+(\.\d)? [KMG]?B", engines)
    assert "mlflow-ngraph cache --prune" in out

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


def test_a_prune_loop_beside_a_benchmark_loses_nothing(tmp_path, tracking_uri, home):
    """``cache --prune`` over and over while a benchmark exports, compiles and caches into
    the same home: every batch size measured, none FAILED; the prune says what it kept;
    once the benchmark ends, a prune takes everything."""
    import json
    import subprocess
    import sys

    from mlflow_ngraph.cache import prune, users
    from tests._support import REPO

    args = [sys.executable, "-m", "mlflow_ngraph", "benchmark", *TINY, "--compiler", "identity",
            "--compiler", "onnxruntime", "--compiler", "openvino", "--tracking-uri",
            tracking_uri, "-q"]  # fmt: skip
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(home), "PYTHONPATH": str(REPO)}
    bench = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    held, rounds = 0, 0
    while bench.poll() is None:
        done = prune(home)
        rounds += 1
        held += len(done.held)
        time.sleep(0.05)
    out, err = bench.communicate()
    assert bench.returncode == 0, err[-3000:]
    assert held and rounds > 10, (held, rounds)  # the loop ran beside the work, and kept it
    records = [json.loads(line) for path in (home / "journals").glob("*.jsonl")
               for line in path.read_text().splitlines()]  # fmt: skip
    assert not [r for r in records if r["kind"] == "failed"], "a result was stored FAILED"
    measured = {(r["cell"], r["batch_size"]) for r in records if r["kind"] == "measured"}
    assert len(measured) == 3 * 2, measured  # three compilers, two batch sizes
    assert users(home) == []  # the benchmark's lock went with it
    prune(home)
    assert entries(home) == []


def test_a_prune_says_what_a_running_run_holds_and_removes_what_a_killed_run_left(run_cli, home):
    import multiprocessing

    from mlflow_ngraph.cache import in_use

    (home / "exports" / ".tmp-killed").mkdir(parents=True)  # a killed run's unfinished export
    (home / "engines" / "old").mkdir(parents=True)
    past = time.time() - 86400
    os.utime(home / "engines" / "old", (past, past))
    code, out, err = run_cli("cache", "--prune")
    assert code == 0, err
    assert "removed 1 unfinished entries killed runs left" in out
    assert (
        not (home / "exports" / ".tmp-killed").exists() and not (home / "engines" / "old").exists()
    )

    ready, stop = multiprocessing.Event(), multiprocessing.Event()

    def hold() -> None:
        with in_use(home, "a benchmark"):
            (home / "engines" / "new").mkdir()
            (home / "exports" / ".tmp-writing").mkdir()
            ready.set()
            stop.wait(60)

    holder = multiprocessing.get_context("fork").Process(target=hold)
    holder.start()
    try:
        assert ready.wait(30)
        (home / "engines" / "old").mkdir()
        os.utime(home / "engines" / "old", (past, past))
        code, out, err = run_cli("cache", "--prune")
        assert code == 0, err
        assert "removed 1 cache entries" in out
        assert "kept 2 entries" in out and f"in use by a benchmark (pid {holder.pid}" in out
        assert (home / "engines" / "new").exists() and (home / "exports" / ".tmp-writing").exists()
    finally:
        stop.set()
        holder.join(30)
    code, out, err = run_cli("cache", "--prune")  # its holder is gone: all of it goes
    assert code == 0 and entries(home) == [], out
