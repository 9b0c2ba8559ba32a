"""MLproject entry point `gate`: a thin wrapper over `mlflow-ngraph gate`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("gate", sys.argv[1:])
