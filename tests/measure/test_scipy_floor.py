"""The SciPy that pyproject.toml allows can run the interval: ``rate_interval`` passes
``rng=`` to ``scipy.stats.bootstrap``, a keyword SciPy has from 1.15 (on 1.14 the call
raises ``TypeError`` and no measurement reaching the bootstrap completes)."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from scipy import stats as scipy_stats

from mlflow_ngraph.measure import stats

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _declared_floor(name: str) -> Version:
    data = tomllib.loads(PYPROJECT.read_text())
    for text in data["project"]["dependencies"]:
        req = Requirement(text)
        if req.name == name:
            floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
            assert floors, f"{text}: no lower bound"
            return max(floors)
    raise AssertionError(f"{name} is not a dependency")


def test_declared_scipy_floor_has_bootstrap_rng():
    # the floor pip may install must be one whose bootstrap takes the keywords we pass
    assert _declared_floor("scipy") >= Version(stats.SCIPY_MIN_VERSION) >= Version("1.15")


def test_installed_bootstrap_takes_the_keywords_rate_interval_passes():
    params = inspect.signature(scipy_stats.bootstrap).parameters
    for keyword in ("rng", "batch", "vectorized", "method", "n_resamples", "confidence_level"):
        assert keyword in params, keyword
    low, high = stats.rate_interval(np.random.default_rng(1).uniform(0.9, 1.1, 50), 8.0)
    assert low < 8.0 < high
