"""One real tiny benchmark per test session, with every CPU compiler that writes an engine,
in its own process (as a user runs it); the deployment tests read from its store."""

from __future__ import annotations

import pytest
from deploy_support import benchmark


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    """(tracking URI, home) of a store holding the tiny benchmark."""
    pytest.importorskip("openvino")
    pytest.importorskip("tvm")
    root = tmp_path_factory.mktemp("deploy-store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    benchmark(uri, root / "home")
    return uri, root / "home"
