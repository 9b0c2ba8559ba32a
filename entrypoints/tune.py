"""MLproject entry point `tune`: a thin wrapper over `mlflow-ngraph tune`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("tune", sys.argv[1:])
