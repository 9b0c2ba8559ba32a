"""The engine supply's manifest folders: published whole, by any number of workers at once."""

from __future__ import annotations

import json
import threading

import pytest

from mlflow_ngraph.run.supply import publish


def _source(tmp_path, i: int):
    folder = tmp_path / f"src{i}"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"writer": i, "files": {}}))
    (folder / "engine.txt").write_text(str(i) * 1000)
    return folder


def _at_once(writer, sources) -> None:
    """``writer(source)`` for every source, each in a thread of its own, all at once."""
    threads = [threading.Thread(target=writer, args=(s,)) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_workers_publishing_one_manifest_at_once_all_succeed_and_leave_one_whole_copy(tmp_path):
    """Two workers of one engine (two runs into one home, an A/A pair) saved the same
    manifest folder at once; removing and copying in place lost one of them to
    ``FileExistsError``."""
    work = tmp_path / "work"
    work.mkdir()
    target = work / "manifest-k"
    errors: list[BaseException] = []
    sources = [_source(tmp_path, i) for i in range(4)]

    def writer(source):
        try:
            for _ in range(40):
                assert publish(source, target) == target
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    _at_once(writer, sources)
    assert errors == []
    writer_id = json.loads((target / "manifest.json").read_text())["writer"]
    assert (target / "engine.txt").read_text() == str(writer_id) * 1000  # one copy, whole
    assert sorted(p.name for p in work.iterdir()) == ["manifest-k"]  # nothing left aside


def test_a_manifest_published_again_replaces_the_earlier_one(tmp_path):
    target = tmp_path / "manifest-k"
    publish(_source(tmp_path, 1), target)
    publish(_source(tmp_path, 2), target)
    assert json.loads((target / "manifest.json").read_text())["writer"] == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".", "manifest"))) == [
        "manifest-k"
    ]


def _engine_source(tmp_path, i: int):
    from mlflow_ngraph.tracking.engines import write_manifest

    folder = tmp_path / f"engine{i}"
    folder.mkdir()
    (folder / "engine.bin").write_text(str(i) * 1000)
    write_manifest(folder, ["engine.bin"], {"writer": i})
    return folder


@pytest.mark.parametrize("replace", [False, True])
def test_workers_storing_one_engine_at_once_all_succeed_and_leave_one_whole_entry(
    tmp_path, replace
):
    """Two workers that built the same engine stored it at once: removing the entry and
    renaming the new one over it met the other's files (``OSError``: not empty)."""
    from mlflow_ngraph.tracking.engines import EngineCache, verify

    cache = EngineCache(tmp_path / "home")
    errors: list[BaseException] = []
    sources = [_engine_source(tmp_path, i) for i in range(4)]

    def writer(source):
        try:
            for _ in range(40):
                assert cache.store("k", source, replace=replace) == cache.root / "k"
                if not replace:  # a whole entry, once there, stays for its readers
                    assert cache.lookup("k") is not None
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    _at_once(writer, sources)
    assert errors == []
    assert verify(cache.root / "k")
    assert sorted(p.name for p in cache.root.iterdir()) == ["k"]  # no .tmp-* left


def test_a_whole_entry_is_kept_unless_it_is_replaced_and_a_broken_one_always_goes(tmp_path):
    from mlflow_ngraph.tracking.engines import EngineCache, read_manifest

    cache = EngineCache(tmp_path / "home")
    cache.store("k", _engine_source(tmp_path, 1))
    cache.store("k", _engine_source(tmp_path, 2))  # another worker's build of the same engine
    assert read_manifest(cache.root / "k")["writer"] == 1
    cache.store("k", _engine_source(tmp_path, 3), replace=True)  # the one there did not load
    assert read_manifest(cache.root / "k")["writer"] == 3
    (cache.root / "k" / "engine.bin").write_text("edited")  # fails verify: rebuilt over
    cache.store("k", _engine_source(tmp_path, 4))
    assert read_manifest(cache.root / "k")["writer"] == 4
