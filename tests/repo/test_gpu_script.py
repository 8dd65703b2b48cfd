"""scripts/gpu.sh's dry run (`.ci/run`: ``GMPO_GPU_DRY_RUN=1 bash scripts/gpu.sh``) checks that
the GPU script's steps run; its per-step limits are the GPU lease's budget and must not fail CI
on a slow or loaded CPU, while a hung step still fails it.

The machine's speed is simulated by a ``timeout`` on PATH that stands for a step taking
``SIMULATED_S`` seconds: past a limit below that it answers as timeout does (124), else 0 without
running the step (the steps themselves run in `.ci/run`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_TIMEOUT = """#!/usr/bin/env bash
limit=$1
echo "$limit" >> "$TIMEOUT_LOG"
[ "$limit" -lt "$SIMULATED_S" ] && exit 124
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on PATH")


def dry_run(tmp_path: Path, simulated_s: int) -> tuple[subprocess.CompletedProcess[str], list[int]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "timeout"
    fake.write_text(FAKE_TIMEOUT)
    fake.chmod(0o755)
    log = tmp_path / "limits.txt"
    env = os.environ | {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "GMPO_GPU_DRY_RUN": "1",
        "PYTHON": sys.executable,
        "SIMULATED_S": str(simulated_s),
        "TIMEOUT_LOG": str(log),
    }
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    limits = [int(line) for line in log.read_text().split()] if log.exists() else []
    return done, limits


def test_dry_run_passes_on_a_slow_cpu(tmp_path: Path) -> None:
    """Every step taking 5 minutes (the lease's limits are about one): the dry run passes."""
    done, limits = dry_run(tmp_path, simulated_s=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(limits) >= 4, limits  # every step ran under timeout
    summary = done.stdout[done.stdout.index("== summary") :].splitlines()
    assert "load average" in summary[0]
    steps = [line for line in summary[1:] if not line.strip().startswith("skipped")]
    assert len(steps) == len(limits) and all(line.strip().startswith("ok") for line in steps)


def test_dry_run_fails_on_a_hung_step(tmp_path: Path) -> None:
    """A step that never ends (a day) still fails the dry run, past its hang guard."""
    done, limits = dry_run(tmp_path, simulated_s=86_400)
    assert done.returncode == 1
    assert "TIMEOUT" in done.stdout
    assert limits and max(limits) < 86_400
