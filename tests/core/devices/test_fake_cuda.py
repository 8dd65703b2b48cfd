"""The core on CUDA tensors without a GPU: ``FakeTensorMode`` tensors on device ``"cuda"``.

The checks live in tests/core/devices/_fake_cuda_checks.py and run in one child process (a CPU-only torch
aborts the process on some ops on fake CUDA tensors that require grad; no input here requires
grad). Each check is one test here. Covered: the padded plain forward of ``gmpo_loss`` (each
option, and bf16), ``out.metrics``, the stats reductions (``gmpo_core.metrics``) and the public
building blocks. Packed input and ``token_logprobs`` index tensors with ``[]`` (slices of
``cu_seqlens``, chunks of tokens), which a CPU-only torch refuses on a fake CUDA tensor ("PyTorch
is not linked with support for cuda devices": Python indexing enters a CUDA device guard), and a
backward needs inputs that require grad; those are covered on ``meta`` (tests/core/devices/test_devices.py,
tests/core/devices/test_lm_head_devices.py) and by scripts/gpu.sh on a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.core.devices._fake_cuda_checks import CHECKS

ROOT = Path(__file__).resolve().parents[3]

# Python indexing of a fake CUDA tensor (``t[0]``, ``t[1:]``) enters a CUDA device guard, which a
# CPU-only torch does not have ("PyTorch is not linked with support for cuda devices"); on a GPU
# it is fine. The metrics use ``select``/``narrow`` instead, and pass (gmpo_core/metrics.py
# indexed with [] before: these three checks failed).


@pytest.fixture(scope="module")
def results() -> dict[str, dict[str, Any]]:
    paths = [str(ROOT), str(ROOT / "adapters"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.core.devices._fake_cuda_checks"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"the checks' process died ({proc.returncode}):\n{proc.stderr}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["name"]: r for r in lines}


@pytest.mark.parametrize(
    "name",
    CHECKS,
)
def test_on_fake_cuda(results: dict[str, dict[str, Any]], name: str) -> None:
    assert name in results, f"check {name!r} did not report (the process stopped early?)"
    assert results[name]["ok"], results[name]["error"]


def test_every_check_reported(results: dict[str, dict[str, Any]]) -> None:
    assert sorted(results) == sorted(CHECKS)
