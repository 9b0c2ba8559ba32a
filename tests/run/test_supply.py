"""The engine supply's manifest folders: published whole, by any number of workers at once."""

from __future__ import annotations

import json
import threading

from mlflow_ngraph.run.supply import publish


def _source(tmp_path, i: int):
    folder = tmp_path / f"src{i}"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"writer": i, "files": {}}))
    (folder / "engine.txt").write_text(str(i) * 1000)
    return folder


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

    threads = [threading.Thread(target=writer, args=(s,)) for s in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
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
