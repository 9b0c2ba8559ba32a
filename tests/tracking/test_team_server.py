"""The team set-up: ``mlflow server --app-name basic-auth`` on PostgreSQL with proxied
artifacts, an admin with a password of its own, users with per-experiment permissions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from mlflow_ngraph.variables import environment
from tests._support import POSTGRES_URL, PYTHON, TINY, free_port, in_threads, postgres_missing

PG = POSTGRES_URL
#: every test here runs against a server on PostgreSQL: without one they skip, saying why
pytestmark = pytest.mark.skipif(bool(postgres_missing()), reason=str(postgres_missing()))
ADMIN_PASSWORD = "admin-" + uuid.uuid4().hex[:10]
DEV_PASSWORD = "Dev-S3cret-" + uuid.uuid4().hex[:10]


def _pg(sql: str) -> None:
    psycopg2 = pytest.importorskip("psycopg2")
    conn = psycopg2.connect(f"{PG}/postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
    conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # MLflow's basic-auth app needs the `mlflow[auth]` extra (Flask-WTF)
    pytest.importorskip("flask_wtf", reason="mlflow[auth] (Flask-WTF) is not installed")
    tmp = tmp_path_factory.mktemp("team")
    db = f"ngraph_team_{uuid.uuid4().hex[:8]}"
    _pg(f"CREATE DATABASE {db}")
    ini = tmp / "auth.ini"
    ini.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{tmp / 'auth.db'}\nadmin_username = admin\n"
        f"admin_password = {ADMIN_PASSWORD}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # as docs/team-server.md advises: a login checked once, not at every request
        "auth_cache_ttl_seconds = 300\n"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow_cli = str(Path(sys.executable).with_name("mlflow"))
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen(
        [mlflow_cli, "server", "--app-name", "basic-auth", "--backend-store-uri",
         f"{PG.replace('postgresql:', 'postgresql+psycopg2:')}/{db}",
         "--artifacts-destination", str(tmp / "artifacts"), "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        env={**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(ini),
             "MLFLOW_FLASK_SERVER_SECRET_KEY": uuid.uuid4().hex}, stdout=log, stderr=log,
    )  # fmt: skip
    import requests

    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        try:
            if requests.get(url + "/health", timeout=2).ok:
                break
        except requests.RequestException:
            time.sleep(1)
    else:
        proc.kill()
        pytest.fail(
            "the tracking server did not start: " + (tmp / "server.log").read_text()[-2000:]
        )
    saved = _login("admin", ADMIN_PASSWORD)
    try:
        from mlflow.server import get_app_client
        from mlflow.tracking import MlflowClient

        auth = get_app_client("basic-auth", tracking_uri=url)
        auth.create_user("dev", DEV_PASSWORD)
        auth.create_user("reader", DEV_PASSWORD + "r")
        exp = MlflowClient(url).create_experiment("team")
        auth.grant_user_permission("dev", "experiment", exp, "EDIT")
        auth.grant_user_permission("reader", "experiment", exp, "READ")
    finally:
        _restore(saved)
    yield url, tmp
    proc.terminate()
    proc.wait(30)
    log.close()
    _pg(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def _login(user: str, password: str):
    """MLflow's calls in this process log in as ``user``, until :func:`_restore`."""
    block = environment({"MLFLOW_TRACKING_USERNAME": user, "MLFLOW_TRACKING_PASSWORD": password})
    block.__enter__()
    return block


def _restore(block) -> None:
    block.__exit__(None, None, None)


def _benchmark(url: str, home: Path, user: str, password: str):
    env = {**os.environ, "MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": user,
           "MLFLOW_TRACKING_PASSWORD": password, "MLFLOW_NGRAPH_HOME": str(home)}  # fmt: skip
    command = [PYTHON, "-m", "mlflow_ngraph", "benchmark", *TINY, "--compiler", "identity",
               "--experiment", "team", "-v"]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_a_wrong_password_is_one_line(server, tmp_path):
    url, _ = server
    done = _benchmark(url, tmp_path, "dev", "wrong")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = _errors(done.stderr)
    assert "refused the login of user 'dev'" in line and "MLFLOW_TRACKING_PASSWORD" in line


def test_a_read_only_user_is_one_line_naming_the_permission(server, tmp_path):
    url, _ = server
    done = _benchmark(url, tmp_path, "reader", DEV_PASSWORD + "r")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = _errors(done.stderr)
    assert "'reader' lacks the permission" in line and "EDIT" in line
    assert not (tmp_path / "journals").exists() or not any(
        '"measured"' in p.read_text() for p in (tmp_path / "journals").glob("*.jsonl")
    )


def test_the_password_is_nowhere(server, tmp_path):
    from mlflow.tracking import MlflowClient

    url, _ = server
    done = _benchmark(url, tmp_path, "dev", DEV_PASSWORD)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = _login("dev", DEV_PASSWORD)
    try:
        client = MlflowClient(url)
        exp = client.get_experiment_by_name("team")
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) >= 2
        texts = [done.stdout, done.stderr]
        for run in runs:
            texts += [repr(run.data.params), repr(run.data.tags)]
            local = client.download_artifacts(run.info.run_id, "", str(tmp_path / run.info.run_id))
            texts += [p.read_text(errors="replace") for p in Path(local).rglob("*") if p.is_file()]
    finally:
        _restore(saved)
    texts += [p.read_text() for p in (tmp_path / "journals").glob("*.jsonl")]
    assert any("spec_hash" in t for t in texts)  # the artifacts were read
    assert not [t[:200] for t in texts if DEV_PASSWORD in t]


# --- many clients against one PostgreSQL-backed server --------------------------------------
def _as_admin():
    return _login("admin", ADMIN_PASSWORD)


def test_concurrent_creators_on_postgresql_make_one_experiment_and_one_cell_run(server):
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import mlflow_log as ml

    url, _ = server
    saved = _as_admin()
    try:
        ids = in_threads(20, lambda i: ml.ensure_experiment(MlflowClient(url), "pg-shared"))
        assert len(set(ids)) == 1
        runs = in_threads(
            4, lambda i: ml.cell_run(MlflowClient(url), ids[0], "parent", "key-pg", "cell", None)
        )
        assert len(set(runs)) == 1
        found = MlflowClient(url).search_runs([ids[0]], "tags.`ngraph.cell_key` = 'key-pg'")
        assert [r.info.run_id for r in found] == [runs[0]]
    finally:
        _restore(saved)


def test_eight_concurrent_benchmark_clients_lose_nothing(server, tmp_path):
    """Eight devices benchmark into one experiment at once: no client errs, every cell run
    has every param, and every metric its client measured (its journal) at each batch size."""
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import schema as S
    from mlflow_ngraph.variables import ENV_DEVICE_NAME

    url, _ = server
    procs = []
    for i in range(8):
        env = {**os.environ, "MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": "admin",
               "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD, ENV_DEVICE_NAME: f"device-{i}",
               "MLFLOW_NGRAPH_HOME": str(tmp_path / f"home{i}")}  # fmt: skip
        command = [PYTHON, "-m", "mlflow_ngraph", "benchmark", *TINY, "--compiler", "identity",
                   "--experiment", "eight", "--isolation", "none", "-q"]  # fmt: skip
        procs.append(
            subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outcomes = [p.communicate(timeout=900) for p in procs]
    for proc, (_out, err) in zip(procs, outcomes):
        assert proc.returncode == 0, err[-2000:]
    saved = _as_admin()
    try:
        client = MlflowClient(url)
        exp = client.get_experiment_by_name("eight")
        cells = client.search_runs([exp.experiment_id], "tags.`ngraph.role` = 'cell'")
    finally:
        _restore(saved)
    assert sorted(r.data.params[S.P_DEVICE] for r in cells) == [f"device-{i}" for i in range(8)]
    for run in cells:
        assert run.info.status == "FINISHED"
        assert {S.P_MODEL, S.P_COMPILER, S.P_FAMILY, S.P_SCENARIO} <= set(run.data.params)
        home = tmp_path / f"home{run.data.params[S.P_DEVICE].split('-')[1]}"
        measured = [json.loads(line) for p in (home / "journals").glob("*.jsonl")
                    for line in p.read_text().splitlines() if '"measured"' in line]  # fmt: skip
        assert sorted(m["batch_size"] for m in measured) == [1, 2]
        for record in measured:
            b = record["batch_size"]
            # the interval too where the client had one (a busy host's screen can leave too
            # few undisturbed rounds for it)
            ci = [S.M_THROUGHPUT_CI_LOW] if record["metrics"].get(S.M_THROUGHPUT_CI_LOW) else []
            for metric in (S.M_THROUGHPUT, S.M_CV, S.M_VALID, *ci):
                assert S.flat_key(metric, b) in run.data.metrics, (run.data.params, metric, b)


def test_a_create_slow_to_land_never_displaces_the_run_the_others_settled_on(server, monkeypatch):
    """A create that reached a busy server late lands with the start time it was sent with,
    earlier than a run the other clients had already settled on: ranked by start time, both
    stayed (seen once among four threads beside the suite's other worker). One client's
    create is held back on its way (a slow request: a fault the server cannot produce on
    demand), the others' sent after it."""
    import threading

    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import mlflow_log as ml

    url, _ = server
    slow = threading.local()
    send = RestStore.create_run

    def late(self, *args, **kwargs):
        if getattr(slow, "on", False):
            time.sleep(1.5)  # past the others' settle: they have ranked and returned
        return send(self, *args, **kwargs)

    monkeypatch.setattr(RestStore, "create_run", late)

    def work(i):
        slow.on = i == 0
        if i:
            time.sleep(0.2)  # sent after the slow one: later start times
        return ml.cell_run(MlflowClient(url), experiment, "parent", "key-late", "cell", None)

    saved = _as_admin()
    try:
        experiment = ml.ensure_experiment(MlflowClient(url), "pg-late")
        runs = in_threads(3, work)
        assert len(set(runs)) == 1, runs
        found = MlflowClient(url).search_runs([experiment], "tags.`ngraph.cell_key` = 'key-late'")
        assert [r.info.run_id for r in found] == [runs[0]]
        assert float(found[0].data.tags["ngraph.landed"]) > 0
    finally:
        _restore(saved)


@pytest.mark.parametrize("tagged", [True, False], ids=["tags-late", "killed-before-tagging"])
def test_a_run_seen_without_its_landed_time_is_waited_for_then_passed_over(
    server, monkeypatch, tagged
):
    """Another creator's run that landed beside ours, its landed time not yet set: the
    ranking waits for it (it landed first: ours is deleted), or, its creator killed before
    setting it, passes it over once the wait is spent (ours is kept, ranked first)."""
    import threading

    from mlflow.store.tracking.rest_store import RestStore
    from mlflow.tracking import MlflowClient

    from mlflow_ngraph.tracking import mlflow_log as ml

    url, _ = server
    send, other = RestStore.create_run, {}

    def beside(self, *args, **kwargs):
        mine = send(self, *args, **kwargs)
        if "run" not in other:  # another creator's, landed with ours
            other["run"] = theirs = send(self, *args, **kwargs).info.run_id
            if tagged:  # it tags its run a second on, with the time its create came back
                landed = repr(time.time() - 1)
                threading.Timer(1.0, client.set_tag, (theirs, "ngraph.landed", landed)).start()
        return mine

    monkeypatch.setattr(RestStore, "create_run", beside)
    monkeypatch.setattr(ml, "LANDED_WAIT_S", 3.0)
    key = f"key-pending-{tagged}"
    saved = _as_admin()
    try:
        client = MlflowClient(url)
        experiment = ml.ensure_experiment(client, "pg-pending")
        began = time.monotonic()
        got = ml.find_or_create_run(client, experiment, {"ngraph.cell_key": key}, "cell")
        waited = time.monotonic() - began
        found = [r.info.run_id for r in ml._find_runs(client, experiment, {"ngraph.cell_key": key})]
    finally:
        _restore(saved)
    if tagged:
        assert got == other["run"] and found == [other["run"]]  # ours deleted
        assert 1.0 <= waited < 3.0
    else:
        assert got != other["run"] and found == [got, other["run"]]
        assert waited >= 3.0
