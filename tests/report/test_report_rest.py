"""compare against a real tracking server: the REST path reads the same runs as the store.

The server is MLflow's own app, served in this process on a free port (a ``mlflow server``
subprocess takes many seconds to start on a busy 2-core machine).
"""

from __future__ import annotations

import os
import threading

import pytest
from report_data import records_of


@pytest.fixture(scope="module")
def server_uri(store, tmp_path_factory):
    from mlflow.server import ARTIFACT_ROOT_ENV_VAR, BACKEND_STORE_URI_ENV_VAR, app, handlers
    from mlflow.tracking._tracking_service import utils
    from werkzeug.serving import make_server

    uri, _ = store
    # the app sets the process-wide URI (and MLFLOW_TRACKING_URI) to its store: both are put
    # back as they were, unset included
    previous = utils._tracking_uri, os.environ.get("MLFLOW_TRACKING_URI")
    patch = pytest.MonkeyPatch()
    patch.setenv(BACKEND_STORE_URI_ENV_VAR, uri)
    patch.setenv(ARTIFACT_ROOT_ENV_VAR, str(tmp_path_factory.mktemp("server-artifacts")))
    patch.setattr(handlers, "_tracking_store", None)  # the app caches its store globally
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    patch.undo()
    utils._tracking_uri = previous[0]
    if previous[1] is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = previous[1]


def test_server_and_store_give_the_same_tables(compare_cli, server_uri):
    args = ["--format", "json", "--table", "all"]
    direct = records_of(compare_cli(*args))
    served = records_of(compare_cli(*args, "--tracking-uri", server_uri))
    assert served == direct
    assert len(served["cells"]) > 50


def test_server_filters_and_errors(compare_cli, server_uri):
    cells = records_of(compare_cli("--tracking-uri", server_uri, "--format", "json",
                                   "--where", "model.width=64", "--batch-size", "8"))  # fmt: skip
    assert {r["model"] for r in cells} == {f"conv_block:depth={d},width=64" for d in (1, 2, 4)}
    missing = compare_cli("--tracking-uri", server_uri, "--device", "tpu")
    assert missing.exit_code == 2 and "no runs match --device tpu" in missing.stderr
