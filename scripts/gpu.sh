#!/usr/bin/env bash
# One prepared script for a CUDA machine, at most 5 minutes on one GPU. The machine we are lent
# (one H200, Python 3.12, torch 2.11, Triton, transformers 5.17) has no trl, verl or vLLM; this
# needs none of them. Steps, each under its own time limit:
#
#   1. the gpu-marked tests (tests/core/devices/test_gpu.py): the core on CUDA against the float64 reference,
#      under torch.cuda.set_sync_debug_mode("error") (no host-device synchronization), with KL,
#      token and row weights, dual clip and packed input (cu_seqlens), both paths, fp32 and bf16;
#   2. the device-generic core tests (tests/core/test_properties*.py, plain path) with
#      GMPO_TEST_DEVICE=cuda: every property computed on CUDA tensors;
#   3. the loss benchmark: gmpo plain and compiled, TRL's and verl's GMPO (both transcribed in
#      benchmarks/_hosts.py) -> results/figures-bench/loss_cuda_fp32.{md,json};
#   4. the LM-head benchmark -> results/figures-lm-head/lm_head_cuda.{md,json};
#   5. Liger's fused GRPO loss against gmpo's head+loss at Liger's own shapes (T 1024, H 4096,
#      V 128,256, bf16, B 2-16) -> results/figures-bench/liger_cuda.{md,json}; skipped, with its
#      reason, where liger-kernel is not installed (a pure-Python wheel on torch and Triton:
#      pip install --no-deps liger-kernel==0.8.5, from a wheel carried in where there is no index);
#      gmpo's head with both backward precisions (gmpo_lm_head_backward "half" and "float32");
#   6. the LM head alone in bf16 at Liger's shapes (H 4096, V 128,256, N 2,048 and 16,384): gmpo's
#      token_logprobs with both backward precisions, the materialized head and, where trl is
#      installed, TRL's ChunkedLogProbFunction -> results/figures-lm-head/lm_head_cuda_bf16.*;
#   7. one training step (loss, backward, AdamW) of gmpo_trl's GMPOTrainer with each LM head (its
#      default, the fused Triton head on a GPU; gmpo_lm_head=True; gmpo_core's torch backend;
#      TRL's head, gmpo_lm_head=False), TRL's GRPOTrainer and trl.experimental.gmpo.GMPOTrainer
#      on the same batch, a Qwen3-0.6B-shaped model built from
#      its config (random weights, no hub), bf16: seconds per step and peak memory
#      -> results/figures-lm-head/gpu_step_cuda.*; skipped, with its reason, where trl is not
#      installed (carry its wheel in: pip install --no-deps trl==1.16.0, with accelerate and
#      datasets if missing);
#   8. the fused LM head's tests (tests/core/test_lm_head_triton.py): natively on CUDA (the
#      gpu-marked variants); in the dry run, in Triton's interpreter on the CPU;
#   9. the fused LM head against gmpo_core's torch backend, TRL's head and Liger's (where
#      installed) at head_model.py's three shapes (Qwen3-0.6B, Qwen2.5-1.5B, Qwen2.5-7B; N 4096,
#      bf16): forward+backward time, peak memory, log-prob and entropy error against float64
#      -> results/figures-lm-head/fused_head_cuda.{md,json}; the CUDA default of gmpo_trl's head
#      (docs/lm_head.md, "The fused head") goes back to TRL's if this shows the fused head slower;
#   and the whole log -> results/gpu/gpu_cuda.log.
#
#   bash scripts/gpu.sh                       # on a GPU machine
#   GMPO_GPU_DRY_RUN=1 bash scripts/gpu.sh    # CI: the same steps on the CPU at tiny sizes,
#                                                # the compiled path left out, nothing written
#
# The time limits are the GPU lease's budget and bind only on the GPU. The dry run checks that
# the steps run: it reports each step's time (and the load average), names a step that took
# longer than on an idle CPU, and fails on time only past a hang guard (HANG_GUARD_S per step),
# so a slow or loaded CI machine does not fail it.
#
# Needs: python with torch, numpy, pytest and hypothesis, and this checkout (put on PYTHONPATH
# here). PYTHON selects the interpreter (default: python, else python3). Exit status: 0 when every
# step passed, 1 when a step failed or ran out of time, 2 when it could not start.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/adapters${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-$(command -v python || command -v python3)}
DRY=${GMPO_GPU_DRY_RUN:-0}
[ "$DRY" = "" ] && DRY=0
start=$(date +%s)

missing=$($PY -c "
import importlib.util as u
print(' '.join(m for m in ('torch', 'numpy', 'pytest', 'hypothesis') if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  echo "missing Python modules: $missing (install them, or carry their wheels in)" >&2
  exit 2
fi

if [ "$DRY" != 0 ]; then
  export GMPO_GPU_DRY_RUN=1
  DEVICE=cpu
  SELECT="not compiled"  # compiling on the CPU takes minutes; CI's other steps cover that path
  export HYPOTHESIS_PROFILE=smoke  # a few examples a property
  LOSS=(--quick --shapes 2x16,8x64 --impls "gmpo plain,TRL,verl" --no-write)
  LM_HEAD=(--quick --paths gmpo)
  LIGER=(--quick --paths "gmpo plain,gmpo plain fp32-backward,Liger grpo,Liger dapo,TRL materialized" --no-memory)
  HEAD_BF16=(--quick --dtype bfloat16 --paths gmpo,gmpo-fp32-backward,materialized,trl)
  STEP=(--quick)
  FUSED=(--quick)
  LIMITS=(60 60 60 60 60 60 120 90 60)  # seconds per step
else
  if ! $PY -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    echo "no CUDA device: GMPO_GPU_DRY_RUN=1 bash scripts/gpu.sh is the CPU dry run" >&2
    exit 2
  fi
  DEVICE=cuda
  SELECT=""
  LOSS=(--shapes 64x2048,256x4096,512x8192,1024x16384
        --impls "gmpo plain,gmpo compiled,TRL,verl" --tag cuda_fp32)
  LM_HEAD=(--tokens 1024,4096 --repeats 1 --sweep-repeats 1 --tag cuda)
  LIGER=(--shapes 2x128256,4x128256,8x128256,16x128256 --seq 1024 --hidden 4096
         --dtypes bfloat16 --repeats 3 --tag cuda
         --paths "gmpo plain,gmpo plain fp32-backward,Liger grpo,Liger grpo compiled,Liger dapo,TRL materialized")
  HEAD_BF16=(--tokens 2048,16384 --hidden 4096 --vocab 128256 --dtype bfloat16 --repeats 1
             --sweep-repeats 1 --tag cuda_bf16 --paths gmpo,gmpo-fp32-backward,materialized,trl)
  STEP=(--tag cuda --warmup 1 --repeats 2)
  FUSED=(--tokens 4096 --repeats 2 --tag cuda)
  LIMITS=(55 25 25 25 45 25 45 20 35)  # 300 s, and the start: within five minutes
  mkdir -p results/gpu
  exec > >(tee results/gpu/gpu_cuda.log) 2>&1
fi
export GMPO_TEST_DEVICE=$DEVICE
HANG_GUARD_S=900  # the dry run's only time limit per step: a hang, not a slow CPU

status=0
summary=()
step() {  # step NAME LIMIT_S COMMAND...: run, time, record (LIMIT_S enforced on the GPU only)
  local name=$1 limit=$2
  shift 2
  local enforced=$limit note=""
  if [ "$DRY" != 0 ]; then
    enforced=$HANG_GUARD_S
    echo "== $name (about ${limit} s on an idle CPU; dry run: hang guard ${enforced} s)"
  else
    echo "== $name (limit ${limit} s)"
  fi
  local t0 rc
  t0=$(date +%s)
  timeout "$enforced" "$@"
  rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ "$DRY" != 0 ] && [ "$took" -gt "$limit" ]; then
    note=" (over ${limit} s: a slow or loaded CPU; not a failure in the dry run)"
  fi
  if [ $rc -eq 0 ]; then
    summary+=("ok      ${took} s  $name$note")
  else
    status=1
    [ $rc -eq 124 ] && summary+=("TIMEOUT ${took} s  $name") || summary+=("FAILED  ${took} s  $name (rc $rc)")
  fi
}

echo "== environment (device $DEVICE, dry run $DRY)"
$PY - <<'PY' || exit 2
import platform, datetime, torch
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
PY

step "gpu tests (sync-debug check: padded, packed, KL, weights, dual clip)" "${LIMITS[0]}" \
  $PY -m pytest -q -p no:cacheprovider -m gpu tests/core/devices/test_gpu.py ${SELECT:+-k "$SELECT"}
step "device-generic core tests on $DEVICE (plain path)" "${LIMITS[1]}" \
  $PY -m pytest -q -p no:cacheprovider tests/core/test_properties*.py -k "not compiled"
step "loss benchmark (float32)" "${LIMITS[2]}" \
  $PY benchmarks/bench_loss.py --device "$DEVICE" "${LOSS[@]}"
step "LM-head benchmark" "${LIMITS[3]}" \
  $PY benchmarks/bench_lm_head.py --device "$DEVICE" "${LM_HEAD[@]}"
if $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('liger_kernel') is None)"; then
  step "Liger's fused GRPO loss against gmpo's head+loss (bf16, Liger's shapes)" "${LIMITS[4]}" \
    $PY benchmarks/bench_liger.py --device "$DEVICE" "${LIGER[@]}"
else
  echo "== Liger's fused GRPO loss: skipped: liger-kernel is not installed for $PY"
  summary+=("skipped 0 s  Liger's fused GRPO loss (liger-kernel not installed)")
fi
step "LM head alone in bf16 at Liger's shapes (both backward precisions)" "${LIMITS[5]}" \
  $PY benchmarks/bench_lm_head.py --device "$DEVICE" "${HEAD_BF16[@]}"
if $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('trl') is None)"; then
  step "one training step: GMPOTrainer, GRPOTrainer, TRL's GMPOTrainer (Qwen3-0.6B shape)" \
    "${LIMITS[6]}" $PY benchmarks/bench_gpu_step.py --device "$DEVICE" "${STEP[@]}"
else
  echo "== training step against TRL's trainers: skipped: trl is not installed for $PY"
  summary+=("skipped 0 s  training step against TRL's trainers (trl not installed)")
fi

if $PY -c "import importlib.util as u, sys; sys.exit(u.find_spec('triton') is None)"; then
  step "fused LM head tests (Triton: native on CUDA, its interpreter on the CPU)" "${LIMITS[7]}" \
    $PY -m pytest -q -p no:cacheprovider tests/core/test_lm_head_triton.py
  step "fused LM head vs torch backend, TRL's, Liger's (bf16, three model shapes)" "${LIMITS[8]}" \
    $PY benchmarks/bench_fused_head.py --device "$DEVICE" "${FUSED[@]}"
else
  echo "== fused LM head: skipped: triton is not installed for $PY"
  summary+=("skipped 0 s  fused LM head tests and benchmark (triton not installed)")
fi

load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
echo "== summary (device $DEVICE, dry run $DRY): $(( $(date +%s) - start )) s in all, load average $load"
printf '  %s\n' "${summary[@]}"
exit $status
