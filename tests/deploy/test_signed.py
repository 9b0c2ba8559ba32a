"""Deploy only what a trusted producer signed: records signed with OpenSSF model-signing where
they were measured, verified against the user's trusted producers, ranked on the signed
figures. The unit tests sign into a real MLflow store (SQLite); the attacks are planted with
MLflow's client, as a writer of the experiment would, on a copy of a real tiny benchmark's
store (signed with the suite's key, tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlflow
import pytest
from deploy_support import cli
from trust_support import (
    EXPERIMENT,
    cell_run,
    clone_store,
    download_engine,
    rewrite_manifest,
    sha256,
)

from mlflow_ngraph import keys
from mlflow_ngraph.errors import NgraphError
from mlflow_ngraph.tracking import index
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.tracking.provenance import (
    Producer,
    fetch_signed,
    record_artifact,
    signature_artifact,
)

SUITE_KEY = os.environ["MLFLOW_NGRAPH_SIGNING_KEY"]


# --- keys and signed records, on a real store ---------------------------------------------
@pytest.fixture
def producer(tmp_path, monkeypatch):
    """A fresh home's own key pair (made on first use, as a producer's is)."""
    monkeypatch.delenv(keys.ENV_SIGNING_KEY, raising=False)
    monkeypatch.delenv(keys.ENV_TRUSTED, raising=False)
    home = tmp_path / "alice"
    return home, Producer(keys.ensure_key(home, name="alice@lab"))


@pytest.fixture
def file_store(tracking_uri):
    client = mlflow.MlflowClient(tracking_uri)
    experiment = client.create_experiment("signed")
    return client, experiment


RESULT = {"status": "OK", "metrics": {"throughput": 120.5, "valid": 1.0}, "engine_dir": None}
DESCRIPTION = {"params": {"model": "conv_block", "model.width": 16, "compiler": "onnxruntime"},
               "tags": {S.T_DEVICE: "cpu", "mlflow.user": "ignored"}}  # fmt: skip


def test_a_key_is_made_once_trusted_by_its_home_and_travels_as_one_line(producer):
    home, signer = producer
    assert oct(keys.private_path(home).stat().st_mode)[-3:] == "600"
    assert keys.ensure_key(home) == keys.private_path(home)  # made once
    line = signer.public.line()
    assert line.startswith(keys.KIND + " ") and line.endswith(" alice@lab")
    assert keys.parse_line(line) == signer.public
    assert signer.public.fingerprint in keys.trusted_keys(home)
    with pytest.raises(NgraphError, match="not a public key line"):
        keys.parse_line("ssh-ed25519 AAAA bob")
    with pytest.raises(NgraphError, match="not a public key"):
        keys.parse_line(f"{keys.KIND} bm90IGEga2V5 bob")


def test_a_signed_record_verifies_for_its_own_run_and_batch_size_only(producer, file_store,
                                                                      tmp_path):  # fmt: skip
    home, signer = producer
    client, experiment = file_store
    run = client.create_run(experiment).info.run_id
    other = client.create_run(experiment).info.run_id
    signer.sign(client, run, experiment, 8, RESULT, DESCRIPTION)
    trusted = keys.trusted_keys(home)
    got = fetch_signed(client, run, 8, trusted, tmp_path / "a")
    assert got.signer.name == "alice@lab" and got.metrics["throughput"] == 120.5
    assert got.record["params"]["model.width"] == "16" and got.record["batch_size"] == 8
    assert "mlflow.user" not in got.record["environment"]  # a claim, not signed
    # a key the reader does not hold
    with pytest.raises(NgraphError, match="not one you trust") as refused:
        fetch_signed(client, run, 8, {}, tmp_path / "b")
    assert signer.public.short in str(refused.value) and "alice@lab" in str(refused.value)
    # replayed onto another batch size of the run, and onto another run
    folder = tmp_path / "copy"
    for name in (record_artifact(8), signature_artifact(8)):
        client.download_artifacts(run, name, str(folder))
    for b, target in ((2, run), (8, other)):
        staged = tmp_path / f"stage-{b}-{target}"
        staged.mkdir()
        shutil.copy(folder / "bs8.json", staged / f"bs{b}.json")
        shutil.copy(folder / "bs8.sig", staged / f"bs{b}.sig")
        client.log_artifacts(target, str(staged), "ngraph/signed")
        with pytest.raises(NgraphError, match="copied here"):
            fetch_signed(client, target, b, trusted, tmp_path / f"c{b}")
    # one figure changed in the signed record itself
    record = json.loads((folder / "bs8.json").read_text())
    record["metrics"]["throughput"] = 9999.0
    (folder / "bs8.json").write_text(json.dumps(record))
    client.log_artifacts(run, str(folder), "ngraph/signed")
    with pytest.raises(NgraphError, match="altered after signing"):
        fetch_signed(client, run, 8, trusted, tmp_path / "d")
    # never signed
    with pytest.raises(NgraphError, match="not signed"):
        fetch_signed(client, other, 1, trusted, tmp_path / "e")


def test_a_removed_key_is_no_longer_trusted(producer, tmp_path):
    home, signer = producer
    shared = tmp_path / "team_keys"
    assert keys.add_trusted(shared, signer.public)
    assert not keys.add_trusted(shared, signer.public)  # once
    assert signer.public.fingerprint in keys.trusted_keys(tmp_path / "bob", shared)
    keys.remove_trusted(shared, "alice@lab")
    assert signer.public.fingerprint not in keys.trusted_keys(tmp_path / "bob", shared)
    with pytest.raises(NgraphError, match="holds no key named"):
        keys.remove_trusted(shared, "alice@lab")


# --- attacks on a copy of a real benchmark's store ------------------------------------------
@pytest.fixture
def store(tiny_store, tmp_path):
    from mlflow.tracking._tracking_service import utils

    uri = clone_store(tiny_store, tmp_path / "store", skip_home=True)
    yield uri, mlflow.tracking.MlflowClient(uri)
    utils._artifact_repos_cache.clear()


def _pull(uri, out, *extra, env=None):
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "-o", str(out), "--tracking-uri", uri, env=env)


def _reindex(client, run) -> None:
    """The parent's results index made anew from the store, as the tool writes it (what a
    writer who changed the runs does so that compare and pull read the change)."""
    parent = run.data.tags["mlflow.parentRunId"]
    cells = client.search_runs([run.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    index.write(client, parent, index.snapshot(client, [r.info.run_id for r in cells]))


def _now() -> int:
    """A metric's timestamp that makes it the latest value (MLflow's latest: highest step,
    then newest time)."""
    import time

    return int(time.time() * 1000) + 60_000


def _chose(done) -> str:
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("chose")]
    return line


def test_a_batch_size_planted_on_a_colleagues_run_is_refused(store, tmp_path):
    """New params, metrics, tags and an engine folder for bs3 on a genuine run, the index
    refreshed: no trusted producer signed bs3, and a signed record copied there names bs1."""
    uri, client = store
    run = cell_run(client, "onnxruntime")
    rid = run.info.run_id
    engine = download_engine(client, rid, 1, tmp_path / "dl")
    rewrite_manifest(engine, batch_size=3)
    digest = sha256(engine / "manifest.json")
    metrics = {k.replace(".bs1", ".bs3"): v * (100 if k.startswith("throughput") else 1)
               for k, v in run.data.metrics.items() if k.endswith(".bs1")}  # fmt: skip
    tags = {k.replace(".bs1", ".bs3"): v for k, v in run.data.tags.items() if k.endswith(".bs1")}
    from mlflow.entities import Metric, Param, RunTag

    client.log_batch(
        rid,
        metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
        params=[Param("engine.bs3.manifest_sha256", digest)],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    client.log_artifacts(rid, str(engine), "engines/bs3")
    _reindex(client, run)
    done = _pull(uri, tmp_path / "out", "--compiler", "onnxruntime", "--batch-size", "3")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "bs3: not signed by a producer you trust: it is not signed" in done.stdout
    assert not (tmp_path / "out").exists()
    # the genuine bs1 record and signature copied onto bs3
    copied = tmp_path / "copied"
    copied.mkdir()
    for name, to in ((record_artifact(1), "bs3.json"), (signature_artifact(1), "bs3.sig")):
        shutil.copy(client.download_artifacts(rid, name, str(tmp_path / "sig")), copied / to)
    client.log_artifacts(rid, str(copied), "ngraph/signed")
    done = _pull(uri, tmp_path / "out", "--compiler", "onnxruntime", "--batch-size", "3")
    assert done.returncode == 2 and "copied here" in done.stdout


def test_rewritten_figures_and_marks_do_not_change_the_choice(store, tmp_path):
    """The slower engine's throughput times 100 and its stability set STABLE in the store:
    pull ranks on the signed figures, says the store was altered, and chooses as before."""
    uri, client = store
    before = _chose(_pull(uri, tmp_path / "a", "--batch-size", "1"))
    runs = {c: cell_run(client, c) for c in ("onnxruntime", "torchscript")}
    slower = next(c for c, r in runs.items() if r.info.run_id not in before)
    run = runs[slower]
    from mlflow.entities import Metric, RunTag

    client.log_batch(
        run.info.run_id,
        metrics=[Metric("throughput.bs1", run.data.metrics["throughput.bs1"] * 100, _now(), 1)],
        tags=[RunTag(f"{S.T_STABILITY}.bs1", S.STABILITY_STABLE)],
    )
    _reindex(client, run)
    done = _pull(uri, tmp_path / "b", "--batch-size", "1")
    assert _chose(done) == before
    (said,) = [line for line in done.stdout.splitlines() if line.startswith("tampering")]
    assert run.info.run_id in said and "throughput" in said and "signed" in said


def test_relabelled_model_params_are_refused(store, tmp_path):
    """The index's records re-logged with model.width=32: the signed record says 8."""
    uri, client = store
    run = cell_run(client, "onnxruntime")
    parent = run.data.tags["mlflow.parentRunId"]
    records = index.read(client, parent)
    for record in records:
        if "model.width" in record["params"]:
            record["params"]["model.width"] = "32"
    index.write(client, parent, records)
    model = "conv_block:width=32,depth=1,image_size=32"
    done = cli("pull", "-e", EXPERIMENT, "--device", "cpu", "--model", model, "-o",
               str(tmp_path / "out"), "--tracking-uri", uri)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "the store says model" in done.stdout and "width=8" in done.stdout
    assert "the store was altered" in done.stdout


def test_an_unknown_producer_is_refused_until_trusted_or_allowed(store, tmp_path):
    """A user whose own key is not the producer's: refused with the key and how to trust
    it; trusted with 'keys add', pulled; with --allow-unsigned, every line says so."""
    uri, _ = store
    env = {"MLFLOW_NGRAPH_HOME": str(tmp_path / "bob"),
           keys.ENV_SIGNING_KEY: str(tmp_path / "bob" / "keys" / "producer.pem")}  # fmt: skip
    done = _pull(uri, tmp_path / "out", "--batch-size", "1", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    producer_key = keys.public_of(Path(SUITE_KEY))
    assert producer_key.short in error and "keys add" in error and "--allow-unsigned" in error
    allowed = _pull(uri, tmp_path / "out", "--batch-size", "1", "--allow-unsigned", env=env)
    chose = _chose(allowed)
    assert "(UNSIGNED)" in chose and "UNSIGNED: it is signed by key" in chose
    added = cli("keys", "add", producer_key.line(), "--name", "lab-runner", env=env)
    assert added.returncode == 0, added.stderr
    done = _pull(uri, tmp_path / "trusted", "--batch-size", "1", env=env)
    assert "signed by lab-runner" in _chose(done)
    source = json.loads((tmp_path / "trusted" / "source.json").read_text())
    assert source["signed_by"] == "lab-runner"
    ran = cli("run-engine", str(tmp_path / "trusted"), "--trust-code", env=env)
    assert ran.returncode == 0 and "signed by lab-runner" in ran.stdout, ran.stderr[-2000:]
    # the pulled folder's record changed after the pull: its signature no longer verifies
    record = tmp_path / "trusted" / "provenance.json"
    record.write_text(record.read_text().replace('"batch_size": 1', '"batch_size": 1 '))
    ran = cli("run-engine", str(tmp_path / "trusted"), "--trust-code", env=env)
    assert ran.returncode == 2 and "altered after signing" in ran.stderr
    # revoked: removed from the trusted producers, refused again
    removed = cli("keys", "remove", "lab-runner", env=env)
    assert removed.returncode == 0, removed.stderr
    done = _pull(uri, tmp_path / "again", "--batch-size", "1", env=env)
    assert done.returncode == 2 and "not one you trust" in done.stderr


def test_resign_signs_only_what_the_home_measured_and_the_store_still_pins(
    tiny_store, store, tmp_path
):
    """Records removed (a store from before signing), one engine's manifest altered: the
    home's journal signs every result again with its own figures, except the altered one."""
    from mlflow_ngraph.tracking.journal import Journal
    from mlflow_ngraph.tracking.resign import resign_journal

    uri, client = store
    runs = {c: cell_run(client, c) for c in ("onnxruntime", "torchscript")}
    for run in runs.values():
        shutil.rmtree(Path(run.info.artifact_uri.removeprefix("file://")) / "ngraph" / "signed")
    altered = Path(runs["torchscript"].info.artifact_uri.removeprefix("file://"))
    manifest = altered / "engines" / "bs2" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"batch_size": 2', '"batch_size":  2'))
    (path,) = sorted((tiny_store / "home" / "journals").glob("*.jsonl"))
    journal = Journal(path)
    experiment = runs["onnxruntime"].info.experiment_id
    done = resign_journal(client, journal, experiment, Producer(Path(SUITE_KEY)))
    assert done.signed >= 5  # identity's, onnxruntime's and torchscript's bs1
    assert any("bs2: its engine's manifest is not the one its run pinned" in s
               for s in done.skipped)  # fmt: skip
    trusted = {keys.public_of(Path(SUITE_KEY)).fingerprint: keys.public_of(Path(SUITE_KEY))}
    rid = runs["onnxruntime"].info.run_id
    got = fetch_signed(client, rid, 1, trusted, tmp_path / "r")
    state = next(s for s in journal.cells.values() if s.run_id == rid)
    assert got.metrics["throughput"] == state.measured[1]["metrics"]["throughput"]
    assert (
        got.record["engine_manifest_sha256"]
        == runs["onnxruntime"].data.params["engine.bs1.manifest_sha256"]
    )
    with pytest.raises(NgraphError, match="not signed"):
        fetch_signed(client, runs["torchscript"].info.run_id, 2, trusted, tmp_path / "t")


def test_compare_verified_shows_the_signed_figures_only(store, tmp_path):
    uri, client = store
    run = cell_run(client, "onnxruntime")
    signed = run.data.metrics["throughput.bs1"]
    from mlflow.entities import Metric

    client.log_batch(run.info.run_id, metrics=[Metric("throughput.bs1", 123456.0, _now(), 1)])
    _reindex(client, run)
    args = ["compare", "-e", EXPERIMENT, "--table", "cells", "--format", "csv", "--tracking-uri"]
    plain = cli(*args, uri)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert _throughput(plain.stdout, "onnxruntime", 1) == 123456.0
    verified = cli(*args, uri, "--verified")
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert _throughput(verified.stdout, "onnxruntime", 1) == pytest.approx(signed, rel=1e-6)
    assert "differ from the signed ones" in verified.stderr
    env = {"MLFLOW_NGRAPH_HOME": str(tmp_path / "bob"),
           keys.ENV_SIGNING_KEY: str(tmp_path / "bob" / "producer.pem")}  # fmt: skip
    refused = cli(*args, uri, "--verified", env=env)
    assert refused.returncode == 2 and "no producer you trust signed them" in refused.stderr


def _throughput(csv: str, compiler: str, b: int) -> float:
    import io

    import pandas as pd

    frame = pd.read_csv(io.StringIO(csv))
    (value,) = frame[(frame["compiler"] == compiler) & (frame["batch_size"] == b)]["throughput"]
    return float(value)


def test_a_settle_cut_short_is_sent_and_signed_at_the_next_contact(
    producer, file_store, tmp_path, monkeypatch
):
    """The settle's two kill windows, stopped in-process (the point raises where a kill
    would stop): a settled interval journaled and not sent, and one sent and not signed
    (the store's figures then differ from the signed ones: ``pull`` says tampering). The
    next contact's replay sends and signs it: the run, the journal and the signed record
    agree, and nothing is sent twice after."""
    from mlflow_ngraph import faultpoint
    from mlflow_ngraph.tracking.journal import Journal
    from mlflow_ngraph.tracking.recorder import CellRecorder

    home, signer = producer
    client, experiment = file_store
    recorder = CellRecorder(client, experiment, "", False, signer)
    low, high = S.M_THROUGHPUT_RERUN_LOW, S.M_THROUGHPUT_RERUN_HIGH
    first = {**RESULT, "metrics": {**RESULT["metrics"], low: 100.0, high: 140.0}}
    settled = {**first, "metrics": {**first["metrics"], low: 90.0, high: 150.0}, "rerun": "5%"}
    for point in ("rerun_journaled", "rerun_unsigned"):
        journal = Journal(tmp_path / f"{point}.jsonl")
        run = client.create_run(experiment).info.run_id
        journal.set_run("c", run)
        journal.describe("c", "c", DESCRIPTION["params"], DESCRIPTION["tags"], "")
        journal.measured("c", 8, first)
        recorder.record(run, 8, first, journal.cell("c").description)
        journal.logged("c", 8)
        journal.closed("c")
        # the settle (ResultSink.rerun's order), stopped at the point
        monkeypatch.setenv(faultpoint.ENV, f"{point}:erofs")
        faultpoint._seen.clear()
        with pytest.raises(OSError):
            journal.settled("c", 8, settled)
            faultpoint.point("rerun_journaled")
            recorder.rerun(run, 8, settled, journal.cell("c").description)
        monkeypatch.delenv(faultpoint.ENV)
        signed = fetch_signed(client, run, 8, keys.trusted_keys(home), tmp_path / point / "a")
        assert signed.metrics[low] == 100.0  # still the first one's signature
        again = Journal(journal.path)  # the next command reads the journal afresh
        assert again.cell("c").settling == {8} and again.cell("c").unsent()
        assert recorder.replay(again, "c", run) == 0  # no result sent again, only its interval
        assert not again.cell("c").settling and not again.cell("c").unsent()
        held = client.get_run(run).data
        signed = fetch_signed(client, run, 8, keys.trusted_keys(home), tmp_path / point / "b")
        assert held.metrics[f"{low}.bs8"] == signed.metrics[low] == 90.0
        assert held.metrics[f"{high}.bs8"] == signed.metrics[high] == 150.0
        assert held.tags[f"{S.T_RERUN}.bs8"] == "5%"
