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

## the main job: GMPO training (TRL GRPOTrainer + gmpo_core) of an embedded tiny model on a
## toy task, on CPU; metrics.jsonl, metrics.png and the model land in runs/train
train: setup
	$(BIN)/gmpo train --output_dir runs/train

## the test suite (Hypothesis profile "ci": 300 examples a property)
test: setup
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: setup
	$(BIN)/python benchmarks/bench_loss.py
