"""Issue 23 on a real team server: ``mlflow server --app-name basic-auth`` on 127.0.0.1, a
victim and an attacker both with EDIT on one experiment. The attacker plants native code and
changed weights through MLflow's client with their own login; the victim's pull, register
and load refuse them and the payload never runs. Also: the password in the tracking URI is
printed by no command, and a missing permission is one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import mlflow
import pytest
from deploy_support import EXPERIMENT, benchmark, cli
from trust_support import (
    build_payload,
    cell_run,
    download_engine,
    half_weights,
    native_engine_claiming_tvm,
    rewrite_manifest,
)

from mlflow_ngraph.errors import NgraphError
from tests._support import copy_empty_store, free_port

ADMIN = "admin-" + uuid.uuid4().hex[:10]
PASSWORDS = {
    "victim": "Victim-S3cret-" + uuid.uuid4().hex[:8],
    "attacker": "Att-" + uuid.uuid4().hex[:10],
    "reader": "Read-" + uuid.uuid4().hex[:10],
    "stranger": "Str-" + uuid.uuid4().hex[:10],
}
SAFE = {"MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false"}
INDEX = "ngraph/cells.json.gz"


@contextmanager
def as_user(name: str, password: str | None = None):
    """MLflow's client in this process logs in as ``name``."""
    keys = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    before = {k: os.environ.get(k) for k in keys}
    os.environ["MLFLOW_TRACKING_USERNAME"] = name
    os.environ["MLFLOW_TRACKING_PASSWORD"] = password or PASSWORDS[name]
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def env_of(name: str) -> dict:
    return {**SAFE, "MLFLOW_TRACKING_USERNAME": name, "MLFLOW_TRACKING_PASSWORD": PASSWORDS[name]}


@pytest.fixture(scope="module")
def server(tmp_path_factory, empty_store):
    """(URL, the victim's benchmark output) of a basic-auth server holding a tiny benchmark
    the victim ran with the password in the tracking URI and --log-models."""
    pytest.importorskip("flask_wtf", reason="mlflow[auth] (Flask-WTF) is not installed")
    import requests

    tmp = tmp_path_factory.mktemp("trust-server")
    copy_empty_store(empty_store, tmp / "mlflow.db")  # the server's store, made
    ini = tmp / "auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{tmp / 'auth.db'}\nadmin_username = admin\n"
        f"admin_password = {ADMIN}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # as docs/team-server.md advises: a login checked once, not at every request
        "auth_cache_ttl_seconds = 300\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--app-name", "basic-auth",
         "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}", "--artifacts-destination",
         str(tmp / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        env={**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini),
             "MLFLOW_FLASK_SERVER_SECRET_KEY": uuid.uuid4().hex},
        stdout=log, stderr=log, cwd=tmp,
    )  # fmt: skip
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/health", timeout=2).ok:
                break
        except requests.RequestException:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail("the server did not start: " + (tmp / "server.log").read_text()[-2000:])
    try:
        with as_user("admin", ADMIN):
            from mlflow.server import get_app_client
            from mlflow.tracking import MlflowClient

            auth = get_app_client("basic-auth", tracking_uri=url)
            for name, password in PASSWORDS.items():
                auth.create_user(name, password)
            exp = MlflowClient(url).create_experiment(EXPERIMENT)
            auth.grant_user_permission("victim", "experiment", exp, "EDIT")
            auth.grant_user_permission("attacker", "experiment", exp, "EDIT")
            auth.grant_user_permission("reader", "experiment", exp, "READ")
        in_uri = url.replace("http://", f"http://victim:{PASSWORDS['victim']}@")
        done = benchmark(in_uri, tmp / "home", "--log-models",
                         compilers=["identity", "onnxruntime"])  # fmt: skip
        yield url, done
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def pull(url, out, *extra, user="victim"):
    args = ["pull", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block"]
    return cli(*args, *extra, "-o", str(out), "--tracking-uri", url, env=env_of(user))


def one_error(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


def test_the_password_in_the_tracking_uri_is_printed_by_no_command(server, tmp_path):
    # first in the module: the attack tests below alter the engines it registers and pulls
    url, benchmarked = server
    password = PASSWORDS["victim"]
    in_uri = url.replace("http://", f"http://victim:{password}@")
    outputs = [benchmarked.stdout, benchmarked.stderr]
    assert "benchmarking" in benchmarked.stderr + benchmarked.stdout
    base = ["-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--compiler",
            "onnxruntime", "--batch-size", "1", "--tracking-uri", in_uri]  # fmt: skip
    runs = [
        cli("register", *base, "--name", "pw-check", env=SAFE),
        cli("pull", *base, "-o", str(tmp_path / "p"), env=SAFE),
        cli("compare", "--experiment", EXPERIMENT, "--tracking-uri", in_uri, env=SAFE),
    ]
    for result in runs:
        outputs += [result.stdout, result.stderr]
    assert runs[0].returncode == 0 and "registered pw-check" in runs[0].stdout, runs[0].stderr
    assert not [text[:300] for text in outputs if password in text]


def test_a_missing_permission_is_one_line_naming_it(server, tmp_path):
    # before the attack tests below: they alter the engines the reader would register
    url, _ = server
    line = one_error(pull(url, tmp_path / "x", user="stranger"))
    assert "'stranger' lacks the READ permission on experiment 'deploy'" in line
    register = cli("register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block",
                   "--compiler", "onnxruntime", "--tracking-uri", url,
                   env=env_of("reader"))  # fmt: skip
    line = one_error(register)
    assert "'reader' lacks the EDIT permission on experiment 'deploy'" in line


def _one_redacted_line(result, password: str, shown: str, choice: bool = False) -> str:
    """The single line a failed command printed (after the lines of its ``choice``, on
    standard output): no traceback, no password, the store named."""
    everything = result.stdout + result.stderr
    assert result.returncode != 0, everything[-3000:]
    assert "Traceback" not in everything and password not in everything, everything[-3000:]
    output = (result.stderr if choice else everything).strip()
    (line,) = output.splitlines()
    assert shown in line, line
    return line


def test_a_deleted_index_or_engine_file_fails_in_one_line_without_the_password(server, tmp_path):
    # before the attack tests below: it deletes and puts back what they alter
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    url, _ = server
    password = PASSWORDS["victim"]
    in_uri = url.replace("http://", f"http://victim:{password}@")
    shown = url.replace("http://", "http://victim:***@")
    base = ["-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block", "--compiler",
            "onnxruntime", "--batch-size", "1", "--tracking-uri", in_uri]  # fmt: skip
    # a writer of the experiment with MANAGE (a DELETE needs it), through the artifact API
    with as_user("admin", ADMIN):
        client = mlflow.tracking.MlflowClient(url)
        cell = cell_run(client, "onnxruntime")
        parent = client.get_run(cell.data.tags["mlflow.parentRunId"])
        kept = Path(client.download_artifacts(parent.info.run_id, INDEX, str(tmp_path)))
        repo = get_artifact_repository(parent.info.artifact_uri, tracking_uri=url)
        repo.delete_artifacts(INDEX)
    try:
        compare = cli("compare", "--experiment", EXPERIMENT, "--tracking-uri", in_uri, env=SAFE)
        line = _one_redacted_line(compare, password, shown)
        assert "cells.json.gz" in line and "--live" in line
        pulled = cli("pull", *base, "-o", str(tmp_path / "p1"), env=SAFE)
        assert "--live" in _one_redacted_line(pulled, password, shown)
    finally:
        with as_user("admin", ADMIN):
            client.log_artifact(parent.info.run_id, str(kept), artifact_path="ngraph")
    with as_user("admin", ADMIN):
        engine = download_engine(client, cell.info.run_id, 1, tmp_path / "engine")
        (name,) = [p.name for p in engine.iterdir() if p.suffix == ".onnx"]
        runs = get_artifact_repository(cell.info.artifact_uri, tracking_uri=url)
        runs.delete_artifacts(f"engines/bs1/{name}")
    try:
        pulled = cli("pull", *base, "-o", str(tmp_path / "p2"), env=SAFE)
        # what pull checks from the store's listing before it downloads, or the store's answer
        line = _one_redacted_line(pulled, password, "", choice=True)
        assert name in line and ("missing from the store" in line or shown in line), line
    finally:
        with as_user("admin", ADMIN):
            client.log_artifact(cell.info.run_id, str(engine / name), artifact_path="engines/bs1")
    assert cli("pull", *base, "-o", str(tmp_path / "p3"), env=SAFE).returncode == 0


def test_native_code_planted_by_another_writer_does_not_run(server, tmp_path):
    url, _ = server
    marker = tmp_path / "marker"
    payload = build_payload(tmp_path / "build", marker)
    with as_user("attacker"):
        client = mlflow.tracking.MlflowClient(url)
        run = cell_run(client, "onnxruntime")
        folder = download_engine(client, run.info.run_id, 1, tmp_path / "attacker")
        native_engine_claiming_tvm(folder, payload)
        client.log_artifacts(run.info.run_id, str(folder), artifact_path="engines/bs1")
    out = tmp_path / "pulled"
    line = one_error(pull(url, out, "--compiler", "onnxruntime", "--batch-size", "1"))
    assert "the one its run recorded" in line
    register = cli("register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block",
                   "--compiler", "onnxruntime", "--batch-size", "1", "--tracking-uri", url,
                   env=env_of("victim"))  # fmt: skip
    assert "the one its run recorded" in one_error(register)
    assert not out.exists() and not marker.exists()


def test_changed_weights_planted_by_another_writer_are_refused(server, tmp_path):
    url, _ = server
    victim = env_of("victim")
    done = cli("register", "-e", EXPERIMENT, "--device", "cpu", "--model", "conv_block",
               "--compiler", "onnxruntime", "--batch-size", "2", "--name", "served",
               "--tracking-uri", url, env=victim)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with as_user("attacker"):
        client = mlflow.tracking.MlflowClient(url)
        run = cell_run(client, "onnxruntime")
        folder = download_engine(client, run.info.run_id, 2, tmp_path / "attacker")
        half_weights(folder / "model.ort.onnx")
        rewrite_manifest(folder)
        client.log_artifacts(run.info.run_id, str(folder), artifact_path="engines/bs2")
        # the registered model's files live with the experiment's artifacts too: the attacker
        # cannot read the registry, but finds the run's logged models in the experiment
        planted = False
        models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
        for i, logged in enumerate(m for m in models if m.source_run_id == run.info.run_id):
            where = str(tmp_path / f"m{i}")
            local = Path(
                mlflow.artifacts.download_artifacts(
                    logged.artifact_location, dst_path=where, tracking_uri=url
                )
            )
            (engine,) = [p.parent for p in local.rglob("manifest.json")]
            half_weights(engine / "model.ort.onnx")
            rewrite_manifest(engine)
            try:
                client.log_model_artifacts(logged.model_id, str(local))
                planted = True
            except Exception:  # the server may refuse the attacker there: as good
                pass
    print(f"the attacker could rewrite the registered model's files: {planted}")
    line = one_error(pull(url, tmp_path / "pulled", "--compiler", "onnxruntime",
                          "--batch-size", "2"))  # fmt: skip
    assert "changed after it was logged" in line
    with as_user("victim"):
        from mlflow_ngraph import load_registered

        if planted:
            with pytest.raises(NgraphError, match="changed after it was logged"):
                load_registered("models:/served@cpu", tracking_uri=url)
        else:
            load_registered("models:/served@cpu", tracking_uri=url)
    served = cli("serve", "models:/served@cpu", "-p", "1", "--tracking-uri", url, env=victim)
    if planted:
        assert "changed after it was logged" in one_error(served)
