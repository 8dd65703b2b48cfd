#!/usr/bin/env bash
# One prepared script for a CUDA machine (the one we are lent has no trl, verl or vLLM; this needs
# none of them). Runs the gpu-marked tests, then the core loss benchmark (float32 and bf16) and,
# when present, the LM-head benchmark at GPU sizes, and prints one table with the versions.
#
#   bash benchmarks/gpu.sh            # writes benchmarks/results/*_cuda*.{md,json}
#
# Needs: python with torch (CUDA), numpy, pytest, hypothesis, and this checkout on PYTHONPATH.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/adapters${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
status=0

echo "== environment"
$PY - <<'PY'
import platform, torch
print("date", __import__("datetime").datetime.now().isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
print("gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NONE")
PY

echo "== gpu tests"
$PY -m pytest -q -m gpu -p no:cacheprovider tests || status=1

echo "== loss benchmark (float32)"
SHAPES=64x2048,256x4096,512x8192,1024x16384
$PY benchmarks/bench_loss.py --device cuda --shapes "$SHAPES" --impls "gmpo plain,gmpo compiled,TRL" --tag cuda_fp32 || status=1


if [ -f benchmarks/bench_lm_head.py ]; then
  echo "== LM-head benchmark"
  $PY benchmarks/bench_lm_head.py --device cuda || status=1
fi
exit $status
