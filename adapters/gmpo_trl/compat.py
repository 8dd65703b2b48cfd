"""Every TRL-version check of ``gmpo_trl``, in one place: the supported range and the tested
releases, the reviewed ``GRPOTrainer._compute_loss`` sources, and what differs between the
supported releases (the scoring helper's inputs, Liger's loss, the chunked LM head's interface).

Nothing here imports TRL on import (``import gmpo_trl`` reads TRL's version from its
distribution metadata); each check imports it when called.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import warnings
from typing import Any

#: the oldest TRL the adapter supports (``major.minor``; pyproject.toml's ``trl>=1.10``)
MIN_TRL = (1, 10)
#: the TRL releases the adapter is tested with (``make compat`` and the main test run)
TESTED_TRL = ("1.10.0", "1.16.0")
#: sha256 of ``inspect.getsource(trl.GRPOTrainer._compute_loss)`` in each reviewed TRL release
KNOWN_COMPUTE_LOSS_SHA256 = {
    "1.10.0": "75bd01badfb43ed6d59919da054060514338d6e07054508d3eb07dc988646cad",
    "1.16.0": "80295546bbdbf6f711acce7f6e69b0100ab40aa8f23ed8052cc564ff024e3e40",
}
#: the newest reviewed release's (what the main test run checks)
COMPUTE_LOSS_SHA256 = KNOWN_COMPUTE_LOSS_SHA256["1.16.0"]


def supported_trl(installed: str) -> bool:
    """Whether a TRL release is in the supported range (``major.minor >= MIN_TRL``)."""
    try:
        return tuple(int(part) for part in installed.split(".")[:2]) >= MIN_TRL
    except ValueError:
        return False


def warn_if_unsupported() -> None:
    """Warn once (on ``import gmpo_trl``) when the installed TRL is older than the range."""
    installed = importlib.metadata.version("trl")  # importing trl is left to what needs it
    if not supported_trl(installed):
        warnings.warn(
            f"gmpo_trl supports trl >= {MIN_TRL[0]}.{MIN_TRL[1]} (tested with "
            f"{' and '.join(TESTED_TRL)}); trl {installed} is installed",
            stacklevel=3,
        )


def compute_loss_fingerprint() -> str:
    """sha256 of the installed ``GRPOTrainer._compute_loss`` source."""
    from trl import GRPOTrainer

    return hashlib.sha256(inspect.getsource(GRPOTrainer._compute_loss).encode()).hexdigest()


def check_compute_loss() -> None:
    """Warn (not fail) when the installed ``GRPOTrainer._compute_loss`` is none of the sources
    ``gmpo_trl`` was reviewed against (:data:`KNOWN_COMPUTE_LOSS_SHA256`)."""
    if compute_loss_fingerprint() not in KNOWN_COMPUTE_LOSS_SHA256.values():
        warnings.warn(
            f"gmpo_trl: GRPOTrainer._compute_loss of trl {importlib.metadata.version('trl')} is not one gmpo_trl "
            f"was reviewed against (trl {', '.join(KNOWN_COMPUTE_LOSS_SHA256)}): a loss feature "
            "it added may be missing from GMPOTrainer; check gmpo_trl.fields against it",
            stacklevel=3,
        )


def check_liger(use_liger_kernel: bool) -> None:
    """Refuse ``use_liger_kernel=True`` where GRPOTrainer computes the loss with Liger's."""
    from trl import GRPOTrainer

    if use_liger_kernel and hasattr(GRPOTrainer, "compute_liger_loss"):
        raise ValueError(
            f"use_liger_kernel=True: trl {importlib.metadata.version('trl')}'s GRPOTrainer computes the loss with "
            "Liger's GRPO loss (compute_liger_loss) instead of _compute_loss, so GMPO would "
            "not be trained; set use_liger_kernel=False (from trl 1.14 the flag leaves the "
            "loss step to GMPOTrainer)"
        )


# The forward's optional inputs (multimodal fields...), read from the helper's own signature so a
# field TRL adds there reaches the model without a change here.
_FORWARD_FIXED = {
    "self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size",
    "compute_entropy", "compute_aux_loss",
}  # fmt: skip
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# where the scoring helper takes ``*args, **kwargs`` (TRL 1.14), the helpers it passes them to
_FORWARD_DELEGATES = ("_full_logits_logps", "_chunked_logps")


def forward_keys(trainer_cls: type | None = None) -> tuple[str, ...]:
    """The optional inputs ``trainer_cls._get_per_token_logps_and_entropies`` (by default
    GRPOTrainer's) takes by name: its named parameters; where it also takes ``**kwargs``, the
    named parameters that every helper it passes them to takes. Never the names of ``*args`` or
    ``**kwargs`` themselves."""
    if trainer_cls is None:
        from trl import GRPOTrainer as trainer_cls

    def named(fn: Any) -> list[str]:
        return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in _NAMED]

    entry = trainer_cls._get_per_token_logps_and_entropies
    keys = named(entry)
    kinds = {p.kind for p in inspect.signature(entry).parameters.values()}
    helpers = [getattr(trainer_cls, n) for n in _FORWARD_DELEGATES if hasattr(trainer_cls, n)]
    if inspect.Parameter.VAR_KEYWORD in kinds and helpers:
        common = set.intersection(*(set(named(h)) for h in helpers))
        keys += [k for k in named(helpers[0]) if k in common and k not in keys]
    return tuple(k for k in keys if k not in _FORWARD_FIXED)


#: the arguments of TRL 1.16's ``ChunkedLogProbFunction.forward`` after ``ctx``
CHUNKED_HEAD_INTERFACE = (
    "hidden", "weight", "bias", "targets", "temperature", "chunk_size",
    "final_logit_softcapping", "logit_scale", "outputs",
)  # fmt: skip


def chunked_head_unsupported() -> str | None:
    """Why the installed TRL's chunked LM head cannot be replaced by ``gmpo_trl.head_swap``
    (None: it can)."""
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_ChunkedLogProbFunction", None)
    if original is None:
        return "trl.trainer.utils has no _ChunkedLogProbFunction"
    params = tuple(inspect.signature(original.forward).parameters)[1:]
    if params != CHUNKED_HEAD_INTERFACE:
        return f"its _ChunkedLogProbFunction takes ({', '.join(params)})"
    return None
