"""The tasks' alphabet and the character tokenizer every task's model reads, built in-process.

One alphabet for every task: the digits, the separator ``=`` and distractor letters (never right
in a completion). :data:`CHARS` is the tokenizer's (after its two special tokens);
``gmpo_tasks.reverse.VOCAB``, the plain-torch study's 16 symbols, is a prefix-built subset of it.
"""

from __future__ import annotations

from typing import Any

DIGITS = "0123456789"
SEP = "="
DISTRACTORS = "abcdefgh"
#: the tokenizer's characters, in id order after :data:`SPECIALS`: "0123456789=+abcdefgh"
CHARS = DIGITS + SEP + "+" + DISTRACTORS
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
