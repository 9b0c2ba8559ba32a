"""What a cell's run says of itself: its params (what was measured, and how) and its tags
(where, with what and in which invocation), and the description the journal keeps of both,
from which a store that cannot be written now is sent them later."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from mlflow_ngraph.env import host_fingerprint
from mlflow_ngraph.tracking import mlflow_log as ml
from mlflow_ngraph.tracking import schema as S
from mlflow_ngraph.variables import ENV_SWEEP_ID, ENV_TUNE_RUN

if TYPE_CHECKING:
    from mlflow_ngraph.devices import DeviceProfile
    from mlflow_ngraph.plan.cells import Cell
    from mlflow_ngraph.plan.config import Spec
    from mlflow_ngraph.tracking.journal import Journal


class CellDescription:
    """The params and tags of the cells' runs of one invocation.

    Args:
        env: what the invocation runs on (its ``host`` and ``version.*`` entries are tags).
        parent_id: the run the cells nest under (each cell's latest parent).
    """

    def __init__(
        self,
        spec: Spec,
        profile: DeviceProfile,
        journal: Journal,
        env: dict[str, Any],
        parent_id: str | None,
    ) -> None:
        self.spec = spec
        self.profile = profile
        self.journal = journal
        self.env = env
        self.parent_id = parent_id

    def describe(self, cell: Cell, params: dict[str, Any] | None = None) -> None:
        """Journal what the cell's run needs, for a store that cannot be written now
        (``params`` None: the params described before, if any)."""
        if params is None:
            params = (self.journal.cell(cell.key).description or {}).get("params", {})
        self.journal.describe(
            cell.key,
            cell.run_name or cell.name,
            params,
            self.tags(),
            self.parent_id,
            batch_sizes=list(self.spec.batch_sizes),
            baseline=cell.baseline,
            log_engines=self.spec.log_engines,
        )

    def params(self, cell: Cell, info: dict[str, Any] | None) -> dict[str, Any]:
        """The cell's params; ``info`` (what the worker says of the built model) adds the
        model's family, size and hash."""
        m = self.spec.measure
        params = {
            S.P_DEVICE: ml.device_name(self.profile.name),
            "device_profile": self.profile.name,
            S.P_MODEL: info["name"] if info else cell.model.name,
            S.P_COMPILER: cell.compiler.name,
            S.P_SCENARIO: m.scenario,
            "warmup": m.warmup,
            "repetitions": m.repetitions,
            "min_duration_s": m.min_duration_s,
            "max_duration_s": m.max_duration_s,
            "protocol": m.protocol,
            "tolerance": self.spec.tolerance,
            "math": self.spec.math,
            "atol": "default" if self.spec.atol is None else self.spec.atol,
            "rtol": self.spec.rtol,
            "compiler_version": cell.compiler.version(),
            "device_kind": self.profile.kind,
        }
        if info:
            params.update(
                {
                    S.P_FAMILY: info["family"],
                    S.P_PARAMETER_COUNT: info["parameter_count"],
                    "model_sha256": info["content_hash"],
                }
            )
        model_params = info["params"] if info else cell.model.params
        params.update({f"{S.P_MODEL_PARAM_PREFIX}{k}": v for k, v in model_params.items()})
        params.update({f"{S.P_FLAG_PREFIX}{k}": v for k, v in cell.flags.items()})
        return params

    def tags(self) -> dict[str, str]:
        """Where and with what a cell was measured (the latest invocation's values)."""
        tags = {
            S.T_LAST_PARENT: self.parent_id,
            S.T_DEVICE: ml.device_name(self.profile.name),
            "ngraph.device_profile": self.profile.name,
            S.T_DEVICE_KIND: self.profile.kind,
            S.T_HOST: self.env["host"],
            "ngraph.device_fingerprint": host_fingerprint(),
            S.T_SPEC_HASH: self.spec.spec_hash,
        }
        versions = {k: v for k, v in self.env.items() if k.startswith("version.")}
        tags.update({f"ngraph.{k}": str(v) for k, v in versions.items()})
        sweep = os.environ.get(ENV_SWEEP_ID)
        if sweep:
            tags[S.T_SWEEP] = sweep
        tune = os.environ.get(ENV_TUNE_RUN)
        if tune:
            tags[S.T_TUNE] = tune
        return tags
