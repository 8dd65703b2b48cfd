"""The supervised warm start: the one loop and its settings, for any model and task.

A task (``gmpo_tasks.task.Task``) provides noisy demonstrations (``task.demonstrations(n,
seed=...)``: (prompt, answer) pairs); :func:`warm_start` takes ``settings.steps`` Adam steps on
fresh ones, with the loss a model computes on a batch of them (``batch_loss``: the mean negative
log-likelihood of the answer tokens). The plain-torch study (``studies/stability``) and TRL's
trainers (:func:`warm_start_hf`, a transformers causal LM with a character tokenizer; its cached
form :func:`warm_model`) share it, and its settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gmpo_tasks.chars import DIGITS


def imitation_reward(noise: float, tokens: int, choices: int = len(DIGITS)) -> float:
    """Exact-match reward of a policy that matches noisy demonstrations ``tokens`` characters
    long, each replaced with probability ``noise`` by one of ``choices`` characters: each right
    with probability ``1 - noise + noise / choices``."""
    return (1.0 - noise + noise / choices) ** tokens


@dataclass(frozen=True)
class WarmStart:
    """``steps`` Adam steps at learning rate ``lr`` on ``batch`` fresh demonstrations each."""

    steps: int = 400
    batch: int = 64
    lr: float = 3e-3


#: the warm start of docs/study.md (the study and ``gmpo train --task reverse``)
WARM = WarmStart()


def warm_start(
    params: Iterable[Any],
    batch_loss: Callable[[list[tuple[str, str]]], Any],
    task: Any,
    seed: int,
    settings: WarmStart = WARM,
) -> list[float]:
    """Train ``params`` in place: ``settings.steps`` Adam steps, each on the loss of
    ``settings.batch`` fresh demonstrations of ``task`` (those of ``(seed, step)``); the
    losses."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.Adam(params, lr=settings.lr)
    losses = []
    for step in range(settings.steps):
        loss = batch_loss(task.demonstrations(settings.batch, seed=f"{seed}:{step}"))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return [list(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def demonstration_batch(tokenizer: Any, task: Any, demos: list[tuple[str, str]]) -> tuple[Any, Any]:
    """``(input_ids, labels)`` of demonstrations for a transformers causal LM: each the prompt's
    ``task.prompt_length`` tokens, the answer and, where answers vary in length, the
    end-of-sequence token; right-padded (after the answers, so no position moves), the labels
    -100 on the prompt and the padding (they are not learned).

    Shape:
        Output: (batch, prompt_length + longest answer) each.
    """
    import torch

    eos = [tokenizer.eos_token_id] if task.variable_length else []
    prompts = _ids(tokenizer, [p for p, _ in demos])
    answers = [a + eos for a in _ids(tokenizer, [a for _, a in demos])]
    if any(len(p) != task.prompt_length for p in prompts):
        raise ValueError(f"the {task.name} task's prompts must be {task.prompt_length} tokens")
    width = task.prompt_length + max(len(a) for a in answers)
    ids = torch.full((len(demos), width), tokenizer.pad_token_id)
    labels = torch.full((len(demos), width), -100)
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
    return ids, labels


def warm_start_hf(
    model: Any, tokenizer: Any, task: Any, *, seed: int = 0, settings: WarmStart = WARM
) -> list[float]:
    """:func:`warm_start` of a transformers causal LM (the loss on the answer tokens only)."""
    model.train()

    def batch_loss(demos: list[tuple[str, str]]) -> Any:
        ids, labels = demonstration_batch(tokenizer, task, demos)
        return model(input_ids=ids, labels=labels).loss

    return warm_start(model.parameters(), batch_loss, task, seed, settings)


def sampled_reward(model: Any, tokenizer: Any, task: Any, *, n: int = 256, seed: int = 0) -> float:
    """Mean reward of ``n`` completions of a transformers model, sampled at temperature 1 on
    held-out prompts: each ``task.completion_length`` tokens long (answers of one length), or
    up to it, ending at the end-of-sequence token (answers that vary)."""
    import torch

    prompts = task.prompts(n, seed=f"eval:{seed}")
    torch.manual_seed(seed)
    model.eval()
    fixed = {} if task.variable_length else {"min_new_tokens": task.completion_length}
    with torch.no_grad():
        out = model.generate(
            torch.tensor(_ids(tokenizer, prompts)),
            attention_mask=None,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=task.completion_length,
            **fixed,
        )
    completions = tokenizer.batch_decode(out[:, task.prompt_length :], skip_special_tokens=True)
    return sum(task.reward(prompts, completions)) / n


_WARM_STATES: dict[tuple[Any, int, int], dict[str, Any]] = {}


def warm_model(task: Any, seed: int, *, heads: int) -> tuple[Any, Any]:
    """(model, tokenizer): ``task``'s built-in GPT-2-style model (``heads`` heads, width
    ``task.hidden_size``, ``task.positions`` positions) after the task's warm start, both seeded
    by ``seed``. A warm start is computed once per task (its settings included), seed, heads and
    process (every method of a seed starts from the same model) and reported in one line."""
    from gmpo_tasks.models import gpt2_model

    tokenizer = task.tokenizer()
    net = gpt2_model(
        tokenizer, task.positions, seed=seed, hidden_size=task.hidden_size, heads=heads
    )
    if task.warm.steps == 0:
        return net, tokenizer
    key = (task, seed, heads)
    if key not in _WARM_STATES:
        losses = warm_start_hf(net, tokenizer, task, seed=seed, settings=task.warm)
        start = sampled_reward(net, tokenizer, task, seed=seed)
        print(f"warm start (seed {seed}): {task.warm.steps} supervised steps, loss "
              f"{losses[0]:.2f} -> {losses[-1]:.2f}, sampled reward {start:.3f}")  # fmt: skip
        _WARM_STATES[key] = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(_WARM_STATES[key])
    return net, tokenizer
