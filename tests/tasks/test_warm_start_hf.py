"""The warm start and the sampled reward of a transformers model read each task's own prompt and
answer lengths (CHANGELOG, Unreleased: both assumed the reverse task's layout, so with ``add`` a
model that always answers right scored 0.0 and the warm start learned prompt positions)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from gmpo_tasks.add import AddTask
from gmpo_tasks.catalog import TASKS
from gmpo_tasks.reverse import ReverseTask
from gmpo_tasks.warm_start import WarmStart, sampled_reward, warm_start_hf

TASKS_TRIED = [AddTask(), ReverseTask(length=5), TASKS["successor"]]


class Oracle(torch.nn.Module):
    """A stand-in causal LM: ``generate`` appends each prompt's right answer; its forward records
    the labels it is given and returns a loss with a gradient."""

    def __init__(self, task: Any, tokenizer: Any) -> None:
        super().__init__()
        self.task, self.tokenizer = task, tokenizer
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.labels: list[torch.Tensor] = []

    def generate(self, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        prompts = self.tokenizer.batch_decode(ids)
        answers = [self.task.target(p) for p in prompts]
        tail = self.tokenizer(answers, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return torch.cat([ids, tail], 1)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> Any:
        self.labels.append(labels)
        return type("Out", (), {"loss": self.weight * 1.0})()


@pytest.mark.parametrize("task", TASKS_TRIED, ids=lambda t: t.name)
def test_a_model_that_always_answers_right_scores_1(task: Any) -> None:
    tokenizer = task.tokenizer()
    assert sampled_reward(Oracle(task, tokenizer), tokenizer, task, n=16) == 1.0


@pytest.mark.parametrize("task", TASKS_TRIED, ids=lambda t: t.name)
def test_the_warm_start_learns_the_answer_tokens_only(task: Any) -> None:
    tokenizer = task.tokenizer()
    model = Oracle(task, tokenizer)
    warm_start_hf(model, tokenizer, task, seed=0, settings=WarmStart(steps=2, batch=4))
    demos = task.demonstrations(4, seed="0:0")
    (labels, *_) = model.labels
    p = task.prompt_length
    assert labels.shape == (4, p + task.completion_length)
    assert (labels[:, :p] == -100).all()  # no prompt position is learned
    for row, (_, answer) in zip(labels, demos, strict=True):
        want = tokenizer(answer, add_special_tokens=False)["input_ids"]
        assert row[p:].tolist()[: len(want)] == want
