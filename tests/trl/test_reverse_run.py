"""gmpo_tasks.reverse through ``Task``: the reverse task's model, warm start, dataset and trainer
arguments, and one rollout of GMPOTrainer on it (16 optimizer steps on one generation)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

import dataclasses

from gmpo_tasks.reverse import ReverseTask, reward
from gmpo_tasks.warm_start import WarmStart, sampled_reward
from gmpo_tasks.warm_start import warm_start_hf as warm_start
from gmpo_trl import GMPOConfig, GMPOTrainer

pytestmark = pytest.mark.trl

TASK = ReverseTask(length=4)
UPDATES = 16  # optimizer steps a rollout: minibatches x epochs


def reverse_model(task: ReverseTask, seed: int):  # type: ignore[no-untyped-def]
    """(tokenizer, model) of the task, untrained."""
    model, tok = dataclasses.replace(task, warm=WarmStart(steps=0)).model(seed)
    return tok, model


def warm_model(task: ReverseTask, seed: int, settings: WarmStart):  # type: ignore[no-untyped-def]
    return dataclasses.replace(task, warm=settings).model(seed)


def reverse_args(out: str, task: ReverseTask, rollouts: int, **kw):  # type: ignore[no-untyped-def]
    return task.trainer_args(out, max_steps=rollouts * UPDATES, **kw)


def test_warm_start_learns_the_demonstrations_and_is_seeded() -> None:
    tok, model = reverse_model(TASK, seed=0)
    assert set("0123456789=abcde") <= set(tok.get_vocab())
    losses = warm_start(model, tok, TASK, seed=0, settings=WarmStart(steps=60, batch=32))
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    tok2, model2 = reverse_model(TASK, seed=0)
    assert warm_start(
        model2, tok2, TASK, seed=0, settings=WarmStart(steps=3, batch=8)
    ) == warm_start(
        reverse_model(TASK, seed=0)[1], tok2, TASK, seed=0, settings=WarmStart(steps=3, batch=8)
    )
    assert 0.0 <= sampled_reward(model, tok, TASK, n=16) <= 1.0
    m1, _ = warm_model(TASK, 3, settings=WarmStart(steps=2))
    m2, _ = warm_model(TASK, 3, settings=WarmStart(steps=2))
    assert all(a.equal(b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))


def test_dataset_and_arguments_give_the_study_setting(tmp_path: Path) -> None:
    data = TASK.dataset(0, n=32)
    assert data.column_names == ["prompt"] and data["prompt"] == TASK.dataset(0, n=32)["prompt"]
    assert data["prompt"] != TASK.dataset(1, n=32)["prompt"]
    args = GMPOConfig(**reverse_args(str(tmp_path), TASK, rollouts=3))
    assert args.generation_batch_size == 128 and args.num_generations == 8  # 16 prompts x 8
    assert args.steps_per_generation * args.num_iterations == 16  # optimizer steps a rollout
    assert args.max_steps == 48 and args.max_grad_norm == 0.0 and args.epsilon == 0.4
    assert args.learning_rate == 2e-3 and args.lr_scheduler_type == "constant"


def test_one_rollout_of_gmpo_on_the_task(tmp_path: Path) -> None:
    tok, model = reverse_model(TASK, seed=0)
    warm_start(model, tok, TASK, seed=0, settings=WarmStart(steps=40, batch=32))
    args = GMPOConfig(**reverse_args(str(tmp_path), TASK, rollouts=1, gmpo_impl="plain"))
    trainer = GMPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=TASK.dataset(0, n=64),
        processing_class=tok,
    )
    trainer.train()
    assert trainer.state.global_step == 16
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and 0.0 <= logged[-1]["reward"] <= 1.0
    # off-policy passes: the second pass over a generation sees r != 0
    assert any(h.get("log_ratio/max", 0.0) > 0 for h in trainer.state.log_history)
