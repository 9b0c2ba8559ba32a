"""Environment variables by which the package's processes hand settings to each other.

Below the cluster (which sets them for a device's benchmark) and the tracking code (which
reads them into the runs it writes), so that each reads them downward.
"""

#: the name of the device a sweep task benchmarks (two hosts of one profile stay apart)
ENV_DEVICE_NAME = "MLFLOW_NGRAPH_DEVICE_NAME"
#: the id of the sweep a benchmark belongs to (tagged on every run it logs)
ENV_SWEEP_ID = "MLFLOW_NGRAPH_SWEEP_ID"
#: the run every device's benchmark run is nested under (the ``mlflow run`` run of the
#: ``ngraph-ray`` project backend)
ENV_PARENT_RUN = "MLFLOW_NGRAPH_PARENT_RUN_ID"
#: the run of the ``mlflow-ngraph tune`` whose trials a benchmark measures (tagged on every
#: cell it logs: ``ngraph.tune``)
ENV_TUNE_RUN = "MLFLOW_NGRAPH_TUNE_RUN_ID"
