"""``GMPOConfig.gmpo_lm_head``: TRL's chunked LM head replaced by :func:`gmpo_core.token_logprobs`.

TRL 1.16's GRPOTrainer scores completions through a patched model forward that calls
``trl.trainer.utils._ChunkedLogProbFunction.apply(hidden, weight, bias, labels, temperature,
chunk_size, final_logit_softcapping, logit_scale, outputs)``. :func:`lm_head_swapped` puts
:class:`TokenLogProbHead` in that place for the duration of a call: same arguments, same five
outputs, log-probs and entropies from ``gmpo_core`` (chunks over tokens, a recomputing backward,
never the (N, V) logits). What ``gmpo_core`` does not compute (a logit soft-cap, or the extra
fields ``log_sum_sq_probs``, ``mean_logits``, ``is_top1``) goes to TRL's own head unchanged, and
a warning says so once per reason and process.

Which head scores a call is :func:`uses_gmpo_head`, a pure function of the setting and the
hidden states' device type: by default (``gmpo_lm_head=None``) gmpo_core's on the CPU, where it
measured faster and leaner than TRL's, and TRL's on every other device. On a GPU TRL's head folds
a bf16 logits tile in one Triton pass, and gmpo_core's keeps the logits float32 and runs its
element-wise passes as separate torch ops: on paper about 3x the head's time
(docs/lm_head.md, "The cost on an H100/H200"). ``gmpo_lm_head=True`` asks for gmpo_core's head
everywhere (logits never rounded), ``False`` for TRL's.

Older TRLs (1.10 to 1.14) score GRPO's completions with the full logits by default, and their
``_ChunkedLogProbFunction`` has another interface (no bias, no ``outputs``, two outputs): there
nothing is swapped, and a scoring pass that ran without the head gmpo_core stands in for warns
once that TRL's head scored the tokens (never a silent no-op).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any, ClassVar

import trl.trainer.utils as trl_utils
from torch import Tensor

from gmpo_core import token_logprobs
from gmpo_trl.compat import chunked_head_unsupported

_OURS = {"log_probs", "entropy"}
#: device types whose tokens gmpo_core's head scores under the default setting
_GMPO_BY_DEFAULT = ("cpu", "meta")


def uses_gmpo_head(setting: bool | None, device_type: str) -> bool:
    """Whether gmpo_core's head scores hidden states on ``device_type`` under
    ``GMPOConfig.gmpo_lm_head = setting``: True and False decide, None (the default) picks
    gmpo_core's on the CPU (and on ``meta``, shapes only, where TRL's head cannot run) and TRL's
    on accelerators."""
    return setting if setting is not None else device_type in _GMPO_BY_DEFAULT


class TokenLogProbHead:
    """Stands where TRL's ``ChunkedLogProbFunction`` stands, with its ``apply`` signature."""

    fallback: Any = None  # TRL's class, set by lm_head_swapped
    warned: ClassVar[set[str]] = set()  # fallback reasons already reported
    calls: ClassVar[int] = 0  # calls of apply, ours or the fallback
    backward_precision: ClassVar[str] = "half"  # GMPOConfig.gmpo_lm_head_backward
    setting: ClassVar[bool | None] = None  # GMPOConfig.gmpo_lm_head (uses_gmpo_head)

    @classmethod
    def warn_once(cls, reason: str, message: str) -> None:
        if reason not in cls.warned:
            cls.warned.add(reason)
            warnings.warn(message, stacklevel=3)

    @classmethod
    def apply(
        cls, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
        temperature: float, chunk_size: int, softcap: float | None, logit_scale: float,
        outputs: tuple[str, ...],
    ) -> tuple[Tensor | None, ...]:  # fmt: skip
        cls.calls += 1
        if not uses_gmpo_head(cls.setting, hidden.device.type):  # the documented choice
            return cls.fallback.apply(  # type: ignore[no-any-return]
                hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale,
                outputs,
            )  # fmt: skip
        if softcap is not None or not set(outputs) <= _OURS:
            reason = (
                f"a logit soft-cap ({softcap})"
                if softcap is not None
                else f"outputs {sorted(set(outputs) - _OURS)}"
            )
            cls.warn_once(
                reason,
                f"gmpo_lm_head: gmpo_core.token_logprobs does not compute {reason}; "
                "TRL's LM head scores these tokens",
            )
            return cls.fallback.apply(  # type: ignore[no-any-return]
                hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale,
                outputs,
            )  # fmt: skip
        # chunk_size is TRL's (vocabulary columns); gmpo_core chunks tokens, with its own default
        logps, entropies = token_logprobs(
            hidden, weight, labels, bias=bias, temperature=temperature, logit_scale=logit_scale,
            compute_entropy="entropy" in outputs, backward_precision=cls.backward_precision,
        )  # fmt: skip
        return logps, entropies, None, None, None


@contextlib.contextmanager
def lm_head_swapped(
    backward_precision: str = "half", setting: bool | None = None
) -> Iterator[None]:
    """Within the block, TRL's patched forward scores tokens with :class:`TokenLogProbHead`
    (its backward GEMMs in ``backward_precision``, ``GMPOConfig.gmpo_lm_head_backward``), which
    hands the calls that ``setting`` (``GMPOConfig.gmpo_lm_head``; :func:`uses_gmpo_head`) gives
    to TRL's head over to it.
    A block that scored nothing through it (a TRL whose chunked head has another interface, or
    whose scoring pass computes the full logits) warns once that TRL's head was used."""
    reason = chunked_head_unsupported()
    if reason is not None:
        yield
        _used_trls_head(reason)
        return
    original = trl_utils._ChunkedLogProbFunction
    TokenLogProbHead.fallback = original
    TokenLogProbHead.backward_precision = backward_precision
    TokenLogProbHead.setting = setting
    trl_utils._ChunkedLogProbFunction = TokenLogProbHead
    before = TokenLogProbHead.calls
    try:
        yield
    finally:
        trl_utils._ChunkedLogProbFunction = original
    if TokenLogProbHead.calls == before:
        _used_trls_head("this scoring pass does not call its chunked head")


def _used_trls_head(reason: str) -> None:
    TokenLogProbHead.warn_once(
        reason,
        f"gmpo_core's LM head (GMPOConfig.gmpo_lm_head) is not used with trl {version('trl')}: "
        f"{reason}; TRL's LM head scores the tokens (gmpo_core's head replaces the chunked head "
        "of trl >= 1.16)",
    )
