"""A chat task's held-out reward: the model's mean reward on prompts no run trains on, sampled as
training samples them, before and after a run (``summary.json``'s ``held_out_*``).

The prompts are the task's held-out entries (``ChatTask.held_out``: questions of the held-out
class of the task's split, which no training dataset of any seed or size holds, by
construction: ``gmpo_tasks.chat``); each
gets ``samples`` completions of at most the run's ``max_completion_length`` tokens at its
temperature (transformers' ``generate``, the chat template's generation prompt, left padding),
scored by the task's reward. The sampling has its own seed, on the CPU's generator and the
model's device's (:func:`seeded`), and leaves every generator as it was, so that evaluating does
not change the run. On the CPU it decodes on one thread:
decoding is many small operations, and a second thread only waits at each (32 completions of 32
tokens of SmolLM2-135M took 23 s on one thread against 36 s on two, on a loaded 2-core machine).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterator
from typing import Any

#: held-out prompts and samples of each, by default: 128 completions
PROMPTS = 32
SAMPLES = 4
#: the sampling's seed (the same for every run: the same prompts, the same draws for one model)
SEED = 1234


@contextlib.contextmanager
def seeded(device: Any) -> Iterator[None]:
    """The CPU's generator and ``device``'s (the one ``generate`` samples on) seeded with
    :data:`SEED`, and both restored on exit; no other generator is touched (``torch.manual_seed``
    would reseed every accelerator, which ``fork_rng`` restores only where it forks it)."""
    import torch

    if device.type == "cpu":
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(SEED)
            yield
        return
    module = torch.get_device_module(device.type)
    index = device.index
    if index is None:  # MPS has one device and no current_device
        index = module.current_device() if hasattr(module, "current_device") else 0
    with torch.random.fork_rng(devices=[index], device_type=device.type):
        torch.random.default_generator.manual_seed(SEED)
        with module.device(index) if hasattr(module, "device") else contextlib.nullcontext():
            module.manual_seed(SEED)  # the current device's generator only
        yield


def held_out_reward(
    model: Any,
    tokenizer: Any,
    task: Any,
    *,
    max_tokens: int,
    temperature: float,
    prompts: int = PROMPTS,
    samples: int = SAMPLES,
    entries: list[dict[str, Any]] | None = None,
    batch: int = 32,
) -> dict[str, float]:
    """``reward``: the mean reward of ``samples`` completions of each of ``prompts`` held-out
    prompts (or of ``entries``, the calibration's); ``right``: the share of completions whose
    reward is 1 (the right answer)."""
    import torch

    entries = task.held_out(prompts) if entries is None else entries
    rows = [e for e in entries for _ in range(samples)]
    texts = [
        tokenizer.apply_chat_template(task.messages(e), add_generation_prompt=True, tokenize=False)
        for e in rows
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    was_training = model.training
    model.eval()
    threads = torch.get_num_threads()
    if model.device.type == "cpu":  # decoding is many small ops: a second thread only waits
        torch.set_num_threads(1)
    replies: list[str] = []
    try:
        with seeded(model.device), torch.no_grad():
            for i in range(0, len(texts), batch):
                enc = tokenizer(
                    texts[i : i + batch],
                    return_tensors="pt",
                    padding=True,
                    add_special_tokens=False,
                ).to(model.device)
                out = model.generate(
                    **enc,
                    do_sample=True,
                    temperature=temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=max_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
                new = out[:, enc["input_ids"].shape[1] :]
                replies += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
        torch.set_num_threads(threads)
    completions = [[{"role": "assistant", "content": r}] for r in replies]
    rewards = task.reward(texts, completions, entry=[json.dumps(e) for e in rows])
    return {
        "reward": statistics.fmean(rewards),
        "right": statistics.fmean(float(r == 1.0) for r in rewards),
    }
