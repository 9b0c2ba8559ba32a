# `make run`: set up .venv with the CPU compilers and benchmark the default experiment here.
# `make test`: set up .venv with every extra the tests need and run the test suite.
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: setup setup-all run test lint

# what the default experiment needs: PyTorch, MLflow, ONNX Runtime and OpenVINO
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu]'
	touch $@

# the tests also cover Apache TVM, the Ray cluster sweep and the PostgreSQL-backed server
$(BIN)/.installed-all: pyproject.toml $(BIN)/.installed
	$(BIN)/python -m pip install -q -e '.[all]'
	touch $@

setup: $(BIN)/.installed

setup-all: $(BIN)/.installed-all

run: setup
	$(BIN)/mlflow-ngraph benchmark --spec default --device cpu

test: setup-all
	$(BIN)/python -m pytest -q

lint: setup-all
	$(BIN)/ruff check mlflow_ngraph tests bench entrypoints
