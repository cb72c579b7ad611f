# Quick start: `make demo` (train, translate, score the built-in corpus, offline) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?= -n 2 --dist loadgroup --durations=15

.PHONY: venv test demo clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,torch]'
	rm -f $(VENV)/.installed-*
	touch $@

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

demo: venv
	bash experiments/demo.sh

clean:
	rm -rf $(VENV) runs
