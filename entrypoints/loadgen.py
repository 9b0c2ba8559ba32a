"""MLproject entry point `loadgen`: a thin wrapper over `mlflow-ngraph loadgen`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("loadgen", sys.argv[1:])
