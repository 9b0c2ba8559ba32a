"""One real tiny benchmark per test run, with every CPU compiler that writes an engine,
in its own process (as a user runs it), built once for every pytest-xdist worker; the
deployment tests read from their worker's copy of its store."""

from __future__ import annotations

import pytest
from deploy_support import benchmark

from tests._support import clone_store


def _build(root):
    benchmark(f"sqlite:///{root / 'mlflow.db'}", root / "home")


@pytest.fixture(scope="session")
def store(shared_build, tmp_path_factory):
    """(tracking URI, the shared home: read only) of this worker's copy of a store holding
    the tiny benchmark (a test that damages it puts it back; ``register`` adds to it)."""
    pytest.importorskip("openvino")
    pytest.importorskip("tvm")
    built = shared_build("deploy-store", _build)
    root = tmp_path_factory.mktemp("deploy-store") / "store"
    uri = clone_store(built, root, skip_home=True)
    return uri, built / "home"


@pytest.fixture
def fresh_store(shared_build, tmp_path):
    """The tracking URI of a copy of the tiny benchmark's store of the test's own: one whose
    logged models and versions no other test adds to."""
    pytest.importorskip("openvino")
    pytest.importorskip("tvm")
    built = shared_build("deploy-store", _build)
    return clone_store(built, tmp_path / "store", skip_home=True)
