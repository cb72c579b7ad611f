# Quick start: `make demo` (train, translate, score the built-in corpus, offline) and `make test`.
# Both use the newest Python >= 3.12 on the machine (python3.13, python3.12, pyenv's versions; or PYTHON=...)
# with the newest jax/flax the registry serves; `make test-lowest` runs the suite on Python 3.11 with every core
# dependency at the lower bound of its range in pyproject.toml.
PYTHON ?= $(shell sh .ci/find_python newest)
LOWEST_PYTHON ?= $(shell sh .ci/find_python lowest)
VENV ?= .venv
PY := $(VENV)/bin/python
CONSTRAINTS ?=
HASH := $(shell cat pyproject.toml $(CONSTRAINTS) | cksum | cut -d' ' -f1)
CORE_STAMP := $(VENV)/.installed-core-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)
PIP_INSTALL = $(PY) -m pip install --quiet $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=15

.PHONY: venv venv-test test test-lowest lint demo clean

venv: $(CORE_STAMP)

venv-test: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The demo needs the package only (no torch); the tests add pytest and torch for the parity tests.
$(CORE_STAMP): pyproject.toml $(CONSTRAINTS) | $(VENV)/bin/python
	$(PIP_INSTALL) -e .
	rm -f $(VENV)/.installed-core-*
	touch $@

$(TEST_STAMP): pyproject.toml $(CONSTRAINTS) $(CORE_STAMP)
	$(PIP_INSTALL) -e '.[test,torch]'
	rm -f $(VENV)/.installed-test-*
	touch $@

test: venv-test
	@$(PY) -c "import sys, jax, flax, optax, orbax.checkpoint as ocp; print(f'testing on Python {sys.version.split()[0]} ({sys.executable}): jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__}, orbax-checkpoint {ocp.__version__}')"
	$(PY) -m pytest $(PYTEST_ARGS)

# The lowest supported stack: its own venv, constraints made from pyproject.toml's lower bounds.
.venv-lowest/constraints.txt: pyproject.toml .ci/lowest_pins.py
	mkdir -p .venv-lowest
	$(LOWEST_PYTHON) .ci/lowest_pins.py > $@

test-lowest: .venv-lowest/constraints.txt
	$(MAKE) test VENV=.venv-lowest PYTHON=$(LOWEST_PYTHON) CONSTRAINTS=.venv-lowest/constraints.txt

lint: venv-test
	$(VENV)/bin/ruff check transformer_jax experiments tests .ci
	$(VENV)/bin/ruff format --check transformer_jax experiments tests .ci
	$(VENV)/bin/mypy

demo: venv
	bash experiments/demo.sh

clean:
	rm -rf $(VENV) .venv-lowest runs
