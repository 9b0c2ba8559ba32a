"""Running the benchmark over a cluster of devices: the sweep on Ray, and syncing journals."""

from mlflow_ngraph.variables import ENV_DEVICE_NAME, ENV_PARENT_RUN, ENV_SWEEP_ID

__all__ = ["ENV_DEVICE_NAME", "ENV_PARENT_RUN", "ENV_SWEEP_ID"]
