"""The tasks' alphabet and the character tokenizer every task's model reads, built in-process.

One alphabet for every task: the digits, the separator ``=``, the operator ``+`` and distractor
letters (never right in a completion). :data:`CHARS` is the tokenizer's (after its two special
tokens); :data:`VOCAB`, the plain-torch study's 16 symbols (:func:`encode`, :func:`decode`), is
its first 16.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DIGITS = "0123456789"
SEP = "="
PLUS = "+"
DISTRACTORS = "abcdefgh"
#: the tokenizer's characters, in id order after :data:`SPECIALS`: "0123456789=+abcdefgh"
CHARS = DIGITS + SEP + PLUS + DISTRACTORS
SPECIALS = ("<pad>", "<eos>")
#: the plain-torch study's symbols (``studies/stability``): the digits, ``=``, ``+`` and four
#: distractors. Every task's prompts and answers use ids 0-11 only, so the distractors are
#: never right: a task that uses no ``+`` (``reverse``) sees it as one more distractor
VOCAB = CHARS[:16]
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> list[int]:
    """Token ids of ``text`` in :data:`VOCAB` (one character, one token)."""
    try:
        return [_INDEX[c] for c in text]
    except KeyError as err:
        raise ValueError(f"encode: {err.args[0]!r} is not in the vocabulary {VOCAB!r}") from err


def decode(ids: Sequence[int]) -> str:
    """The string of token ids in :data:`VOCAB`."""
    return "".join(VOCAB[i] for i in ids)


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
