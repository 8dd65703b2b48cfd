"""The GPU example script's overrides compose into a valid verl 0.9.1 config (no GPU run).

verl's config classes reject unknown keys; this catches a renamed key or a typo in
``examples/verl`` without running it.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("verl")

from verl.utils.config import omega_conf_to_dataclass

from verl_cpu import e2e as _e2e

pytestmark = pytest.mark.verl

SCRIPT = Path(__file__).parents[2] / "examples" / "verl" / "run_qwen2_5_math_7b_gmpo.sh"


def _overrides(text: str) -> list[str]:
    """The hydra overrides of the script's ``main_ppo`` call, with its shell variables filled in
    (its own simple assignments, list placeholders for the file lists, "1" for the rest)."""
    simple = dict(re.findall(r"^(\w+)=([\w.\-]+)\b", text, re.MULTILINE))
    body = text.split("-m verl.trainer.main_ppo", 1)[1].split('"$@"')[0].replace("\\\n", " ")

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name.endswith("_files"):
            return "['x.parquet']"
        return simple.get(name, "1")

    return shlex.split(re.sub(r"\$\{(\w+)\}|\$(\w+)", value, body))


def test_example_overrides_compose_into_a_gmpo_actor_config() -> None:
    config = _e2e.compose_config(_overrides(SCRIPT.read_text()))
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "gmpo"
    assert actor.loss_agg_mode == "seq-mean-token-mean"
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.4
    assert config.algorithm.adv_estimator == "grpo"
    assert config.actor_rollout_ref.rollout.name == "vllm"
