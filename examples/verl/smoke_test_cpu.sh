#!/usr/bin/env bash
# Smoke-test a verl config with loss_mode=gmpo on a laptop's CPU before renting GPUs: verl's own
# trainer (python -m verl.trainer.main_ppo, Ray, rollout, reward, GRPO) for a few small steps.
#
# It catches what a GPU run would hit in its first minutes: a config key verl rejects, a reward
# function that does not load, loss_mode=gmpo not registered, a loss_agg_mode gmpo refuses. It
# says nothing about speed or learning: the rollout is a small Hugging Face sampler, not vLLM.
#
# Needs a clone of this repository with `make setup` (or `pip install -e ".[verl]"`): the pieces
# verl 0.9.1 lacks on CPU (a CPU platform, plain gloo, the small rollout server) are this
# repository's CPU support in verl_cpu/, loaded in every Ray process through
# VERL_USE_EXTERNAL_MODULES.
#
# Usage (Python from $PYTHON, else the clone's .venv, else python3):
#   bash examples/verl/smoke_test_cpu.sh
#       the built-in tiny model and task (about a minute; what CI runs)
#   RESPONSE_LENGTH=64 bash examples/verl/smoke_test_cpu.sh \
#       actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
#       data.train_files=$HOME/data/gsm8k/train.parquet data.val_files=$HOME/data/gsm8k/test.parquet \
#       reward.custom_reward_function.path=my_reward.py \
#       actor_rollout_ref.actor.policy_loss.loss_mode=gmpo \
#       actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean ...
#       your own overrides (those of your GPU command): they go first, then this script's small
#       batch sizes and CPU settings, which win. The model must fit in memory in float32.
# Environment: STEPS (default 3), RESPONSE_LENGTH (default: yours; a CPU samples some tens of
# tokens a second with a 0.5B model), WORKDIR (logs and files; default: a new temporary folder).
#
# On GPUs, run your command as it is (see run_qwen2_5_math_7b_gmpo.sh): nothing of this script
# is needed there; docs/verl.md lists what differs.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python3; fi
fi
WORKDIR=${WORKDIR:-$(mktemp -d -t gmpo_smoke.XXXXXX)}
mkdir -p "$WORKDIR"
STEPS=${STEPS:-3}
support() { PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m verl_cpu.e2e "$@"; }

user=("$@")
if [ ${#user[@]} -eq 0 ]; then  # the tiny task: model, tokenizer, data and reward built here
    mapfile -t user < <(support prepare "$WORKDIR")
fi
mapfile -t smoke < <(support smoke-overrides "$STEPS")
mapfile -t cpu < <(support cpu-overrides)
extra=("hydra.run.dir=$WORKDIR/hydra")
if [ -n "${RESPONSE_LENGTH:-}" ]; then extra+=("data.max_response_length=$RESPONSE_LENGTH"); fi
eval "$(support env)"

echo "gmpo smoke test: $STEPS steps on CPU, log in $WORKDIR/log.txt"
status=0
"$PYTHON" -m verl.trainer.main_ppo "${user[@]}" "${smoke[@]}" "${cpu[@]}" "${extra[@]}" \
    > "$WORKDIR/log.txt" 2>&1 || status=$?
if [ $status -ne 0 ]; then
    echo "FAILED (exit $status); the end of $WORKDIR/log.txt:"
    sed 's/\x1b\[[0-9;]*m//g' "$WORKDIR/log.txt" | grep -v 'UserWarning\|warnings.warn' | tail -40
    exit $status
fi
support summary "$WORKDIR/log.txt"
echo "OK: $STEPS steps with gmpo's metrics"
