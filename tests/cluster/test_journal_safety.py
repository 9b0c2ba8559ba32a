"""The journal against damage and against a store that is not the one it recorded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking.journal import Journal
from tests._support import PYTHON, TINY, in_threads

RESULT = {"metrics": {"throughput": 10.0}, "status": "OK"}


def _write(path: Path) -> Journal:
    journal = Journal(path)
    journal.set_run("a", "run-a")
    journal.measured("a", 1, RESULT)
    journal.logged("a", 1)
    journal.measured("a", 2, RESULT)
    journal.logged("a", 2)
    return journal


def test_a_garbled_record_is_skipped_without_its_neighbours(tmp_path, caplog):
    path = tmp_path / "j.jsonl"
    _write(path)
    lines = path.read_text().splitlines()
    # a flipped digit in "logged bs1": trusting it would skip batch 4, never measured
    lines[2] = lines[2].replace('"batch_size": 1', '"batch_size": 4')
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="mlflow_ngraph"):
        journal = Journal(path)
    assert journal.cell("a").measured.keys() == {1, 2}
    assert journal.cell("a").logged == {2}  # bs1 is sent again, bs4 not taken as done
    assert not journal.done("a", 4) and not journal.done("a", 1) and journal.done("a", 2)
    assert [n for n, _ in journal.skipped] == [3]
    assert "skipped 1 damaged record" in caplog.text and "checksum" in caplog.text


def test_a_torn_last_line_never_swallows_the_next_record(tmp_path):
    path = tmp_path / "j.jsonl"
    _write(path)
    text = path.read_text()
    path.write_text(text[: len(text) - 25])  # a kill in the middle of the last write
    journal = Journal(path)
    assert journal.cell("a").logged == {1} and len(journal.skipped) == 1
    journal.logged("a", 2)  # the next invocation appends after the torn line
    again = Journal(path)
    assert again.cell("a").logged == {1, 2}
    assert len(again.skipped) == 1


def test_a_record_glued_to_a_torn_one_is_recovered(tmp_path):
    path = tmp_path / "j.jsonl"
    _write(path)
    lines = path.read_text().splitlines()
    glued = lines[3][:30] + lines[4]  # an old writer appended to the torn line
    path.write_text("\n".join([*lines[:3], glued]) + "\n")
    journal = Journal(path)
    assert journal.cell("a").logged == {1, 2}
    assert len(journal.skipped) == 1


def test_lines_that_are_not_records_are_skipped(tmp_path):
    path = tmp_path / "j.jsonl"
    _write(path)
    with open(path, "ab") as handle:
        handle.write(b'\x00\xff\xfe\n[1, 2]\n{"v": 1, "kind": "logged", "cell": "b"}\n')
    journal = Journal(path)
    assert len(journal.skipped) == 3
    assert "b" not in journal.cells


# --- stale journals ------------------------------------------------------------------------
def _store(tmp_path: Path, name: str = "mlflow.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _cell_journal(home, uri) -> tuple[Journal, str]:
    client = ml.connect(uri)
    exp = ml.ensure_experiment(client, "e")
    run_id = client.create_run(exp).info.run_id
    journal = Journal.for_target(home, uri, "e", "cpu")
    journal.set_run("a", run_id)
    journal.measured("a", 1, RESULT)
    journal.logged("a", 1)
    return journal, run_id


@pytest.mark.e2e
def test_a_recreated_sqlite_store_starts_the_journal_afresh(tmp_path, home):
    uri = _store(tmp_path)
    _cell_journal(home, uri)
    (tmp_path / "mlflow.db").unlink()
    journal = Journal.for_target(home, uri, "e", "cpu")
    assert not journal.done("a", 1) and not journal.cells
    assert list((home / "journals").glob("*.stale-*.jsonl"))
    ml.ensure_experiment(ml.connect(uri), "e")  # recreated, with a new creation time
    assert not Journal.for_target(home, uri, "e", "cpu").cells


def test_a_recreated_experiment_starts_the_journal_afresh(tmp_path, home):
    uri = _store(tmp_path)
    _cell_journal(home, uri)
    client = ml.connect(uri)
    old = client.get_experiment_by_name("e").experiment_id
    client.rename_experiment(old, "e-old")
    ml.ensure_experiment(client, "e")
    assert not Journal.for_target(home, uri, "e", "cpu").done("a", 1)


def test_a_deleted_cell_run_makes_its_cell_pending(tmp_path, home):
    uri = _store(tmp_path)
    journal, run_id = _cell_journal(home, uri)
    journal.set_run("b", ml.connect(uri).create_run(journal.store["experiment_id"]).info.run_id)
    journal.logged("b", 1)
    assert Journal.for_target(home, uri, "e", "cpu").done("a", 1)  # nothing changed
    ml.connect(uri).delete_run(run_id)
    again = Journal.for_target(home, uri, "e", "cpu")
    assert not again.done("a", 1) and again.cell("a").run_id is None
    assert again.done("b", 1)


@pytest.mark.e2e
def test_a_rerun_after_the_store_was_deleted_measures_again(tmp_path, home):
    """``rm mlflow.db`` and the same command: the new store gets every result."""
    import os
    import subprocess

    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    args = [PYTHON, "-m", "mlflow_ngraph", "benchmark", *TINY, "--compiler", "identity"]
    env = {**os.environ, "MLFLOW_NGRAPH_HOME": str(home), "MLFLOW_TRACKING_URI": uri}
    assert subprocess.run(args, env=env, capture_output=True).returncode == 0
    (tmp_path / "mlflow.db").unlink()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "starting afresh" in done.stderr
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("mlflow-ngraph")
    cells = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'cell'")
    assert len(cells) == 1
    assert {"throughput.bs1", "throughput.bs2"} <= set(cells[0].data.metrics)


# --- concurrency and the store itself -------------------------------------------------------
def test_twenty_clients_creating_one_experiment_get_one(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    ml.connect(uri)
    ids = in_threads(20, lambda i: ml.ensure_experiment(MlflowClient(uri), "shared"))
    assert len(set(ids)) == 1


def test_four_clients_creating_one_cell_run_get_one(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = _store(tmp_path)
    exp = ml.ensure_experiment(ml.connect(uri), "e")
    ids = in_threads(
        4, lambda i: ml.cell_run(MlflowClient(uri), exp, "parent", "key-1", "cell", None)
    )
    assert len(set(ids)) == 1
    runs = MlflowClient(uri).search_runs([exp], "tags.`ngraph.cell_key` = 'key-1'")
    assert [r.info.run_id for r in runs] == [ids[0]]


def test_a_half_made_sqlite_store_is_one_line_with_the_fix(tmp_path, run_cli):
    import sqlite3

    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:  # what a kill during table creation leaves
        conn.execute("CREATE TABLE experiments (experiment_id INTEGER)")
    uri = f"sqlite:///{db}"
    code, out, err = run_cli("benchmark", *TINY, "--compiler", "identity", "--tracking-uri", uri)
    assert code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "half-made" in errors[0] and f"rm {db}" in errors[0]


def test_a_store_whose_writer_was_killed_mid_transaction_opens(tmp_path, empty_store):
    """kill -9 in the middle of a write leaves a hot journal beside the store; the next run
    rolls it back and opens the store (a read-only check called it not an sqlite database)."""
    import shutil
    import subprocess
    import sys

    db = tmp_path / "mlflow.db"
    shutil.copyfile(empty_store, db)
    killed = (
        "import os, signal, sqlite3\n"
        f"db = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
        "db.execute('PRAGMA cache_size=1')\n"  # the transaction spills into the file
        "db.execute('BEGIN IMMEDIATE')\n"
        "db.execute('CREATE TABLE pad (x BLOB)')\n"
        "for i in range(200):\n"
        "    db.execute('INSERT INTO pad VALUES (randomblob(4000))')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", killed], check=False)
    assert (tmp_path / "mlflow.db-journal").stat().st_size > 0
    client = ml.connect(f"sqlite:///{db}")
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert not (tmp_path / "mlflow.db-journal").exists()  # rolled back: the pad is gone


def test_a_new_sqlite_store_is_created_whole(tmp_path):
    uri = _store(tmp_path, "sub/new.db")
    ml.connect(uri)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["new.db"]
    ml.connect(uri)  # and opens as a complete store


def test_credentials_are_redacted():
    text = "-> http://alice:s3cr%40t@host:5000/x and postgresql://u:pw@db/m; http://h/"
    assert ml.redact_uri(text) == (
        "-> http://alice:***@host:5000/x and postgresql://u:***@db/m; http://h/"
    )


def test_a_refused_login_is_told_by_its_status_not_by_a_401_in_a_port_or_an_id():
    shown = "http://127.0.0.1:34401"
    for text in (
        "API request to endpoint /api/2.0/mlflow/runs/get failed with error code 401 != 200",
        "UNAUTHENTICATED: You are not authenticated. Please see the docs",
        "401 Unauthorized",
    ):
        assert ml.login_refused(text, shown) is not None, text
    for text in (
        "API request to http://127.0.0.1:34401/api/2.0/mlflow/runs/get failed: Max retries",
        "run 5c401e2f9a not found",
        "error code 503 != 200 (http://h:1401/x)",
    ):
        assert ml.login_refused(text, shown) is None, text


def test_http_retries_are_bounded(monkeypatch):
    """A server that answers every request with 503: each API request is tried once and
    retried MLFLOW_HTTP_REQUEST_MAX_RETRIES (2) times, no more, and the store is given up on
    in seconds; an address that does not answer at all is 'unreachable'."""
    import http.server
    import os
    import threading
    import time

    for name in ml.HTTP_LIMITS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(Exception, match="unreachable"):
        ml.connect("http://127.0.0.1:9")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"
    hits: list[str] = []

    class Busy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(503)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match="cannot be opened"):
            ml.connect(f"http://127.0.0.1:{server.server_address[1]}")
        seconds = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    api = [h for h in hits if h.startswith("/api/")]
    assert len(api) == 1 + 2, hits  # the first try and two retries
    assert len(set(api)) == 1, hits  # of one request
    assert seconds < 60, seconds  # backoff 1 s, 2 s: not MLflow's default of minutes


def test_a_result_read_back_from_the_journal_is_recorded_as_the_record_it_is_given(tmp_path):
    # a result read back holds a kind, cell, batch size and time of its own: journaling it
    # again (a re-measure, a settle) must record it under the new ones, never the old
    path = tmp_path / "j.jsonl"
    journal = _write(path)
    old = journal.cell("a").measured[1]
    journal.measured("b", 4, old)
    journal.logged("b", 4)
    journal.settled("b", 4, journal.cell("b").measured[4])
    again = Journal(path)
    assert again.cell("b").measured.keys() == {4} and again.cell("b").settling == {4}
    assert again.cell("b").measured[4]["kind"] == "settled"
    assert again.cell("b").measured[4]["time"] > old["time"]
    assert again.cell("a").measured.keys() == {1, 2} and again.cell("a").settling == set()
    assert not again.skipped
