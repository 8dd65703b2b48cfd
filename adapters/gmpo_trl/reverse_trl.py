"""The reverse-digits task (:mod:`gmpo_trl.reverse`) for TRL's trainers: the pieces that
``gmpo compare --task reverse`` / ``gmpo train --task reverse`` put together.

- :func:`reverse_model`: the toy's character tokenizer and a tiny GPT-2-style model sized for
  the task (learned positions, as the study's model), built in-process;
- :func:`warm_start`: the supervised warm start on the task's noisy demonstrations, applied to
  that (or any causal LM with a character tokenizer), seeded; :func:`sampled_reward` measures it;
  :func:`warm_model` is both, ``(model, tokenizer)`` for a seed;
- :func:`reverse_dataset`: a ``datasets.Dataset`` of prompts;
- :func:`reverse_args`: ``GMPOConfig`` / ``GRPOConfig`` keyword arguments of the stability
  study's setting (benchmarks/stability.py): 16 prompts x 8 completions a generation and 16
  optimizer steps on each (``steps_per_generation=8`` slices of 16 completions,
  ``num_iterations=2`` passes), temperature 1, constant learning rate 2e-3, no gradient
  clipping.

The reward function is :func:`gmpo_trl.reverse.reward` (exact match) or
:func:`gmpo_trl.reverse.partial_reward`: ``task.reward_function()``.
"""

from __future__ import annotations

from typing import Any

from gmpo_trl import toy
from gmpo_trl.reverse import ReverseTask


def reverse_model(
    task: ReverseTask, *, seed: int = 0, hidden_size: int = 64, heads: int = 4
) -> tuple[Any, Any]:
    """(tokenizer, model): the toy's character tokenizer and a 2-layer GPT-2-style model
    (``heads`` heads, 4 by default; learned positions, tied embeddings, no dropout: the study's
    model in transformers' classes) with room for a prompt of ``L + 1`` and a completion of
    ``L`` tokens.

    Learned absolute positions, not the toy's rotary Qwen2: reversing needs the output at
    position ``L + 1 + i`` to find the prompt's position ``L - 1 - i``, which a rotary model of
    this size did not learn (its warm-start loss stalled near 1.2 after 1200 steps, reward 0);
    this one reaches the demonstrations' entropy (about 0.5) within 400 steps."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = toy.char_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=hidden_size,
        n_layer=2,
        n_head=heads,
        n_inner=4 * hidden_size,
        n_positions=2 * task.length + 8,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return tokenizer, model


def _ids(tokenizer: Any, texts: list[str]) -> Any:
    return tokenizer(texts, return_tensors="pt", add_special_tokens=False)["input_ids"]


def warm_start(
    model: Any,
    tokenizer: Any,
    task: ReverseTask,
    *,
    steps: int = 400,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Supervised training of ``model`` in place on fresh noisy demonstrations (the loss on the
    completion tokens only), ``steps`` Adam steps of ``batch`` demonstrations; the losses."""
    import torch

    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        demos = task.demonstrations(batch, seed=f"{seed}:{step}")
        ids = _ids(tokenizer, [p + c for p, c in demos])  # (batch, 2L + 1): no padding
        labels = ids.clone()
        labels[:, : task.length + 1] = -100  # the prompt and '=' are not learned
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def sampled_reward(model: Any, tokenizer: Any, task: ReverseTask, *, n: int = 256,
                   seed: int = 0) -> float:  # fmt: skip
    """Mean reward of ``n`` completions sampled at temperature 1 on held-out prompts."""
    import torch

    prompts = task.prompts(n, seed=f"eval:{seed}")
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            _ids(tokenizer, prompts),
            attention_mask=None,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=task.length,
            min_new_tokens=task.length,
        )
    completions = tokenizer.batch_decode(out[:, task.length + 1 :], skip_special_tokens=True)
    return sum(task.reward(prompts, completions)) / n


def warm_model(task: ReverseTask, seed: int, *, steps: int = 400) -> tuple[Any, Any]:
    """(model, tokenizer): :func:`reverse_model` after :func:`warm_start`, both seeded by
    ``seed``; the order of a CLI ``Task``'s ``model(seed)``."""
    tokenizer, model = reverse_model(task, seed=seed)
    warm_start(model, tokenizer, task, steps=steps, seed=seed)
    return model, tokenizer


def reverse_dataset(task: ReverseTask, n: int = 2048, *, seed: int = 0) -> Any:
    """``n`` prompts of the task as a ``datasets.Dataset`` with a ``prompt`` column."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": task.prompts(n, seed=f"train:{seed}")})


def reverse_args(
    output_dir: str, task: ReverseTask, *, rollouts: int = 100, **overrides: Any
) -> dict[str, Any]:
    """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of the study's setting: ``rollouts``
    generations of 16 prompts x 8 completions, 16 optimizer steps (of 16 completions) on each,
    learning rate 2e-3 (where the study's methods separate most: docs/study.md), no gradient
    clipping (``max_grad_norm=0``). Give GRPOConfig ``loss_type="grpo"`` for the study's
    ``grpo``."""
    steps_per_generation, num_iterations = 8, 2
    args = toy.toy_args(
        output_dir,
        per_device_train_batch_size=16,
        steps_per_generation=steps_per_generation,
        num_iterations=num_iterations,
        num_generations=8,
        max_completion_length=task.length,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=2e-3,
        max_grad_norm=0.0,
        max_steps=rollouts * steps_per_generation * num_iterations,
        logging_steps=steps_per_generation * num_iterations,
    )
    args.update(overrides)
    return args
