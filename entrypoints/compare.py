"""MLproject entry point `compare`: a thin wrapper over `mlflow-ngraph compare`."""

import sys

from _common import run_cli

if __name__ == "__main__":
    run_cli("compare", sys.argv[1:])
