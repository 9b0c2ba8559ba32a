import pytest

from mlflow_ngraph.measure import metrics as M

IDENTITY = {1: 10.0, 2: 16.0, 4: 24.0, 8: 32.0}
COMPILED = {1: 40.0, 2: 60.0, 4: 80.0, 8: 96.0}


def test_speedup_rtr_ase_bsr_by_hand():
    assert M.speedup(COMPILED[8], IDENTITY[8]) == 3.0
    assert M.rtr(COMPILED, 8) == 96.0 / 40.0
    assert M.ase(COMPILED, 8) == pytest.approx(96.0 / (8 * 40.0))
    # ASE identity(8) = 32 / 80 = 0.4 ; ASE compiled(8) = 0.3 ; BSR = 0.75
    assert M.bsr(COMPILED, IDENTITY, 8) == pytest.approx(0.75)
    assert M.ase(COMPILED, 1) == 1.0


def test_missing_inputs_give_none_not_a_guess():
    assert M.speedup(10.0, None) is None
    assert M.speedup(10.0, 0.0) is None
    assert M.rtr({2: 5.0}, 2) is None  # no batch 1
    assert M.bsr(COMPILED, {2: 16.0}, 2) is None


def test_relative_metrics_without_identity():
    rel = M.relative_metrics(COMPILED, None)
    assert rel[4]["speedup"] is None and rel[4]["bsr"] is None
    assert rel[4]["rtr"] == 2.0


def test_depth_slope_and_retention():
    depths = [1, 2, 3, 4]
    speedups = [2.0, 4.0, 6.0, 8.0]
    assert M.depth_slope(depths, speedups) == pytest.approx(2.0)
    assert M.retention(dict(zip(depths, speedups))) == 4.0
    assert M.depth_slope([1], [2.0]) is None
    assert M.retention({2: 3.0, 3: 4.0}) is None
