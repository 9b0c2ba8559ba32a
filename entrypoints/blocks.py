"""MLproject entry point `blocks`: a thin wrapper over `mlflow-ngraph blocks`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("blocks", sys.argv[1:])
