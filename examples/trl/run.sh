#!/usr/bin/env bash
# GMPO with TRL + vLLM on GPUs. NOT run in CI (needs CUDA GPUs, vLLM and the hub).
#
#   pip install -e ".[trl]" vllm math-verify    # in a clone of this repository
#
# Usage: examples/trl/run.sh colocate   # vLLM shares each training GPU (one node, N GPUs)
#        examples/trl/run.sh server     # vLLM on GPU 0 as a server, training on GPUs 1..N-1
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mode="${1:-colocate}"
ngpu="$(nvidia-smi -L | wc -l)"

case "$mode" in
  colocate)
    accelerate launch --num_processes "$ngpu" "$here/train_qwen2_5_math_vllm.py" \
      --use_vllm true --vllm_mode colocate --vllm_gpu_memory_utilization 0.3
    ;;
  server)
    # trl 1.16's `trl vllm-serve` runs vLLM's own server with the weight-sync endpoints TRL needs
    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen2.5-Math-1.5B --port 8000 &
    server=$!
    trap 'kill "$server"' EXIT
    # the trainer waits for the server (up to --vllm_server_timeout seconds)
    CUDA_VISIBLE_DEVICES="$(seq -s, 1 $((ngpu - 1)))" \
      accelerate launch --num_processes "$((ngpu - 1))" "$here/train_qwen2_5_math_vllm.py" \
      --use_vllm true --vllm_mode server --vllm_server_host 127.0.0.1 --vllm_server_port 8000 \
      --vllm_server_timeout 900
    ;;
  *)
    echo "usage: $0 {colocate|server}" >&2
    exit 2
    ;;
esac
