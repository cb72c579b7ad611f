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
# Installs retry: pip's own retries per request, its resumption of a broken download, then .ci/retry's whole reruns.
# PIP_NETWORK: what the pip of a new venv, before its upgrade, knows too.
PIP_NETWORK = --retries 10 --timeout 60
PIP_RETRIES = $(PIP_NETWORK) --resume-retries 20
PIP_INSTALL = sh .ci/retry $(PY) -m pip install --quiet $(PIP_RETRIES) $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=15

.PHONY: venv venv-test test test-lowest test-isa test-plan lint demo clean

venv: $(CORE_STAMP)

venv-test: $(TEST_STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	sh .ci/retry $(PY) -m pip install --quiet $(PIP_NETWORK) --upgrade pip

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

# The suite must pass on every x86 CPU of the machines it runs on (AVX-512 and AMX Xeons, AVX-512 EPYCs); their
# kernels round differently. This reruns the tests marked `rounding` (a training outcome, two engines' agreement)
# with XLA, torch and CTranslate2 held to AVX2 kernels, so a test that depends on the CPU fails here first.
ISA_FLAGS := XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2 CT2_FORCE_CPU_ISA=AVX2
test-isa: venv-test
	$(ISA_FLAGS) $(PY) -m pytest -m rounding $(PYTEST_ARGS)

# The lowest supported stack: its own venv, constraints made from pyproject.toml's lower bounds; the notebooks and
# the device benchmark's smoke run (marked newest_stack) run on the newest stack only.
.venv-lowest/constraints.txt: pyproject.toml .ci/lowest_pins.py
	mkdir -p .venv-lowest
	$(LOWEST_PYTHON) .ci/lowest_pins.py > $@

test-lowest: .venv-lowest/constraints.txt
	$(MAKE) test VENV=.venv-lowest PYTHON=$(LOWEST_PYTHON) CONSTRAINTS=.venv-lowest/constraints.txt \
		PYTEST_ARGS="$(PYTEST_ARGS) -m 'not stress and not newest_stack'"

# Planning pod runs on this machine (transformer_jax/plan/) compiles for TPU slices with the TPU compiler, libtpu,
# which runs without a TPU, and for NVIDIA GPUs with jax's CUDA plugin, which runs without a GPU or CUDA; its own
# venv, as each jax release pins one libtpu and one plugin. TPU_JAX is the newest jax whose libtpu the registry serves
# (jax 0.12.1 pins libtpu 0.0.53, not published yet; unpinned, pip backtracks for many minutes).
TPU_VENV ?= .venv-tpu
TPU_JAX ?= jax[tpu,cuda12-local]==0.12.0.1
TPU_STAMP := $(TPU_VENV)/.installed-$(HASH)

$(TPU_VENV)/bin/python:
	$(PYTHON) -m venv $(TPU_VENV)
	sh .ci/retry $(TPU_VENV)/bin/python -m pip install --quiet $(PIP_NETWORK) --upgrade pip

$(TPU_STAMP): pyproject.toml | $(TPU_VENV)/bin/python
	sh .ci/retry $(TPU_VENV)/bin/python -m pip install --quiet $(PIP_RETRIES) -e . 'pytest>=8,<10' 'pytest-xdist>=3.5,<4' '$(TPU_JAX)'  # the planner's tests need no more
	rm -f $(TPU_VENV)/.installed-*
	touch $@

# Two pytest workers each load libtpu, which by default allows one process a machine.
test-plan: $(TPU_STAMP)
	ALLOW_MULTIPLE_LIBTPU_LOAD=1 JAX_PLATFORMS=cpu $(TPU_VENV)/bin/python -m pytest tests/test_plan.py -n 2 --durations=5

lint: venv-test
	$(VENV)/bin/ruff check transformer_jax experiments tests .ci
	$(VENV)/bin/ruff format --check transformer_jax experiments tests .ci
	$(VENV)/bin/mypy

demo: venv
	bash experiments/demo.sh

clean:
	rm -rf $(VENV) .venv-lowest $(TPU_VENV) runs
