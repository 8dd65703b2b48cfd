#!/usr/bin/env bash
# GMPO with verl: GRPO advantages, vLLM rollout, Qwen2.5-Math-7B, GSM8K + MATH.
#
# NOT RUN IN CI: needs GPUs (8 x 80 GB by default), vLLM and the model weights. CI runs verl's
# trainer with the same loss on CPU (tests/verl/test_main_ppo.py); smoke_test_cpu.sh runs this
# command's overrides on a laptop for a few small steps (docs/verl.md).
#
# Setup:
#   pip install -e ".[verl]" vllm               # in a clone; the install registers loss_mode=gmpo
#   # data, with verl's own preprocessing scripts (verl repository, examples/data_preprocess/):
#   python examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k
#   python examples/data_preprocess/math_dataset.py --local_save_dir ~/data/math
#
# Usage: bash examples/verl/run_qwen2_5_math_7b_gmpo.sh [extra hydra overrides...]
# Compared with verl's examples/gmpo_trainer/run_qwen2_5-7b_math.sh the only algorithmic change is
# loss_mode=geo_mean -> loss_mode=gmpo, plus an explicit loss_agg_mode (see docs/verl.md).
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-Math-7B}
DATA_DIR=${DATA_DIR:-$HOME/data}
N_GPUS=${N_GPUS:-8}
NNODES=${NNODES:-1}
PROJECT=${PROJECT:-gmpo_verl}
EXPERIMENT=${EXPERIMENT:-qwen2_5_math_7b_gmpo}

train_files="['$DATA_DIR/gsm8k/train.parquet', '$DATA_DIR/math/train.parquet']"
test_files="['$DATA_DIR/gsm8k/test.parquet', '$DATA_DIR/math/test.parquet']"

# GMPO (arXiv 2507.20673): log-space clip exp(+-0.4), the paper's sequence mean, no KL loss
loss_mode=gmpo                      # was: geo_mean
loss_agg_mode=seq-mean-token-mean   # the paper's objective (verl's default is token-mean)
clip_ratio=0.4                      # under loss_mode=gmpo a log-space bound

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=3072 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.policy_loss.loss_mode=${loss_mode} \
    actor_rollout_ref.actor.loss_agg_mode=${loss_agg_mode} \
    actor_rollout_ref.actor.clip_ratio_low=${clip_ratio} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_ratio} \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name="$PROJECT" \
    trainer.experiment_name="$EXPERIMENT" \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.save_freq=50 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 "$@"
