"""The tasks' tiny models, built from a config with random weights (no hub, no download).

``transformers`` is imported when a model is built, never on import.
"""

from __future__ import annotations

from typing import Any


def qwen2_model(
    tokenizer: Any,
    *,
    seed: int = 0,
    hidden_size: int = 32,
    layers: int = 2,
    max_len: int = 64,
    heads: int = 4,
    tied: bool = True,
) -> Any:
    """A randomly initialized Qwen2-style causal LM sized for CPU tests (about 30k parameters).
    ``heads`` attention heads (half as many key/value heads, at least 1); the output layer tied
    to the embeddings (``tied``) or its own."""
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
        tie_word_embeddings=tied,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def gpt2_model(
    tokenizer: Any, positions: int, *, seed: int = 0, hidden_size: int = 64, heads: int = 4
) -> Any:
    """A 2-layer GPT-2-style model (``heads`` heads, 4 by default; learned positions, tied
    embeddings, no dropout: the stability study's model in transformers' classes) with
    ``positions`` positions.

    Learned absolute positions, not the Qwen2 model's rotary ones: reversing needs the output at
    position ``L + 1 + i`` to find the prompt's position ``L - 1 - i``, which a rotary model of
    this size did not learn (its warm-start loss stalled near 1.2 after 1200 steps, reward 0);
    this one reaches the demonstrations' entropy (about 0.5) within 400 steps."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=hidden_size,
        n_layer=2,
        n_head=heads,
        n_inner=4 * hidden_size,
        n_positions=positions,
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
    return model
