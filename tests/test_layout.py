"""The package's layout holds: no import cycle (imports inside functions counted), no import
of a higher layer than the importer's, no private name imported from another module, no
function or class longer than ``bench/bench_house.py``'s limits, as that script reads them."""

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


def test_data_flows_up_the_layers(house, survey):
    """A new import of a higher layer fails here (put the code where the layers allow, or
    let the higher layer hand the lower one what it needs, as the benchmark command hands
    the recording layer deploy's model logger)."""
    assert house.arrows_up(survey["graph"]) == []


def test_every_module_is_in_a_layer(house, survey):
    for module in survey["graph"]:
        house.layer(module)  # raises for a module no layer names


def test_no_module_imports_a_private_name_of_another(survey):
    assert survey["private"] == []


def test_no_function_or_class_is_longer_than_its_limit(house, survey):
    """A function over 50 lines or a class over 300 fails here: split it into parts with one
    job each (``bench/bench_house.py`` lists the longest)."""
    for kind, limit in house.LIMITS.items():
        assert [(span, where) for span, where in survey[kind] if span > limit] == [], kind


def test_no_broad_handler_swallows_an_error(survey):
    """Every ``except Exception`` (or wider) re-raises, logs a line ``-v`` shows, or hands
    the exception on (a failure the caller reports)."""
    assert survey["silent"] == []


def test_the_reader_sees_a_cycle_through_an_import_inside_a_function(house):
    """What the two tests above rest on: an import inside a function is an edge, ``from pkg
    import mod`` an edge to the module, ``from pkg import name`` one to the package."""
    here = "mlflow_ngraph.cache"
    tree = ast.parse(
        "from mlflow_ngraph import faultpoint\n"
        "from mlflow_ngraph.report import tables\n"
        "def f():\n    from mlflow_ngraph.commands.cli import main\n"
        "    from mlflow_ngraph.x import _y\n"
    )
    found, inside = house.imports(tree, here, False)
    assert {"mlflow_ngraph.faultpoint", "mlflow_ngraph.report.tables"} <= found
    assert "mlflow_ngraph.commands.cli" in found and inside == 2
    assert "mlflow_ngraph" not in found and "mlflow_ngraph.report" not in found
    assert house.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert house.private_imports(tree, here) == [f"{here} imports mlflow_ngraph.x._y"]
    handlers = [
        node
        for node in ast.walk(ast.parse(
            "try: f()\nexcept Exception: pass\n"
            "try: f()\nexcept Exception as exc: failed = exc\n"
            "try: f()\nexcept Exception: log.debug('x')\n"
            "try: f()\nexcept ValueError: pass\n"
        ))
        if isinstance(node, ast.ExceptHandler)
    ]  # fmt: skip
    assert [house.silent_broad(h) for h in handlers] == [True, False, False, False]
    graph = {"mlflow_ngraph.run.worker": {"mlflow_ngraph.measure.rounds"},
             "mlflow_ngraph.measure.rounds": {"mlflow_ngraph.tracking.session"}}  # fmt: skip
    up = [("mlflow_ngraph.measure.rounds", "mlflow_ngraph.tracking.session")]
    assert house.arrows_up(graph) == up
