#!/bin/sh
# Runs an MLproject entry point with a Python that has mlflow-ngraph installed.
#
# `mlflow run` starts entry points through a shell with whatever `python` is on PATH, which in
# a fresh shell is not the virtual environment that `make setup` made. The interpreter that
# runs `mlflow run` itself (`.venv/bin/mlflow run ...`) is the one the user chose, so it is
# tried first (the shell's parent process), then an active virtual environment, then the
# checkout's .venv, then python3/python on PATH.
parent=""
if [ -r "/proc/$PPID/cmdline" ]; then
    parent=$(tr '\0' '\n' < "/proc/$PPID/cmdline" | head -n 1)
fi
for candidate in "$parent" "${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python}" ./.venv/bin/python python3 python; do
    [ -n "$candidate" ] || continue
    command -v "$candidate" > /dev/null 2>&1 || continue
    if "$candidate" -c "import mlflow_ngraph" > /dev/null 2>&1; then
        exec "$candidate" "$@"
    fi
done
echo "error: no Python with mlflow-ngraph installed was found: run 'make setup' in the" \
    "checkout (it creates .venv) or 'pip install -e .' into the Python that runs mlflow" >&2
exit 2
