"""The one home of MLflow's unpublished APIs: each works on the installed MLflow, and an
untested major is said once."""

import logging

import mlflow
from mlflow import MlflowClient

from mlflow_ngraph.tracking import mlflow_private as private


def test_installed_mlflow_is_a_tested_major():
    private.check_version.cache_clear()
    assert private.check_version() is True


def test_untested_major_is_warned_once(monkeypatch, caplog):
    private.check_version.cache_clear()
    monkeypatch.setattr(mlflow, "__version__", "99.0.0")
    with caplog.at_level(logging.WARNING):
        assert private.check_version() is False
        assert private.check_version() is False
    warnings = [r for r in caplog.records if "untested" in r.getMessage()]
    assert len(warnings) == 1 and "99.0.0" in warnings[0].getMessage()
    private.check_version.cache_clear()


def test_database_schemes_name_the_usual_engines():
    schemes = private.database_schemes()
    assert {"sqlite", "postgresql", "mysql"} <= set(schemes)


def test_rest_creds_only_for_a_rest_store(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'store.db'}")
    assert private.rest_host_creds(client) is None
    rest = MlflowClient(tracking_uri="http://127.0.0.1:9")  # never contacted
    assert callable(private.rest_host_creds(rest))


def test_single_artifact_file_download(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "art"))
    run = client.create_run(experiment)
    source = tmp_path / "index.json"
    source.write_text('{"a": 1}')
    client.log_artifact(run.info.run_id, str(source))
    target = tmp_path / "got.json"
    assert private.download_artifact_file(uri, run.info.artifact_uri, "index.json", str(target))
    assert target.read_text() == '{"a": 1}'
