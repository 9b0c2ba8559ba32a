"""The caches compilers share on disk: the ONNX export (one per model, read by every compiler
that starts from it) and TVM's tuning databases, written by any number of workers at once."""

from __future__ import annotations

import shutil
import sys
import threading
from types import SimpleNamespace

import pytest

from mlflow_ngraph.compilers import _export
from mlflow_ngraph.errors import CompileFailed


def test_workers_exporting_one_model_at_once_all_get_the_file_and_leave_one_entry(
    tmp_path, monkeypatch
):
    """ONNX Runtime's and OpenVINO's workers of one group prepare at once and, on a new home,
    both export the model. The second to finish checked for the first's entry, then renamed
    its own over it: where the first's rename landed in between, ``OSError: directory not
    empty`` (seen on a first ``mlflow-ngraph calibrate``: OpenVINO's bs1 FAILED)."""
    writers = 4
    barrier = threading.Barrier(writers)

    def fake_export(model, path):
        barrier.wait()  # every worker's export ends at the same moment
        path.write_bytes(b"onnx of " + model.content_hash.encode())
        return "dynamo"

    monkeypatch.setattr(_export, "_export_to", fake_export)
    errors: list[BaseException] = []
    got: list = []

    def writer(model):
        try:
            got.append(_export.export_onnx(model, tmp_path))
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads interleave every few bytecodes, as processes do
    try:
        for i in range(100):
            model = SimpleNamespace(onnx_file=None, content_hash=f"{i:02d}" + 40 * "a")
            threads = [threading.Thread(target=writer, args=(model,)) for _ in range(writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == [], f"model {i}: {errors[0]!r}"
            assert len({str(p) for p in got}) == 1
            assert got[0].read_bytes() == b"onnx of " + model.content_hash.encode()
            assert (got[0].parent / "exporter.txt").read_text() == "dynamo"
            got.clear()
    finally:
        sys.setswitchinterval(switch)
    left = sorted(p.name for p in (tmp_path / "exports").iterdir())
    assert len(left) == 100 and not [n for n in left if n.startswith(".tmp-")]


def test_a_tuning_database_cached_again_replaces_the_one_there_whole(tmp_path):
    """TVM's tuning cache: a later tuning's database replaces the entry as a whole (the old
    one set aside, not removed file by file under a reader), and nothing is left beside."""
    from mlflow_ngraph.compilers.tvm.database import store_in_cache
    from mlflow_ngraph.compilers.tvm.settings import RECORD_FILE, WORKLOAD_FILE

    cache = tmp_path / "tvm-tuning" / "k"
    for tuning in ("first", "second"):
        source = tmp_path / tuning
        source.mkdir()
        for name in (WORKLOAD_FILE, RECORD_FILE):
            (source / name).write_text(f"{tuning} {name}")
        store_in_cache(source, cache)
        assert (cache / RECORD_FILE).read_text() == f"{tuning} {RECORD_FILE}"
    assert [p.name for p in cache.parent.iterdir()] == ["k"]
    assert sorted(p.name for p in cache.iterdir()) == sorted([WORKLOAD_FILE, RECORD_FILE])


def test_an_export_whose_folder_a_prune_removed_is_a_compile_failure_not_a_missing_file(
    tmp_path, monkeypatch
):
    """``cache --prune`` beside a command that holds no run (a gate, a loadgen cell) removes
    the ``.tmp-*`` folder an export is written in: the export fails in one line, where it
    raised a bare FileNotFoundError, or, with the folder gone just before the rename,
    returned a path with no file."""

    def pruned_while_written(model, path):
        path.write_bytes(b"onnx")
        shutil.rmtree(path.parent.parent)  # the prune, as the export ends
        return "dynamo"

    monkeypatch.setattr(_export, "_export_to", pruned_while_written)
    model = SimpleNamespace(onnx_file=None, content_hash=40 * "b")
    with pytest.raises(CompileFailed, match="removed while it was written"):
        _export.export_onnx(model, tmp_path)

    def pruned_before_the_rename(fresh, target, aside, keep=None):
        shutil.rmtree(aside)
        return target

    monkeypatch.setattr(_export, "_export_to", lambda m, p: p.write_bytes(b"onnx") and "dynamo")
    monkeypatch.setattr(_export, "put_in_place", pruned_before_the_rename)
    with pytest.raises(CompileFailed, match="could not be put in place"):
        _export.export_onnx(model, tmp_path)
    assert [p.name for p in (tmp_path / "exports").iterdir()] == []


def test_a_database_seeded_while_its_cache_entry_is_replaced_is_one_tunings_whole(tmp_path):
    """A build seeding its database from the cache while another tuner replaces the entry
    (``store_in_cache``) copied the two files by path, one after the other: it could get
    the workloads of one tuning beside the records of another (records name workloads by
    their line). Now it gets one tuning's files, or none (a miss: it tunes)."""
    from mlflow_ngraph.compilers.tvm.database import seed_database, store_in_cache
    from mlflow_ngraph.compilers.tvm.settings import RECORD_FILE, WORKLOAD_FILE

    cache = tmp_path / "tvm-tuning" / "k"
    tunings = []
    for tag in "ab":
        tuned = tmp_path / f"tuned-{tag}"
        tuned.mkdir()
        (tuned / WORKLOAD_FILE).write_text(tag * 20_000)
        (tuned / RECORD_FILE).write_text(tag * 20_000)
        tunings.append(tuned)
    store_in_cache(tunings[0], cache)
    done = threading.Event()

    def tuner():
        for i in range(400):
            store_in_cache(tunings[i % 2], cache)
        done.set()

    thread = threading.Thread(target=tuner)
    thread.start()
    seeded, mixed = 0, []
    while not done.is_set():
        target = tmp_path / "build" / str(seeded)
        if seed_database(target, None, cache) == "cache":
            seeded += 1
            pair = {(target / name).read_text()[:1] for name in (WORKLOAD_FILE, RECORD_FILE)}
            if len(pair) != 1:
                mixed.append(seeded)
        elif target.exists():
            assert not any(target.iterdir()), "a miss leaves no file of half a tuning"
    thread.join()
    assert seeded > 5 and not mixed, f"{len(mixed)} of {seeded} seeded databases were mixed"
