"""MLproject entry point `benchmark`: a thin wrapper over `mlflow-ngraph benchmark`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("benchmark", sys.argv[1:])
