# Every target sets up what it needs (a local .venv with the tested versions) on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup train test lint docs docs-serve bench figures figures-trl figures-lm-head figures-verl figures-bench figures-study first-run check-numbers

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@echo "make setup: installing the tested versions into $(VENV) (the first time: minutes, quietly;"
	@echo "            see README.md, 'The first run installs first')"
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

## the docs site at http://127.0.0.1:8000 (what `mkdocs serve` would be with the .venv's mkdocs)
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: setup
	$(BIN)/python benchmarks/bench_loss.py

## every measured number and figure that README.md, docs/trl.md, docs/lm_head.md, docs/verl.md,
## docs/benchmarks.md and docs/study.md quote:
## results/ (gmpo train, gmpo compare --seeds 5, the first-run cost), benchmarks/results/ (the
## LM-head benchmarks), results/study/ (the stability study) and docs/img/; about 105 minutes on
## two cores. Each step is a target of its own; add a page's commands as a new figures-* target
## and list it here.
## `make check-numbers` (and tests/test_doc_numbers.py) checks the pages against the results.
figures: figures-trl figures-lm-head figures-verl figures-bench figures-study first-run

SEEDS ?= 5
figures-trl: setup
	rm -rf runs/figures
	$(BIN)/gmpo train --output_dir runs/figures/train
	$(BIN)/gmpo compare --seeds $(SEEDS) --output_dir runs/figures/compare
	mkdir -p results
	cp runs/figures/train/summary.json results/train.json
	cp runs/figures/train/summary.md results/train.md
	cp runs/figures/compare/summary.json results/compare_seeds$(SEEDS).json
	cp runs/figures/compare/summary.md results/compare_seeds$(SEEDS).md
	cp runs/figures/train/metrics.png docs/img/trl_train.png
	cp runs/figures/compare/compare.png docs/img/trl_compare.png

figures-lm-head: setup
	$(BIN)/python benchmarks/bench_lm_head.py --repeats 3 --sweep-repeats 2
	$(BIN)/python benchmarks/bench_lm_head.py --outputs logp+entropy --tokens 4096 --repeats 2 \
		--tag cpu_entropy
	$(BIN)/python benchmarks/bench_trainer_step.py

## docs/verl.md's numbers: verl's trainer on CPU (3 steps of the v1 trainer with loss_mode=gmpo,
## 3 of use_v1=False with gmpo_dual_clip) and the FSDP2 engine's grad norms (torchrun, 1 and 2
## processes); results/verl_cpu.md and .json, the logs in runs/figures-verl. Minutes.
figures-verl: setup
	$(BIN)/python scripts/verl_cpu.py

## docs/benchmarks.md's numbers: the loss benchmark (time per call against TRL's and verl's
## GMPO, memory, compile time and break-even; packed against padded sequences);
## benchmarks/results/loss_cpu.* and packed_cpu.*. Minutes.
figures-bench: setup
	$(BIN)/python benchmarks/bench_loss.py
	$(BIN)/python benchmarks/bench_packed.py

## docs/study.md's numbers and figure: the stability study, GRPO against GMPO (6 methods x 4
## learning rates x without/with gradient clipping x 5 seeds, 240 runs of a tiny transformer
## reversing 16 digits; about 35 minutes of two idle cores). results/study/ (summary.md,
## summary.json, curves.jsonl), results/study/variants/ (every method at 2e-3 and 1e-3, from the
## same runs) and docs/img/study_stability.png; the runs in runs/figures-study (a rerun reuses
## every finished run: delete the directory to start afresh).
figures-study: setup
	$(BIN)/python benchmarks/stability.py --curves-lr 2e-3 --out runs/figures-study
	mkdir -p results/study
	cp runs/figures-study/summary.md runs/figures-study/summary.json results/study/
	cp runs/figures-study/curves.jsonl results/study/
	cp runs/figures-study/stability.png docs/img/study_stability.png
	$(BIN)/python benchmarks/stability.py --lr 2e-3,1e-3 --curves-lr 2e-3 --out runs/figures-study
	mkdir -p results/study/variants
	cp runs/figures-study/summary.md runs/figures-study/summary.json results/study/variants/

## the README's first-run cost: a fresh clone, `make train` (which runs `make setup`), timed;
## results/first_run.md. COLD=1 gives pip an empty download cache (downloads everything).
first-run:
	scripts/first_run.sh

check-numbers:
	$(PY) scripts/doc_numbers.py
