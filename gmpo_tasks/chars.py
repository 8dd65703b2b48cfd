"""The tasks' characters and the character tokenizer every built-in model reads, built
in-process.

The digit tasks share one alphabet, :data:`CHARS`: the digits, the separator ``=``, the operator
``+`` and distractor letters (never right in a completion); a task may bring its own
(``gmpo_tasks.task.Task.alphabet``). :data:`VOCAB`, the plain-torch study's 16 symbols of the
digit tasks, is its first 16. :func:`encode` and :func:`decode` map a string to the ids of a
vocabulary (``VOCAB`` by default) and back.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

DIGITS = "0123456789"
SEP = "="
PLUS = "+"
DISTRACTORS = "abcdefgh"
#: the digit tasks' tokenizer characters, in id order after :data:`SPECIALS`: "0123456789=+abcdefgh"
CHARS = DIGITS + SEP + PLUS + DISTRACTORS
SPECIALS = ("<pad>", "<eos>")
#: the plain-torch study's symbols of the digit tasks: the digits, ``=``, ``+`` and four
#: distractors. Their prompts and answers use ids 0-11 only, so the distractors are never
#: right: a task that uses no ``+`` (``reverse``) sees it as one more distractor
VOCAB = CHARS[:16]


@cache
def _index(vocab: str) -> dict[str, int]:
    return {c: i for i, c in enumerate(vocab)}


def encode(text: str, vocab: str = VOCAB) -> list[int]:
    """Token ids of ``text`` in ``vocab`` (one character, one token)."""
    index = _index(vocab)
    try:
        return [index[c] for c in text]
    except KeyError as err:
        raise ValueError(f"encode: {err.args[0]!r} is not in the vocabulary {vocab!r}") from err


def decode(ids: Sequence[int], vocab: str = VOCAB) -> str:
    """The string of token ids in ``vocab``."""
    return "".join(vocab[i] for i in ids)


def char_tokenizer(
    vocab_size: int | None = None,
    *,
    alphabet: str = CHARS,
    specials: tuple[str, ...] = SPECIALS,
    eos: str = SPECIALS[1],
) -> Any:
    """A left-padding character tokenizer (``PreTrainedTokenizerFast``) of ``alphabet`` after
    ``specials`` (the first is the padding token, ``eos`` the end of a sequence; those after it
    are special tokens too), built without the hub. ``vocab_size`` pads the vocabulary with
    dummy tokens ``<xI>`` (a model with a large head)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = (*specials, *alphabet)
    if vocab_size is not None and vocab_size < len(base):
        raise ValueError(f"vocab_size must be at least {len(base)}, got {vocab_size}")
    vocab = {tok: i for i, tok in enumerate(base)}
    vocab.update({f"<x{i}>": i for i in range(len(base), vocab_size or 0)})
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[0]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    extra = [t for t in specials[1:] if t != eos]
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=specials[0],
        eos_token=eos,
        padding_side="left",
        **({"additional_special_tokens": extra} if extra else {}),
    )
