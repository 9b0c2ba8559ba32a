"""The package's layout holds: no import cycle (imports inside functions counted) and no
private name imported from another module, as ``bench/bench_house.py`` reads them."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

HOUSE = Path(__file__).resolve().parent.parent / "bench" / "bench_house.py"


@pytest.fixture(scope="module")
def house():
    spec = importlib.util.spec_from_file_location("bench_house", HOUSE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def survey(house):
    return house.survey()


def test_the_package_has_no_import_cycle(survey):
    assert survey["knots"] == []


def test_no_module_imports_a_private_name_of_another(survey):
    assert survey["private"] == []


def test_the_reader_sees_a_cycle_through_an_import_inside_a_function(house):
    """What the two tests above rest on: an import inside a function is an edge, ``from pkg
    import mod`` an edge to the module, ``from pkg import name`` one to the package."""
    here = "mlflow_ngraph.cache"
    tree = ast.parse(
        "from mlflow_ngraph import faultpoint\n"
        "from mlflow_ngraph.report import tables\n"
        "def f():\n    from mlflow_ngraph.cli import main\n    from mlflow_ngraph.x import _y\n"
    )
    found, inside = house.imports(tree, here, False)
    assert {"mlflow_ngraph.faultpoint", "mlflow_ngraph.report.tables"} <= found
    assert "mlflow_ngraph.cli" in found and inside == 2
    assert "mlflow_ngraph" not in found and "mlflow_ngraph.report" not in found
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert house.private_imports(tree, here) == [f"{here} imports mlflow_ngraph.x._y"]
