# `make test` and `make demo` work on a fresh machine: they create (or reuse) .venv and
# install the package with every backend and the dev tools, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo install lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/hyflash demo

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
