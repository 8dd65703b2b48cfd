"""The end-to-end test's own helpers, fast: the console-line parser, the command line that
``examples/verl/smoke_test_cpu.sh`` calls, and that the trainer's overrides compose into a valid
verl config (the same check as ``test_examples.py``, without running anything)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.verl import _versions
from verl_cpu import e2e as _e2e

SCRIPT = _e2e.REPO / "examples" / "verl" / "smoke_test_cpu.sh"

# what verl's console logger prints through Ray: colours, the actor's prefix, numpy reprs (v0)
LOG = (
    "\x1b[36m(TaskRunner pid=7333)\x1b[0m step:1 - actor/pg_clipfrac:np.float64(0.125) - "
    "actor/pg_clipfrac_lower:0.0 - actor/ppo_kl:np.float64(0.03) - actor/log_ratio_min:-1.5 - "
    "actor/log_ratio_max:0.75 - num_turns/min:np.int32(2) - note:text\n"
    "(TaskRunnerV1 pid=1) Training Progress: 1/3\n"
    "step:2 - actor/pg_clipfrac:nan - actor/pg_clipfrac_lower:0.5 - actor/ppo_kl:1e-3 - "
    "actor/log_ratio_min:-inf - actor/log_ratio_max:2\n"
)


def test_step_metrics_parses_the_console_lines() -> None:
    steps = _e2e.step_metrics(LOG)
    assert sorted(steps) == [1, 2]
    assert steps[1]["actor/pg_clipfrac"] == 0.125
    assert steps[1]["actor/ppo_kl"] == 0.03
    assert steps[1]["num_turns/min"] == 2.0
    assert "note" not in steps[1]  # not a number
    assert steps[2]["actor/ppo_kl"] == 1e-3
    assert steps[2]["actor/log_ratio_min"] == float("-inf")
    assert steps[2]["actor/pg_clipfrac"] != steps[2]["actor/pg_clipfrac"]  # nan kept, to fail on
    assert _e2e.step_lines(LOG)[0].startswith("step:1 - actor/pg_clipfrac:np.float64(0.125)")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "verl_cpu.e2e", *args], capture_output=True, text=True,
        timeout=120, cwd=_e2e.REPO,
        env=os.environ | {"PYTHONPATH": str(_e2e.REPO)},
    )  # fmt: skip


def test_summary_fails_without_gmpo_metrics(tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    ok = _cli("summary", str(log))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0].startswith("step:1 actor/pg_clipfrac:0.125")
    log.write_text("step:1 - actor/pg_loss:0.5 - actor/grad_norm:1.0\n")  # e.g. loss_mode=vanilla
    missing = _cli("summary", str(log))
    assert missing.returncode == 1
    assert "is loss_mode=gmpo set?" in missing.stdout


def test_smoke_script_parses_and_its_commands_exist() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], timeout=60).returncode == 0
    assert _cli("cpu-overrides").stdout.split() == list(_e2e.CPU_OVERRIDES)
    assert "trainer.total_training_steps=5" in _cli("smoke-overrides", "5").stdout.split()
    env = _cli("env").stdout
    assert f"export VERL_USE_EXTERNAL_MODULES={_e2e.SUPPORT_MODULE}" in env
    assert _cli("no-such-command").returncode == 2


def test_overrides_compose_into_a_gmpo_config(tmp_path: Path) -> None:
    pytest.importorskip("verl")
    if (reason := _versions.no_v1_trainer()) is not None:
        pytest.skip(reason)
    from verl.utils.config import omega_conf_to_dataclass

    files = {k: tmp_path / k for k in ("model", "tokenizer", "data", "reward")}
    config = _e2e.compose_config(
        _e2e.overrides(files, tmp_path, v1=False, loss_mode="gmpo_dual_clip")
    )
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "gmpo_dual_clip"
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert actor.ppo_epochs == 2 and actor.ppo_mini_batch_size == 2
    assert config.actor_rollout_ref.rollout.name == "hf"
    assert config.trainer.use_v1 is False


def test_cpu_support_names_the_verl_internal_that_moved() -> None:
    """In a subprocess: importing the support registers a platform and patches verl."""
    pytest.importorskip("verl")
    if (reason := _versions.no_cpu_platform()) is not None:
        pytest.skip(reason)
    code = (
        "from verl_cpu.cpu_support import VerlMovedError, _require\n"
        "try:\n    _require('verl.utils.distributed', 'no_such_function')\n"
        "except VerlMovedError as e:\n    print(e)\n"
        "try:\n    _require('verl.no_such_module', 'x')\n"
        "except VerlMovedError as e:\n    print(e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        cwd=_e2e.REPO, env=os.environ | {"PYTHONPATH": str(_e2e.REPO), "VERL_PLATFORM": "cpu"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "verl.utils.distributed.no_such_function is gone" in lines[0]
    assert "cannot import verl.no_such_module" in lines[1]
