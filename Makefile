# `make run`: set up .venv and benchmark the default experiment on this CPU.
# `make test`: set up .venv and run the test suite.
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: setup run test lint

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[all]'
	touch $@

setup: $(BIN)/.installed

run: setup
	$(BIN)/mlflow-ngraph benchmark --spec default --device cpu

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check mlflow_ngraph tests bench entrypoints
