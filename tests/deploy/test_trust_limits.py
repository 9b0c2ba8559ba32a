"""A writer of a shared experiment cannot exhaust a reader's memory, disk or time: a gzip
bomb or a non-gzip file as a results index, a manifest listing 200,000 files, a manifest
bigger than a manifest may be, a listed file of another size than its manifest says. Each
attack is planted through MLflow's client on a copy of a store holding a real tiny
benchmark."""

from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import mlflow
import pytest
from deploy_support import cli
from mlflow.entities import Metric, Param
from trust_support import EXPERIMENT, cell_run, clone_store

from mlflow_ngraph.deploy import pull as pull_module
from mlflow_ngraph.deploy import trust
from mlflow_ngraph.deploy.select import Candidate
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import index
from tests._support import PYTHON

#: the most a command may take in memory with a 1 GiB gzip bomb as an index (the old reader
#: took 2.3 GB)
PEAK_RSS_MB = 1500
#: runs the command given after it as its child, and prints the child's peak RSS (MB) last
PEAK = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024, file=sys.stderr); "
    "sys.exit(done.returncode)"
)


@pytest.fixture
def store(tiny_store, tmp_path):
    """(tracking URI, client) of this test's own copy of the tiny benchmark's store."""
    from mlflow.tracking._tracking_service import utils

    uri = clone_store(tiny_store, tmp_path / "store", skip_home=True)
    yield uri, mlflow.tracking.MlflowClient(uri)
    utils._artifact_repos_cache.clear()


def _with_peak(*args: str):
    """``mlflow-ngraph args`` in its own process: (the finished process, its peak RSS in MB)."""
    command = [PYTHON, "-c", PEAK, PYTHON, "-m", "mlflow_ngraph", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    *rest, peak = done.stderr.rstrip("\n").split("\n")
    done.stderr = "\n".join(rest)
    return done, int(peak)


def _output(done) -> str:
    return done.stdout[-2000:] + done.stderr[-3000:]


def _parent(client) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (parent,) = client.search_runs([experiment.experiment_id], "tags.`ngraph.role` = 'benchmark'")
    return parent.info.run_id


def _plant_index(client, parent: str, folder, content: bytes) -> None:
    path = folder / index.INDEX_FILE
    folder.mkdir(exist_ok=True)
    path.write_bytes(content)
    client.log_artifact(parent, str(path), artifact_path=index.INDEX_DIR)


def _warned(done, parent: str) -> str:
    """The one line naming the parent's unusable index; no traceback."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if "results index" in x]
    assert parent in line and "searched live" in line and "--live" in line
    return line


# --- a results index that is not one ------------------------------------------------------
def test_a_gzip_bomb_as_the_index_is_one_line_in_bounded_memory(store, tmp_path):
    uri, client = store
    parent = _parent(client)
    bomb = gzip.compress(b" " * 2**20, 9) * 1024  # 1 GiB once decompressed, ~1 MB stored
    _plant_index(client, parent, tmp_path / "attacker", bomb)

    done, peak = _with_peak("compare", "-e", EXPERIMENT, "--tracking-uri", uri)
    assert done.returncode == 0, _output(done)
    assert "more than 268,435,456 bytes once decompressed" in _warned(done, parent)
    assert "onnxruntime" in done.stdout  # the cells, searched live
    assert peak < PEAK_RSS_MB, peak

    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    args += ["--compiler", "onnxruntime", "--batch-size", "1", "--allow-unstable"]
    done, peak = _with_peak(*args, "-o", str(tmp_path / "out"), "--tracking-uri", uri)
    assert done.returncode == 0, _output(done)
    _warned(done, parent)
    assert "chose" in done.stdout and (tmp_path / "out" / "manifest.json").is_file()
    assert peak < PEAK_RSS_MB, peak


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize(
    "content", [b"not gzip at all", gzip.compress(b"<html>not json")], ids=["text", "gzip-html"]
)
def test_an_index_that_is_not_gzip_json_is_one_warning_and_a_live_search(store, tmp_path, content):
    from mlflow_ngraph.report.query import RunQuery, fetch_cells

    uri, client = store
    parent = _parent(client)
    query = RunQuery(experiments=(EXPERIMENT,))
    genuine = sorted(fetch_cells(client, query, uri)["run_id"])
    _plant_index(client, parent, tmp_path / "attacker", content)
    lines = _Lines()
    logger = logging.getLogger("mlflow_ngraph.report.query")
    logger.addHandler(lines)
    try:
        assert sorted(fetch_cells(client, query, uri)["run_id"]) == genuine
    finally:
        logger.removeHandler(lines)
    (line,) = lines.lines
    assert parent in line and ("not a gzip file" in line or "not JSON" in line)


# --- manifests ----------------------------------------------------------------------------
def _own_run(client, genuine, manifest: dict, folder) -> str:
    """The writer's own cell run: the genuine run's params, tags and metrics, its manifest
    ``manifest`` (the sha256 recorded as the run's param, as a benchmark records it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / trust.MANIFEST
    path.write_text(json.dumps(manifest, separators=(",", ":")))
    params = {**genuine.data.params, trust.engine_param(1): trust.file_sha256(path)}
    tags = {k: v for k, v in genuine.data.tags.items() if not k.startswith("mlflow.")}
    tags.update({"ngraph.cell_key": "mallory", "mlflow.user": "mallory"})
    run = client.create_run(genuine.info.experiment_id, tags=tags)
    now = int(time.time() * 1000)
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, now, 0) for k, v in genuine.data.metrics.items()],
        params=[Param(k, v) for k, v in params.items()],
    )
    client.log_artifact(run.info.run_id, str(path), artifact_path="engines/bs1")
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def test_a_manifest_listing_200000_files_is_refused_at_once(store, tmp_path):
    uri, client = store
    genuine = cell_run(client, "onnxruntime")
    name = f"engines/bs1/{trust.MANIFEST}"
    manifest = json.loads(Path(client.download_artifacts(genuine.info.run_id, name)).read_text())
    manifest["files"] += [{"path": f"f{n}", "bytes": 0, "sha256": ""} for n in range(200_000)]
    evil = _own_run(client, genuine, manifest, tmp_path / "attacker")

    out = tmp_path / "pulled"
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--live"]
    args += ["--run", evil, "--batch-size", "1", "--allow-unstable", "-o", str(out)]
    args += ["--allow-unsigned"]  # the attacker's own run: unsigned, or the caps never meet it
    start = time.monotonic()
    done = cli(*args, "--tracking-uri", uri, timeout=120)  # the old check took minutes
    took = time.monotonic() - start
    assert done.returncode == 2, _output(done)
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert "lists 200,001 files, more than the 10,000" in line
    assert took < 60, took  # a CLI's start and a selection; the check itself: milliseconds
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pull-")]


class _Recording(mlflow.tracking.MlflowClient):
    """MLflow's client, recording what it downloads; ``stop_at`` raises Ctrl-C there."""

    def __init__(self, uri: str, stop_at: str | None = None):
        super().__init__(uri)
        self.downloaded: list[str] = []
        self.stop_at = stop_at

    def download_artifacts(self, run_id, path, dst_path=None):
        self.downloaded.append(path)
        if path == self.stop_at:
            raise KeyboardInterrupt
        return super().download_artifacts(run_id, path, dst_path)


def _candidate(run) -> Candidate:
    p = run.data.params
    return Candidate(run.info.run_id, run.info.experiment_id, "cpu", p["model"], p["compiler"],
                     "", 1)  # fmt: skip


def _pull(client, run, out):
    return pull_module.pull(client, _candidate(run), out, run=run)


def test_a_manifest_bigger_than_a_manifest_may_be_is_never_downloaded(store, tmp_path):
    uri, client = store
    genuine = cell_run(client, "onnxruntime")
    big = tmp_path / "attacker" / trust.MANIFEST
    big.parent.mkdir()
    with open(big, "wb") as handle:  # sparse: what is stored is what is listed
        handle.truncate(trust.MAX_MANIFEST_BYTES + 1)
    client.log_artifact(genuine.info.run_id, str(big), artifact_path="engines/bs1")
    spy = _Recording(uri)
    with pytest.raises(NgraphError, match="manifest has 16,777,217 bytes, more than the"):
        _pull(spy, genuine, tmp_path / "out")
    assert spy.downloaded == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pull-")]


def test_a_file_of_another_size_than_its_manifest_says_is_never_copied(store, tmp_path):
    uri, client = store
    genuine = cell_run(client, "onnxruntime")
    model = "engines/bs1/model.ort.onnx"
    # Ctrl-C while a file is copied: nothing is left
    spy = _Recording(uri, stop_at=model)
    with pytest.raises(KeyboardInterrupt):
        _pull(spy, genuine, tmp_path / "out")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pull-")]
    # a bigger model in the store, under the genuine manifest
    folder = tmp_path / "attacker"
    folder.mkdir()
    path = client.download_artifacts(genuine.info.run_id, model, str(folder))
    stored = os.path.getsize(path)
    with open(path, "ab") as handle:
        handle.write(b"\0" * 2**20)
    client.log_artifact(genuine.info.run_id, path, artifact_path="engines/bs1")
    spy = _Recording(uri)
    with pytest.raises(NgraphError) as refused:
        _pull(spy, genuine, tmp_path / "out")
    assert f"has {stored + 2**20:,} bytes in the store, the manifest says {stored:,}" in str(
        refused.value
    )
    assert spy.downloaded == [f"engines/bs1/{trust.MANIFEST}"]
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".pull-")]


def test_manifest_limits():
    def manifest(count: int, size: int = 1) -> dict:
        return {"files": [{"path": f"d/f{n}", "bytes": size, "sha256": ""} for n in range(count)]}

    start = time.monotonic()
    assert len(trust.check_paths(manifest(trust.MAX_FILES))) == trust.MAX_FILES
    assert time.monotonic() - start < 1  # a set, not a list, finds duplicates
    with pytest.raises(NgraphError, match="lists 10,001 files, more than the 10,000"):
        trust.check_paths(manifest(trust.MAX_FILES + 1))
    with pytest.raises(NgraphError, match="more than the 68,719,476,736 an engine may have"):
        trust.check_paths(manifest(2, trust.MAX_ENGINE_BYTES // 2 + 1))
    with pytest.raises(NgraphError, match="no size or sha256"):
        trust.check_paths(manifest(1, -1))
    twice = manifest(2)
    twice["files"][1]["path"] = "d/f0"
    with pytest.raises(NgraphError, match="twice"):
        trust.check_paths(twice)
    listed = manifest(1)
    with pytest.raises(NgraphError, match="d/f0 is missing from the store"):
        trust.check_stored(listed, {"f0": 1})
    trust.check_stored(listed, {"d/f0": 1})
    trust.check_stored(listed, {"d/f0": None})  # a store that gives no size: checked later
