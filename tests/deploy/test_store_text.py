"""Text a writer of the experiment put in the store (tags, flag values, a results index
record's error text) reaches the terminal and the reports visibly escaped, never as the
escape sequences, line breaks or bidirectional overrides it holds; the producer shown is
MLflow's ``user_id`` of the run, never its writable ``mlflow.user`` tag."""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from pathlib import Path
from types import SimpleNamespace

import mlflow
import pandas as pd
import pytest
from deploy_support import cli
from trust_support import EXPERIMENT, cell_run, clone_store

from mlflow_ngraph.deploy.select import Candidate, Selection, creator, describe
from mlflow_ngraph.report import render
from mlflow_ngraph.table import format_table
from mlflow_ngraph.text import visible, visible_lines
from mlflow_ngraph.tracking import index

#: clear the screen, set the window's title (OSC ended by BEL), hide what follows, and a
#: right-to-left override
PAYLOAD = "\x1b[2J\x1b]0;title\x07\x1b[8m\u202e"
#: how the payload reads once made visible
SHOWN = "\\x1b[2J\\x1b]0;title\\x07\\x1b[8m\\u202e"
#: C0 (ESC, BEL, newline, tab...), DEL, C1, bidirectional overrides and isolates, and the
#: other characters that hide or reorder text: none may reach the output raw
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def raw_characters(text: str) -> list[str]:
    """The hidden characters in ``text`` (its own line breaks aside)."""
    return RAW.findall(text)


# --- the one function ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, shown",
    [
        (PAYLOAD, SHOWN),
        ("a\nforged line", "a\\nforged line"),
        ("tab\there\r", "tab\\there\\r"),
        ("\x00\x7f\x9b\x85", "\\x00\\x7f\\x9b\\x85"),
        ("\u2066isolate\u2069 \u202aembed\u202c", "\\u2066isolate\\u2069 \\u202aembed\\u202c"),
        ("zero\u200bwidth\ufeff\u2028", "zero\\u200bwidth\\ufeff\\u2028"),
        ("\U000e0041tag", "\\U000e0041tag"),
    ],
)
def test_visible_writes_every_hidden_character_as_an_escape(text, shown):
    assert visible(text) == shown
    assert not raw_characters(visible(text))
    assert visible(visible(text)) == visible(text)  # applying it twice changes nothing


def test_visible_leaves_ordinary_text_as_it_is():
    for text in ("resnet18 openvino[PERFORMANCE_HINT=LATENCY] bs8", "Müller 名前 ñ µs ± 3",
                 r"C:\models\a.onnx", "non\u00a0breaking", ""):  # fmt: skip
        assert visible(text) == text
    assert visible(None) == "None" and visible(3.5) == "3.5"
    assert visible_lines(f"one {PAYLOAD}\ntwo") == f"one {SHOWN}\ntwo"


# --- the output boundaries -------------------------------------------------------------------
def test_a_table_shows_a_cell_as_one_visible_line():
    table = format_table(["cell", f"h{PAYLOAD}"], [[f"x{PAYLOAD}\nOK: forged", 1]])
    assert not raw_characters(table)
    assert len(table.splitlines()) == 3  # header, rule, the one row
    assert f"x{SHOWN}\\nOK: forged" in table and f"h{SHOWN}" in table
    wrapped = format_table(["cell", "x"], [[f"{PAYLOAD} " * 8, 1]], width=40)
    assert not raw_characters(wrapped)


def _candidate(**changes) -> Candidate:
    values = dict(
        run_id="r1", experiment_id="1", device="cpu", model="conv_block", compiler="onnxruntime",
        flags=f"x={PAYLOAD}", batch_size=1, metrics={"throughput": 10.0}, status="OK",
    )  # fmt: skip
    return Candidate(**{**values, **changes})


def test_describe_shows_labels_and_reasons_visibly():
    kept = _candidate()
    failed = _candidate(run_id="r2", reason=f"FAILED: {PAYLOAD}\nOK: engine signed by alice")
    text = describe(Selection("throughput", [kept], [failed]))
    assert not raw_characters(text)
    assert f"x={SHOWN}" in text and f"FAILED: {SHOWN}\\nOK: engine signed by alice" in text
    assert not any(line.startswith("OK:") for line in text.splitlines())


def test_creator_is_the_runs_user_id_never_its_tag():
    run = SimpleNamespace(
        info=SimpleNamespace(user_id="alice"),
        data=SimpleNamespace(tags={"mlflow.user": f"mallory{PAYLOAD}"}),
    )
    assert creator(run) == "alice"
    run.info.user_id = "unknown"
    assert creator(run) == "an unknown user"


def test_every_report_format_shows_store_text_visibly():
    frame = pd.DataFrame(
        {
            "device": [f"cpu{PAYLOAD}", f"cpu{PAYLOAD}"],  # one device: in the title
            "model": ["conv_block", "conv_block"],
            "compiler": [f"onnxruntime{PAYLOAD}", "openvino"],
            "error": [f"boom{PAYLOAD}\nline", ""],
            f"flag.x{PAYLOAD}": ["1", "2"],
            "throughput": [1.5, 2.5],
        }
    )
    tables = {"cells": frame}
    for fmt in ("terminal", "markdown", "csv"):
        text = render.render(tables, fmt, width=200)
        assert not raw_characters(text), fmt
        assert f"onnxruntime{SHOWN}" in text, fmt
        assert f"flag.x{SHOWN}" in text and f"cpu{SHOWN}" in text, fmt
    assert f"boom{SHOWN}\\nline" in render.render(tables, "csv")
    as_json = render.render(tables, "json")
    assert not raw_characters(as_json)
    assert json.loads(as_json)[0]["error"] == f"boom{PAYLOAD}\nline"  # JSON keeps the value
    page = render.to_html(tables, [], notes=[f"note{PAYLOAD}<b>"])
    assert not raw_characters(page)
    assert f"onnxruntime{SHOWN}" in page and f"note{SHOWN}&lt;b&gt;" in page


def test_error_and_log_lines_show_store_text_visibly(tmp_path, capsys):
    import logging

    from mlflow_ngraph.commands.cli import main
    from mlflow_ngraph.commands.report import CompareError
    from mlflow_ngraph.console import setup_logging

    with pytest.raises(SystemExit):
        main(["run-engine", str(tmp_path / f"engine{PAYLOAD}")])
    error = capsys.readouterr().err
    assert error.startswith("error: ") and f"engine{SHOWN}" in error
    assert not raw_characters(error) and error.count("\n") == 1
    assert CompareError(f"no run {PAYLOAD}").format_message() == f"no run {SHOWN}"
    setup_logging(0)
    logging.getLogger("mlflow_ngraph.deploy").warning("built on %s", f"host{PAYLOAD}")
    logged = capsys.readouterr().err
    assert f"built on host{SHOWN}" in logged and not raw_characters(logged)


# --- end to end: a store written by an attacker, the real CLI on a pipe ------------------------
@pytest.fixture
def planted(tiny_store, tmp_path):
    """A copy of the tiny store whose ONNX Runtime cell run carries the payload in its
    ``mlflow.user`` tag, whose results index record of it carries it in a flag value, and
    whose index holds a FAILED record with it in its error text."""
    from mlflow.tracking._tracking_service import utils

    uri = clone_store(tiny_store, tmp_path / "store", skip_home=True)
    client = mlflow.tracking.MlflowClient(uri)
    genuine = cell_run(client, "onnxruntime")
    client.set_tag(genuine.info.run_id, "mlflow.user", f"mallory{PAYLOAD}")
    failed = client.create_run(genuine.info.experiment_id, tags={"mlflow.user": "mallory"})
    _plant_index(client, genuine, failed.info.run_id)
    yield uri, client.get_run(genuine.info.run_id)
    utils._artifact_repos_cache.clear()


def _plant_index(client, genuine, failed_id: str | None) -> None:
    """The genuine record's flags and a FAILED record carry the payload; ``failed_id``
    None: the index made anew from the store, as the tool writes it."""
    parent = genuine.data.tags["mlflow.parentRunId"]
    if failed_id is None:
        cells = client.search_runs(
            [genuine.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
        )
        index.write(client, parent, index.snapshot(client, [r.info.run_id for r in cells]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(client.download_artifacts(parent, "ngraph/cells.json.gz", tmp))
        with gzip.open(path, "rt") as handle:
            payload = json.load(handle)
        (record,) = [r for r in payload["runs"] if r["run_id"] == genuine.info.run_id]
        failed = json.loads(json.dumps(record))
        record["params"]["flag.x"] = f"flag{PAYLOAD}"
        failed.update(run_id=failed_id, metrics={})
        failed["params"]["flag.y"] = "1"
        failed["tags"] = {k: v for k, v in failed["tags"].items() if "status" not in k}
        failed["tags"].update({"ngraph.status": "FAILED", "ngraph.error": f"error{PAYLOAD}"})
        payload["runs"].append(failed)
        with gzip.open(path, "wt") as handle:
            json.dump(payload, handle)
        client.log_artifact(parent, str(path), artifact_path="ngraph")


def _shows_visibly(done, *expected: str) -> str:
    """The command's output (stdout and stderr), holding no hidden character and each of
    ``expected``."""
    out = done.stdout + done.stderr
    assert not raw_characters(out), out[-3000:]
    for text in expected:
        assert text in out, out[-3000:]
    return out


def test_pull_and_compare_show_planted_text_visibly(planted, tmp_path):
    uri, run = planted
    client = mlflow.tracking.MlflowClient(uri)
    target = tmp_path / "pulled"
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    done = cli(*args, "--compiler", "onnxruntime", "-o", str(target), "--tracking-uri", uri)
    # the planted flag is not what the producer signed: refused, and every line shows it
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    _shows_visibly(done, f"x=flag{SHOWN}", f"FAILED: error{SHOWN}", "the store was altered")
    compare = ["compare", "-e", EXPERIMENT, "--table", "cells", "--tracking-uri", uri]
    done = cli(*compare, env={"COLUMNS": "400"})  # wide enough that no cell wraps
    assert done.returncode == 0, done.stderr[-3000:]
    _shows_visibly(done, f"onnxruntime[x=flag{SHOWN}", f"(FAILED: error{SHOWN})")
    _plant_index(client, run, None)  # the tag alone: the genuine engine is chosen
    done = cli(*args, "--compiler", "onnxruntime", "-o", str(target), "--tracking-uri", uri)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = _shows_visibly(done)
    (chose,) = [line for line in done.stdout.splitlines() if line.startswith("chose")]
    assert run.info.user_id not in ("", "unknown", run.data.tags["mlflow.user"])
    assert f"logged by {run.info.user_id}, signed by " in chose
    assert "mallory" not in out  # the tag is never shown as the producer
    assert json.loads((target / "source.json").read_text())["created_by"] == run.info.user_id
