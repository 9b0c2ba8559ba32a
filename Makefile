# `make run`: set up .venv with the CPU compilers and benchmark the default experiment here.
# `make test`: set up .venv with every extra the tests need and run the whole suite (two
# pytest-xdist workers, then the tests marked serial alone); `make test-fast`: what needs no
# compile, server, cluster or benchmark run, for the edit-test loop (under 3 minutes);
# `make coverage`: the whole suite under coverage.py, subprocesses included.
# `make gpu-check`: on a host with an NVIDIA GPU, the GPU paths end to end (docs/gpu.md).
VENV ?= .venv
PYTHON ?= python3
BIN = $(VENV)/bin

.PHONY: setup setup-all run test test-fast coverage lint gpu-check

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

# --dist loadscope: a test file's tests stay on one worker, so its module fixtures are built
# once; --no-loadscope-reorder: the slowest files start first (tests/conftest.py SLOW_FILES),
# not the files with the most tests. The tests marked serial (they measure time or CPU, or
# load it on purpose) run after the others, alone in one process: beside the workers each
# one waited for the other worker's test to end, and left it idle while it ran. Both phases
# run; the target fails where either did.
PYTEST_PARALLEL = -n 2 --dist loadscope --no-loadscope-reorder
PYTEST = $(BIN)/python -m pytest -q

test: setup-all
	$(PYTEST) $(PYTEST_PARALLEL) -m "not serial" --durations=20; a=$$?; \
	$(PYTEST) -p no:xdist -m serial --durations=5; b=$$?; test $$a -eq 0 && test $$b -eq 0

test-fast: setup-all
	$(PYTEST) $(PYTEST_PARALLEL) -m "not e2e and not serial" --durations=10; a=$$?; \
	$(PYTEST) -p no:xdist -m "serial and not e2e"; b=$$?; test $$a -eq 0 && test $$b -eq 0

# line and branch coverage of mlflow_ngraph/, in every Python process the tests start
COVERAGE = NGRAPH_COV_DATA=$(CURDIR)/.coverage-data/.coverage $(BIN)/python -m coverage
COVERAGE_RUN = $(COVERAGE) run --rcfile=tests/coveragerc -m pytest -q -p no:cacheprovider
coverage: setup-all
	rm -rf .coverage-data && mkdir .coverage-data
	$(COVERAGE_RUN) $(PYTEST_PARALLEL) -m "not serial"; a=$$?; \
	$(COVERAGE_RUN) -p no:xdist -m serial; b=$$?; test $$a -eq 0 && test $$b -eq 0
	$(BIN)/python -m coverage combine --rcfile=tests/coveragerc --data-file=.coverage-data/.coverage -q
	$(BIN)/python -m coverage report --rcfile=tests/coveragerc --data-file=.coverage-data/.coverage | tail -1

lint: setup-all
	$(BIN)/ruff check mlflow_ngraph tests bench entrypoints

# `make gpu-check`: the gpu extra in .venv, the gpu-marked tests, then a tiny benchmark on
# --device gpu through every GPU compiler with one table (python -m mlflow_ngraph.commands.gpucheck).
# Without an NVIDIA GPU: one line and exit 1, before anything is installed. In an existing
# environment: make gpu-check GPU_PYTHON=python3 GPU_SETUP=
GPU_PYTHON ?= $(BIN)/python
GPU_SETUP ?= $(BIN)/.installed-gpu
GPU_CHECK_ARGS ?=

# onnxruntime-gpu holds the CPU provider too: the gpu extra does not add the CPU build
# (both install the module onnxruntime, the later one over the other)
$(BIN)/.installed-gpu: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[gpu,tvm,test]'
	touch $@

gpu-check:
	$(if $(shell nvidia-smi -L 2>/dev/null),,$(error gpu-check: no NVIDIA GPU here (nvidia-smi finds none): run it on a host with an NVIDIA GPU and its driver (docs/gpu.md)))
	$(if $(GPU_SETUP),@$(MAKE) --no-print-directory $(GPU_SETUP))
	$(GPU_PYTHON) -m pytest -q -p no:cacheprovider -m gpu -rs tests
	$(GPU_PYTHON) -m mlflow_ngraph.commands.gpucheck $(GPU_CHECK_ARGS)
