"""Fixtures shared by the compiler tests: a module names its compiler in ``COMPILER``."""

import pytest

from mlflow_ngraph.compilers.registry import get_compiler


@pytest.fixture(scope="module")
def compiler(request):
    return get_compiler(request.module.COMPILER)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")  # one export per model for the module
