# `make test` and `make run` work on a fresh machine: they create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test run lint docs bench clean bytecode

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# Bytecode of src/ written ahead (only what changed): a process started where PYTHONDONTWRITEBYTECODE
# is set (as on some CI machines) would otherwise compile every module it imports on each start,
# ~0.4 s for `finesched serve` and for each server the tests start.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 src

test: $(STAMP) bytecode
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/lint-imports
	$(BIN)/pytest

run: $(STAMP) bytecode
	$(BIN)/python scripts/run_demo.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/lint-imports

# The documentation site (docs/, mkdocs.yml) into site/; a broken link or a warning fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) site build *.egg-info src/*.egg-info .pytest_cache .ruff_cache
