"""verl's trainer end to end on CPU: ``python -m verl.trainer.main_ppo`` with ``loss_mode=gmpo``.

As a user runs it: the installed package only (verl's ``verl.plugins`` entry point registers the
losses in every Ray worker), a tiny Qwen2 model, its tokenizer, parquet data and a reward
function file built in a temporary folder, GRPO advantages, ``seq-mean-token-mean``, and
off-policy updates (2 mini-batches, 2 epochs per step) so that the clip acts. Three steps on
verl's default v1 trainer with ``loss_mode=gmpo`` and on the legacy trainer
(``trainer.use_v1=False``) with ``loss_mode=gmpo_dual_clip``. A negative control with the entry
points off shows that the entry point is what registered the loss. A legacy run in verl's
rollout-correction bypass mode shows that GMPO's loss is what its actor runs there (verl writes
``loss_mode="bypass_mode"`` into the driver's copy of the config only).

What CPU needs (a platform, plain gloo, a small ``hf`` rollout server) is test support
(``cpu_support.py``, ``hf_rollout.py``), loaded in every process through
``VERL_USE_EXTERNAL_MODULES``; it has no trl workaround: trl and verl share this environment, and
``gmpo_verl.plugin`` itself makes verl work beside trl. The runs take about a minute each.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")
pytest.importorskip("ray")

from tests.verl import _versions
from verl_cpu import e2e as _e2e

if (_missing := _versions.no_cpu_platform() or _versions.no_v1_trainer()) is not None:
    pytest.skip(_missing, allow_module_level=True)

pytestmark = [pytest.mark.verl, pytest.mark.slow]

TIMEOUT = 900
STEPS = 3
GMPO_METRICS = (*_e2e.GMPO_METRICS, "actor/pg_loss", "actor/grad_norm")
# max |p_rollout - p_actor| over the step's tokens (verl's training/rollout_probs_diff_max): both
# in float32, it is ~1e-8 when the rollout samples with the actor's weights (measured: 1.5e-8 to
# 6e-8) and 0.04 on steps 2 and 3 with a rollout that kept the first weights (measured)
SYNCED_PROBS_DIFF = 1e-5
_SYNC = re.compile(r"hf rollout: weights synced \(sync (\d+), global_steps (\d+)")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _e2e.prepare(tmp_path_factory.mktemp("e2e"))


def _train(
    files: dict[str, Path], tmp: Path, *, v1: bool, loss_mode: str, extra: tuple[str, ...] = (),
    **env: str,
) -> tuple[int, str]:  # fmt: skip
    args = [*_e2e.overrides(files, tmp, v1=v1, loss_mode=loss_mode, steps=STEPS), *extra]
    returncode, log = _e2e.run(tmp, args, timeout=TIMEOUT, **env)
    (tmp / "log.txt").write_text(log)
    return returncode, log


@pytest.fixture(scope="module")
def runs(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two trainers, one after the other (each starts its own Ray cluster)."""
    return {
        "v1": _train(files, tmp_path_factory.mktemp("v1"), v1=True, loss_mode="gmpo"),
        "v0": _train(files, tmp_path_factory.mktemp("v0"), v1=False, loss_mode="gmpo_dual_clip"),
    }


def _tail(log: str) -> str:
    return _e2e.plain(log)[-8000:]


@pytest.mark.parametrize("trainer", ["v1", "v0"])
def test_three_steps_with_finite_gmpo_metrics(runs: dict[str, Any], trainer: str) -> None:
    returncode, log = runs[trainer]
    assert returncode == 0, _tail(log)
    for line in _e2e.step_lines(log):
        print(trainer, line[:400])
    steps = _e2e.step_metrics(log)
    assert sorted(steps) == list(range(1, STEPS + 1)), _tail(log)
    keys = GMPO_METRICS + (("actor/pg_clipfrac_dual",) if trainer == "v0" else ())
    for step, metrics in steps.items():
        for key in keys:
            assert key in metrics, (step, key, sorted(metrics))
            assert math.isfinite(metrics[key]), (step, key, metrics[key])
        # off-policy updates: the policy drifted from the rollout's. verl's ppo_kl is the mean of
        # old_log_prob - log_prob (the k1 estimator), whose sign is not fixed: a run had -0.043
        assert metrics["actor/ppo_kl"] != 0, (step, metrics["actor/ppo_kl"])
        assert metrics["actor/log_ratio_min"] < 0 < metrics["actor/log_ratio_max"], step
        for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower"):
            assert 0 <= metrics[key] <= 1, (step, key, metrics[key])
    # the clip acted: some tokens outside exp(+-0.4) with the matching advantage sign
    assert sum(m["actor/pg_clipfrac"] + m["actor/pg_clipfrac_lower"] for m in steps.values()) > 0


@pytest.mark.parametrize("trainer", ["v1", "v0"])
def test_rollout_samples_with_the_updated_weights(runs: dict[str, Any], trainer: str) -> None:
    returncode, log = runs[trainer]
    assert returncode == 0, _tail(log)
    syncs = [(int(n), int(step)) for n, step in _SYNC.findall(_e2e.plain(log))]
    # one sync before each step's generation (and one after the last update)
    assert [step for _, step in syncs][:STEPS] == list(range(STEPS)), syncs
    steps = _e2e.step_metrics(log)
    for step, metrics in steps.items():
        assert metrics["training/rollout_probs_diff_max"] < SYNCED_PROBS_DIFF, (step, metrics)
    assert all(metrics["actor/grad_norm"] > 0 for metrics in steps.values())


def test_without_the_entry_point_loss_mode_gmpo_is_unknown(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """verl's entry points off: the same run stops where the actor looks the loss up. (The trl
    half of the plugin is applied on its own, so that the run gets that far.)"""
    returncode, log = _train(
        files, tmp_path, v1=False, loss_mode="gmpo",
        VERL_USE_EXTERNAL_PLUGINS="none",
        VERL_USE_EXTERNAL_MODULES=f"{_e2e.SUPPORT_MODULE},tests.verl._trl_compat_only",
    )  # fmt: skip
    assert returncode != 0
    assert "Unsupported loss mode: gmpo" in log, _tail(log)
    assert "in ppo_loss" in log  # the actor's loss (verl/workers/utils/losses.py), not the config
    assert not _e2e.step_lines(log)


def test_bypass_mode_runs_gmpo_against_the_rollout_log_probs(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """``algorithm.rollout_correction.bypass_mode=True`` on the legacy trainer: the old log-probs
    are the rollout's (the actor's recomputation is skipped), and verl 0.9.1's
    ``apply_bypass_mode`` writes ``loss_mode="bypass_mode"`` into the driver's copy of the
    policy-loss config. The actor workers keep theirs: GMPO's loss runs, its own metrics on every
    step. A verl that passed the rewritten config on would run ``bypass_mode``'s PPO clip instead,
    and this fails (as it does with ``loss_mode=vanilla``)."""
    returncode, log = _train(
        files, tmp_path, v1=False, loss_mode="gmpo",
        extra=("algorithm.rollout_correction.bypass_mode=True",),
    )  # fmt: skip
    assert returncode == 0, _tail(log)
    steps = _e2e.step_metrics(log)
    assert sorted(steps) == list(range(1, STEPS + 1)), _tail(log)
    for step, metrics in steps.items():
        # GMPO_METRICS holds actor/log_ratio_min and _max, which GMPO's loss logs and verl's
        # built-in ones do not (bypass_mode's ppo_clip, verl's vanilla, logs neither)
        for key in GMPO_METRICS:
            assert key in metrics, (step, key, sorted(metrics))
            assert math.isfinite(metrics[key]), (step, key, metrics[key])
        # logged where the actor recomputes the old log-probs (the v0 run above has it): the
        # comparison of the recomputed ones with the rollout's, which bypass mode skips
        assert "training/rollout_probs_diff_max" not in metrics, (step, sorted(metrics))
        assert metrics["actor/log_ratio_min"] < 0 < metrics["actor/log_ratio_max"], step
