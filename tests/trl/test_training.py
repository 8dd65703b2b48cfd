"""Whole training runs on CPU: learning, gradient accumulation, resume, LoRA, num_iterations.

Each run trains the tiny model of ``gmpo_tasks.successor`` on the successor task for a handful of steps
(a step takes tens of milliseconds); the end-to-end run takes a few seconds.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import torch

from tests.trl._support import make_trainer

pytestmark = pytest.mark.trl


def history(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


def params(trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


def assert_same_params(a: dict, b: dict, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


def test_reward_rises_on_the_toy_task(tmp_path):
    """End to end: GMPO takes the successor task's mean reward from under 0.2 to over 0.8
    within 150 steps (seed 0; measured 0.045 over the first ten steps, 0.989 over the last ten)."""
    trainer = make_trainer(tmp_path)
    trainer.train()
    reward = history(trainer, "reward")
    assert len(reward) == 150
    first, last = sum(reward[:10]) / 10, sum(reward[-10:]) / 10
    assert first < 0.2, reward[:10]
    assert last > 0.8, reward[-10:]
    logged = trainer.state.log_history[-2]
    for key in ("log_ratio/min", "log_ratio/max", "clip_ratio/region_mean", "entropy"):
        assert key in logged


SMALL = dict(max_completion_length=3, max_steps=2, optim="sgd", learning_rate=0.5)


def spread_reward(prompts: list[str], completions: list[str], **_) -> list[float]:
    """A dense reward (varies with the first character), so that every group has an advantage."""
    return [(ord(c[:1] or " ") % 7) / 6 for c in completions]


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    """1 x B and 2 x B/2 give the same parameters after two optimizer steps (the generation
    batch, and so the completions, are the same; each micro-batch's mean is divided by 2)."""
    # build and train one after the other: construction seeds the global RNG, which sampling reads
    one = make_trainer(
        tmp_path / "one", reward=spread_reward, per_device_train_batch_size=16, **SMALL
    )
    before = params(one)
    one.train()
    two = make_trainer(
        tmp_path / "two", reward=spread_reward, per_device_train_batch_size=8,
        gradient_accumulation_steps=2, **SMALL,
    )  # fmt: skip
    two.train()
    assert history(one, "reward") == history(two, "reward")
    after = params(one)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert_same_params(after, params(two))


def test_resume_from_checkpoint_continues_identically(tmp_path):
    config = dict(
        max_completion_length=3, max_steps=4, save_strategy="steps", save_steps=2,
        use_adaptive_entropy=True, entropy_target=3.2, entropy_coef_delta=0.01, num_iterations=2,
    )  # fmt: skip
    straight = make_trainer(tmp_path / "a", reward=spread_reward, **config)
    before = params(straight)
    straight.train()
    assert any(not torch.equal(before[n], p) for n, p in params(straight).items())
    resumed = make_trainer(tmp_path / "b", reward=spread_reward, **config)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-2"))
    assert_same_params(params(straight), params(resumed))
    assert resumed.entropy_coef == pytest.approx(straight.entropy_coef)
    assert history(resumed, "reward") == history(straight, "reward")  # 1-2 restored, 3-4 new


def test_lora_training(tmp_path):
    """A LoRA peft_config trains the adapters only; beta's reference is the adapter-free model."""
    LoraConfig = pytest.importorskip("peft").LoraConfig

    trainer = make_trainer(
        tmp_path, max_completion_length=3, max_steps=3, beta=0.05, learning_rate=0.05,
        trainer_kwargs={"peft_config": LoraConfig(r=4, target_modules=["q_proj", "v_proj"])},
    )  # fmt: skip
    before = params(trainer)
    trainer.train()
    after = params(trainer)
    lora = [n for n in before if "lora_" in n]
    assert lora and all(not n.startswith("lora") for n in before if "lora_" not in n)
    assert any(not torch.equal(before[n], after[n]) for n in lora)
    assert all(torch.equal(before[n], after[n]) for n in before if "lora_" not in n)
    assert all(k >= 0 for k in history(trainer, "kl"))


def test_num_iterations_reuses_the_batch_off_policy(tmp_path):
    """num_iterations=2: the second pass over a generation batch sees log-ratios != 0, and the
    KL to the reference model (beta) is logged."""
    trainer = make_trainer(
        tmp_path, max_completion_length=3, max_steps=4, num_iterations=2, beta=0.05,
        learning_rate=0.05,
    )  # fmt: skip
    trainer.train()
    ranges = [
        hi - lo
        for lo, hi in zip(
            history(trainer, "log_ratio/min"), history(trainer, "log_ratio/max"), strict=True
        )
    ]
    assert ranges[0] == 0 and max(ranges[1:]) > 0
    assert max(history(trainer, "kl")) > 0
