"""A tiny Qwen2-style model, a character tokenizer and a toy verifiable task, built in-process.

Nothing here touches the network: the model is built from a ``Qwen2Config`` with random weights
and the tokenizer from the ``tokenizers`` library. Tests, the ``gmpo`` command and the examples
share these builders so that "the default run" means one thing everywhere.

The task ("successor"): the prompt is a digit ``d`` followed by ``=``; the completion is correct
when its first character is the digit ``(d + 1) % 10``. A random policy over the vocabulary is
right about 1 time in 20, so the reward starts near 0.05; with :func:`toy_args` GMPO takes the
mean of the last ten of 150 steps above 0.8 in seconds on a CPU (``tests/trl/test_training.py``).
"""

from __future__ import annotations

import random
from typing import Any

DIGITS = "0123456789"
# a small alphabet: the digits, '=' and a few distractors; specials first
CHARS = DIGITS + "=+abcdefgh"
SPECIALS = ("<pad>", "<eos>")


def char_tokenizer(vocab_size: int | None = None) -> Any:
    """A left-padding character tokenizer (``PreTrainedTokenizerFast``), built without the hub.
    ``vocab_size`` pads the vocabulary with dummy tokens ``<xI>`` (a model with a large head)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = (*SPECIALS, *CHARS)
    if vocab_size is not None and vocab_size < len(base):
        raise ValueError(f"vocab_size must be at least {len(base)}, got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(base)}
    vocab.update({f"<x{i}>": i for i in range(len(base), vocab_size or 0)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )
    return tok


def tiny_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    layers: int = 2,
    max_len: int = 64,
    heads: int = 4,
) -> Any:
    """A randomly initialized Qwen2-style causal LM sized for CPU tests (about 30k parameters).
    ``heads`` attention heads (half as many key/value heads, at least 1)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=max_len,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def successor_dataset(n: int = 256, *, seed: int = 0) -> Any:
    """``n`` prompts ``"d="`` with ``d`` uniform over the digits (a ``datasets.Dataset``)."""
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"prompt": [f"{rng.choice(DIGITS)}=" for _ in range(n)]})


def successor_reward(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """1.0 when the completion starts with the successor of the prompt's digit, else 0.0."""
    out = []
    for prompt, completion in zip(prompts, completions, strict=True):
        want = str((int(prompt[0]) + 1) % 10)
        out.append(1.0 if completion[:1] == want else 0.0)
    return out


def toy_args(output_dir: str, **overrides: Any) -> dict[str, Any]:
    """``GMPOConfig`` / ``GRPOConfig`` keyword arguments of the default toy run: CPU, float32
    (GRPOConfig defaults to bf16), no reporting, no checkpoints; 150 steps take seconds.

    With these defaults GMPO takes the successor task's mean reward from below 0.2 to above 0.8
    (means of the first and last ten steps; ``tests/trl/test_training.py`` asserts both)."""
    args: dict[str, Any] = dict(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        seed=0,
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=1,
        temperature=1.0,
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        max_steps=150,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
    )
    args.update(overrides)
    return args
