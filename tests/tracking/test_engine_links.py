"""An engine logged to a local store is on disk once: its files are hard-linked from the
cache into the run's artifacts, a copy is made only where links cannot be, and a cache entry
edited through the store is refused by the cache's own check."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from mlflow_ngraph.tracking import engines
from mlflow_ngraph.tracking import mlflow_log as ml


@pytest.fixture
def engine(tmp_path: Path) -> Path:
    folder = tmp_path / "home" / "engines" / "abc"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\x01" * 4096)
    (folder / "sub" / "weights.bin").write_bytes(b"\x02" * 1024)
    engines.write_manifest(folder, ["model.onnx", "sub/weights.bin"], {"compiler": "x"})
    return folder


@pytest.fixture
def run(tracking_uri: str):
    client = MlflowClient(tracking_uri)
    run = client.create_run("0")
    return client, run.info.run_id


def _artifacts(client: MlflowClient, run_id: str) -> Path:
    local = engines.local_artifact_dir(client.get_run(run_id).info.artifact_uri)
    assert local is not None
    return local / "engines" / "bs1"


def test_a_local_store_links_the_engine_files_and_pins_the_manifest(engine, run):
    client, run_id = run
    ml.log_engine(client, run_id, engine, 1)
    logged = _artifacts(client, run_id)
    for name in ("model.onnx", "sub/weights.bin", engines.MANIFEST):
        assert os.stat(logged / name).st_ino == os.stat(engine / name).st_ino, name
    assert {f.path for f in client.list_artifacts(run_id, "engines/bs1")} >= {
        "engines/bs1/model.onnx",
        "engines/bs1/manifest.json",
    }
    digest = engines.file_sha256(engine / engines.MANIFEST)
    assert client.get_run(run_id).data.params[engines.engine_param(1)] == digest
    assert not list(logged.rglob(".link-*"))


def test_the_logged_engine_outlives_the_cache_entry(engine, run, tmp_path):
    client, run_id = run
    ml.log_engine(client, run_id, engine, 1)
    for path in sorted(engine.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    out = Path(client.download_artifacts(run_id, "engines/bs1", str(tmp_path / "out")))
    assert (out / "model.onnx").read_bytes() == b"\x01" * 4096
    assert engines.verify(out)


def test_an_engine_edited_through_the_store_fails_the_cache_lookup(engine, run):
    client, run_id = run
    ml.log_engine(client, run_id, engine, 1)
    cache = engines.EngineCache(engine.parent.parent)
    assert cache.lookup("abc") == engine
    with open(_artifacts(client, run_id) / "model.onnx", "r+b") as handle:
        handle.write(b"\xff")  # in place: the cache's file is the same file
    assert cache.lookup("abc") is None  # measured again from a fresh build, never this one


def test_where_links_are_refused_the_engine_is_copied_whole(engine, run, monkeypatch):
    client, run_id = run
    calls = []

    def refuse_second(src, dst):
        calls.append(src)
        if len(calls) == 2:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_link(src, dst)

    real_link = os.link
    monkeypatch.setattr(os, "link", refuse_second)
    ml.log_engine(client, run_id, engine, 1)
    logged = _artifacts(client, run_id)
    assert (logged / "model.onnx").read_bytes() == b"\x01" * 4096
    assert engines.verify(logged)
    for name in ("model.onnx", "sub/weights.bin"):  # none is left a link half-way
        assert os.stat(logged / name).st_ino != os.stat(engine / name).st_ino, name


def test_only_a_local_artifact_uri_is_a_folder():
    assert engines.local_artifact_dir("file:///a/b/artifacts") == Path("/a/b/artifacts")
    assert engines.local_artifact_dir("/a/b") == Path("/a/b")
    for remote in ("mlflow-artifacts:/1/abc/artifacts", "s3://bucket/x", "http://h/x"):
        assert engines.local_artifact_dir(remote) is None
