"""Secrets never printed: the redaction of every form a tracking or database URI carries a
login in, applied to log records and tracebacks, and every command's store error as one
redacted line (the end-to-end check on a real server is in tests/deploy/test_trust_server.py)."""

from __future__ import annotations

import logging

import pytest

from mlflow_ngraph.redaction import redact_log_records, redact_text

SECRET = "S3cretPW"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://alice:S3cretPW@host", "http://alice:***@host"),
        # a password holding '@': the userinfo ends at the last '@' before the host
        ("-> http://alice:Pa@ssw0rd@host:5000/api/x ok", "-> http://alice:***@host:5000/api/x ok"),
        ("mysql+pymysql://root:p@ss@db:3306/m", "mysql+pymysql://root:***@db:3306/m"),
        ("http://alice:s3cr%40t@host/x", "http://alice:***@host/x"),
        # a token as the whole userinfo, or a password left empty
        ("https://ghp_TOKEN123@host/x", "https://***@host/x"),
        ("https://ghp_TOKEN123:@host/x", "https://***@host/x"),
        # secret query parameters, a database URI's among them
        ("postgresql://u@h/db?password=x", "postgresql://***@h/db?password=***"),
        (
            "postgresql+psycopg2://u:pw@h:5432/db?sslmode=require&password=x",
            "postgresql+psycopg2://u:***@h:5432/db?sslmode=require&password=***",
        ),
        ("https://h/api?token=abc&page=2#top", "https://h/api?token=***&page=2#top"),
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=AK&X-Amz-Signature=ab&v=1",
            "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&v=1",
        ),
        ("https://h/x?api_key=k1&client_secret=s1", "https://h/x?api_key=***&client_secret=***"),
        # connection strings: libpq's keywords, ODBC's escaped in a query
        ("host=db user=u password=hunter2 dbname=m", "host=db user=u password=*** dbname=m"),
        (
            "mssql+pyodbc:///?odbc_connect=DRIVER%3DX%3BUID%3Du%3BPWD%3Dsecret%3BDB%3Dm",
            "mssql+pyodbc:///?odbc_connect=DRIVER%3DX%3BUID%3Du%3BPWD%3D***%3BDB%3Dm",
        ),
        ("{'Authorization': 'Basic dmljdGltOnB3'}", "{'Authorization': '***'}"),
        # nothing secret: left as it is (twice redacted too)
        ("http://alice:***@host and http://***@h2", "http://alice:***@host and http://***@h2"),
        ("sqlite:///tmp/a@b/mlflow.db", "sqlite:///tmp/a@b/mlflow.db"),
        (
            "http://127.0.0.1:5000 asked me@example.com",
            "http://127.0.0.1:5000 asked me@example.com",
        ),
        ("https://h/x?page=2&sort=name", "https://h/x?page=2&sort=name"),
    ],
)
def test_every_form_of_a_login_in_a_uri_is_redacted(text, shown):
    assert redact_text(text) == shown


def test_the_old_forms_read_as_before():
    from mlflow_ngraph.tracking import mlflow_log as ml

    text = "-> http://alice:s3cr%40t@host:5000/x and postgresql://u:pw@db/m; http://h/"
    assert (
        ml.redact_uri(text)
        == "-> http://alice:***@host:5000/x and postgresql://u:***@db/m; http://h/"
    )


def test_log_records_and_their_tracebacks_are_redacted(capsys):
    from mlflow_ngraph.console import setup_logging

    setup_logging(0)
    redact_log_records()
    redact_log_records()  # twice: once in effect
    log = logging.getLogger("mlflow_ngraph.test")
    try:
        raise RuntimeError(f"for url: http://alice:Pa@{SECRET}@host/x?token=T0K")
    except RuntimeError:
        log.exception("store at %s failed", f"http://alice:{SECRET}@host")
    err = capsys.readouterr().err
    assert "alice:***@host failed" in err and "Traceback" in err
    assert SECRET not in err and "T0K" not in err


# --- every command's store error: one redacted line ------------------------------------------


URI = f"http://alice:Pa@{SECRET}@127.0.0.1:9"


def _mlflow_404():
    from mlflow.exceptions import MlflowException

    return MlflowException(
        f"API request to {URI}/api/2.0/mlflow-artifacts/artifacts/1/r/artifacts/ngraph/"
        "cells.json.gz failed with error code 404 != 200. Response body: 'not found'"
    )


def _one_line(code: int, err: str, status: int = 2) -> str:
    assert code == status, err
    assert "Traceback" not in err and SECRET not in err, err
    (line,) = err.strip().splitlines()
    assert line.lower().startswith("error: "), err  # compare's click error: "Error: "
    return line


@pytest.fixture
def command(tmp_path, capsys, monkeypatch):
    """Run ``mlflow-ngraph ARGS`` in this process; returns (exit code, stdout, stderr)."""
    from mlflow_ngraph.commands.cli import main

    monkeypatch.setenv("MLFLOW_NGRAPH_HOME", str(tmp_path / "home"))

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as ended:
            main(list(args))
        out, err = capsys.readouterr()
        return ended.value.code, out, err

    return run


@pytest.fixture
def answering(monkeypatch):
    """The store answers a probe (the error is its answer, not an outage)."""
    monkeypatch.setattr("mlflow_ngraph.tracking.mlflow_log.store_answers", lambda *a, **k: True)


def test_a_store_error_of_any_command_is_one_redacted_line(command, monkeypatch, answering):
    import mlflow_ngraph.cluster.sync as sync

    def fails(home, uri):
        raise _mlflow_404()

    monkeypatch.setattr(sync, "sync", fails)
    code, _, err = command("sync", "--tracking-uri", URI)
    line = _one_line(code, err)
    assert line.startswith("error: the tracking store http://alice:***@127.0.0.1:9 failed: ")
    assert "error code 404" in line and "--live" in line  # the index it could not read


def test_compare_says_a_store_error_in_one_redacted_line(command, monkeypatch, answering):
    import mlflow_ngraph.commands.report as report

    def fails(*args, **kwargs):
        raise _mlflow_404()

    monkeypatch.setattr(report, "run_compare", fails)
    code, _, err = command("compare", "--tracking-uri", URI)
    assert "the tracking store http://alice:***@127.0.0.1:9 failed" in _one_line(code, err)


def test_a_server_that_does_not_answer_is_one_line_and_its_own_status(command, monkeypatch):
    import requests

    import mlflow_ngraph.cluster.sync as sync

    def fails(home, uri):
        raise requests.ConnectionError(f"Max retries exceeded with url: {URI}/api/2.0/x")

    monkeypatch.setattr(sync, "sync", fails)
    code, _, err = command("sync", "--tracking-uri", URI)
    line = _one_line(code, err, status=3)
    assert "tracking server http://alice:***@127.0.0.1:9 is unreachable" in line


def test_a_fault_of_the_tool_keeps_its_traceback_without_the_secret(command, monkeypatch):
    import mlflow_ngraph.cluster.sync as sync

    def fails(home, uri):
        raise KeyError(f"bug near {URI}")

    monkeypatch.setattr(sync, "sync", fails)
    code, _, err = command("sync", "--tracking-uri", URI)
    assert code == 1 and "Traceback" in err and "KeyError" in err
    assert SECRET not in err and "alice:***@127.0.0.1:9" in err


def test_a_user_error_naming_a_login_is_redacted(command, monkeypatch):
    import mlflow_ngraph.cluster.sync as sync
    from mlflow_ngraph.errors import NgraphError

    def fails(home, uri):
        raise NgraphError(f"something about {uri}")

    monkeypatch.setattr(sync, "sync", fails)
    code, _, err = command("sync", "--tracking-uri", URI)
    assert _one_line(code, err) == "error: something about http://alice:***@127.0.0.1:9"


def test_a_deploy_store_error_names_the_store_the_command_resolved(monkeypatch, answering):
    from mlflow_ngraph.commands.deploy import store_errors
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.tracking.mlflow_log import resolve_tracking_uri

    monkeypatch.setenv("MLFLOW_TRACKING_URI", URI)
    resolve_tracking_uri(None)  # what pull does, inside the block, with no --tracking-uri
    with pytest.raises(NgraphError) as caught:
        with store_errors(None, "deploy", "READ"):
            raise _mlflow_404()
    message = str(caught.value)
    assert message.startswith("the tracking store http://alice:***@127.0.0.1:9 failed: ")
    assert SECRET not in message


def test_a_digest_holding_403_or_401_is_not_read_as_a_refused_permission_or_login():
    """Seen in CI: pull's own refusal of a planted engine named two sha256 digests; one held
    '403', and the deploy command said the user lacked the READ permission instead."""
    from mlflow.exceptions import MlflowException

    from mlflow_ngraph.commands.deploy import store_errors
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.tracking.mlflow_log import permission_missing

    own = "engine manifest sha256 9f403a1c (403 bytes) is not the one its run recorded (401)"
    with pytest.raises(NgraphError, match="the one its run recorded"):
        with store_errors(URI, "deploy", "READ"):
            raise NgraphError(own)
    store = "API request to http://h/api/2.0/mlflow/runs/get?run_id=ab403cd failed: 500"
    assert not permission_missing(store)
    # the server's refusals still read as such
    assert permission_missing("API request to x failed with error code 403 != 200. Response")
    assert permission_missing("RESOURCE PERMISSION_DENIED")
    with pytest.raises(NgraphError, match="lacks the READ permission"):
        with store_errors(URI, "deploy", "READ"):
            raise MlflowException("failed with error code 403 != 200. Response body: 'denied'")
    # serve's lookup of a registered version: a refusal is named as one, not "not registered"
    from mlflow_ngraph.deploy.registered import registered_name, resolve_version

    class Refusing:
        def get_model_version(self, name, version):
            raise MlflowException("failed with error code 403 != 200. Response body: 'denied'")

    with pytest.raises(NgraphError, match="lacks the READ permission on registered model 'm' "):
        with store_errors(URI, registered_name("models:/m/1"), "READ", on="registered model"):
            resolve_version(Refusing(), "models:/m/1")
    assert registered_name("models:/m@champion") == "m"


def test_the_runner_and_the_session_say_a_store_error_redacted(answering):
    from mlflow_ngraph.run.worker import one_line
    from mlflow_ngraph.tracking.session import closing_failed

    assert SECRET not in one_line(_mlflow_404())
    closing = closing_failed(_mlflow_404(), URI)
    assert "alice:***@127.0.0.1:9" in str(closing) and SECRET not in str(closing)
    assert "run the same command again" in str(closing)
    other = ValueError("x")
    assert closing_failed(other, URI) is other


def test_a_tracking_uri_refused_before_use_is_named_redacted():
    from mlflow_ngraph.errors import NgraphError
    from mlflow_ngraph.tracking.uri import check_tracking_uri

    for uri in (f"htp://alice:{SECRET}@host", f"postgresql://u:{SECRET}@h:notaport/db"):
        with pytest.raises(NgraphError) as refused:
            check_tracking_uri(uri)
        assert SECRET not in str(refused.value) and ":***@" in str(refused.value)
