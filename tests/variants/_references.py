"""The float64 references of the recipes' variants, by the names the tests use: each is the
``reference`` counterpart its ``gmpo_variants`` module defines (numpy, never the torch code)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gmpo_variants.ablations import (
    no_clip_reference,
    no_length_norm_reference,
    sequence_clip_reference,
)
from gmpo_variants.gmpo import token_clip_reference
from gmpo_variants.grpo import grpo_arithmetic_reference
from gmpo_variants.power import power_mean_reference

REFERENCES: dict[str, Callable[..., float]] = {
    "token_clip": token_clip_reference,
    "sequence_clip": sequence_clip_reference,
    "no_clip": no_clip_reference,
    "no_length_norm": no_length_norm_reference,
    "grpo_arithmetic": grpo_arithmetic_reference,
    "power_mean": power_mean_reference,
}


def variant_loss(*args: Any, variant: str, **kwargs: Any) -> float:
    """The reference loss of ``variant`` (a key of :data:`REFERENCES`); a ValueError names the
    valid ones."""
    if variant not in REFERENCES:
        raise ValueError(f"unknown variant {variant!r}; valid names: {', '.join(REFERENCES)}")
    return REFERENCES[variant](*args, **kwargs)
