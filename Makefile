# Quick start: `make demo` (train, translate, score the built-in corpus, offline) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HASH := $(shell cksum pyproject.toml | cut -d' ' -f1)
CORE_STAMP := $(VENV)/.installed-core-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=15

.PHONY: venv venv-test test lint demo clean

venv: $(CORE_STAMP)

venv-test: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The demo needs the package only (no torch); the tests add pytest and torch for the parity tests.
$(CORE_STAMP): pyproject.toml | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	rm -f $(VENV)/.installed-core-*
	touch $@

$(TEST_STAMP): pyproject.toml $(CORE_STAMP)
	$(PY) -m pip install --quiet -e '.[test,torch]'
	rm -f $(VENV)/.installed-test-*
	touch $@

test: venv-test
	$(PY) -m pytest $(PYTEST_ARGS)

lint: venv-test
	$(VENV)/bin/ruff check transformer_jax experiments tests
	$(VENV)/bin/ruff format --check transformer_jax experiments tests
	$(VENV)/bin/mypy

demo: venv
	bash experiments/demo.sh

clean:
	rm -rf $(VENV) runs
