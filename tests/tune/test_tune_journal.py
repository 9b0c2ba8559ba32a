"""The tune journal: a line per record with its checksum; a damaged line is skipped; a trial,
a group's seconds and its reference are read once however often two copies wrote them."""

from __future__ import annotations

import json

from mlflow_ngraph.tune.trials import TuneJournal


def _trial(journal, number, group, compiler="onnxruntime"):
    journal.append("trial", number=number, batch_size=1, compiler=compiler,
                   flags={"threads": number}, params=None, group=group, stage="search")  # fmt: skip


def test_what_two_copies_wrote_twice_is_read_once(tmp_path):
    journal = TuneJournal(tmp_path, "k-s")
    journal.append("run", run_id="r1")
    for copy in range(2):  # two copies of one tune, before the tune had a lock
        for number in (0, 1, 2):
            _trial(journal, number, group=number // 2, compiler=f"copy{copy}")
        journal.append("reference", group=0, batch_size=1, metrics={"throughput": 10.0})
        journal.append("spent", seconds=30.0, group=0)
        journal.append("spent", seconds=20.0, group=1)
    trials, spent, run_id = journal.load()
    assert [t.number for t in trials] == [0, 1, 2]
    assert {t.compiler for t in trials} == {"copy0"}  # the first word on a number
    assert spent == 50.0 and run_id == "r1"
    assert list(journal.references()) == [(0, 1)]
    assert sorted(journal.group_seconds().values()) == [20.0, 30.0]


def test_a_damaged_line_is_skipped_and_an_older_line_without_checksum_is_read(tmp_path, caplog):
    journal = TuneJournal(tmp_path, "k-s")
    _trial(journal, 0, 0)
    _trial(journal, 1, 0)
    lines = journal.path.read_text().splitlines()
    record = json.loads(lines[1])
    record["compiler"] = "tampered"  # its checksum no longer matches
    old = {"kind": "spent", "seconds": 5.0}  # written before lines had checksums
    torn = lines[0][: len(lines[0]) // 2]
    journal.path.write_text("\n".join([lines[0], json.dumps(record), json.dumps(old), torn]) + "\n")
    trials, spent, _ = journal.load()
    assert [t.number for t in trials] == [0]
    assert spent == 5.0
    assert "2 damaged line(s) skipped" in caplog.text


def test_the_same_search_into_another_store_is_another_journal():
    assert TuneJournal.name_for("k", "sqlite:///a.db") != TuneJournal.name_for(
        "k", "sqlite:///b.db"
    )
    assert TuneJournal.name_for("k", "sqlite:///a.db") == TuneJournal.name_for(
        "k", "sqlite:///a.db"
    )
