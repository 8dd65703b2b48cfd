# Every target sets up what it needs (a local .venv with the tested versions) on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup train test lint docs bench

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,trl,verl]"
	touch $(STAMP)

## the main job: GMPO training on an embedded toy task, on CPU
train: setup
	$(BIN)/python examples/core_demo.py

## the test suite (Hypothesis profile "ci": 300 examples a property)
test: setup
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: setup
	$(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/bench_loss.py
