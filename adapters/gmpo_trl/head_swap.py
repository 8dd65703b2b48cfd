"""``GMPOConfig.gmpo_lm_head``: TRL's chunked LM head replaced by :func:`gmpo_core.token_logprobs`.

TRL 1.16's GRPOTrainer scores completions through a patched model forward that calls
``trl.trainer.utils._ChunkedLogProbFunction.apply(hidden, weight, bias, labels, temperature,
chunk_size, final_logit_softcapping, logit_scale, outputs)``. :func:`lm_head_swapped` puts
:class:`TokenLogProbHead` in that place for the duration of a call: same arguments, same five
outputs, log-probs and entropies from ``gmpo_core`` (chunks over tokens, a recomputing backward,
never the (N, V) logits). What ``gmpo_core`` does not compute (a logit soft-cap, or the extra
fields ``log_sum_sq_probs``, ``mean_logits``, ``is_top1``) goes to TRL's own head unchanged, and
a warning says so once per reason and process.

Which head scores a call is :func:`head_for`, a pure function of the setting, the hidden
states' device type and whether Triton is importable: by default (``gmpo_lm_head=None``)
gmpo_core's torch backend on the CPU, where it measured faster and leaner than TRL's; on CUDA with
Triton, gmpo_core's fused Triton backend (logits never leave the chip: on paper faster than TRL's
head, which writes a bf16 logits tile, and never rounded; docs/lm_head.md, "The fused head");
TRL's head on other devices and on CUDA without Triton. ``gmpo_lm_head=True`` asks for gmpo_core's
head everywhere (fused on CUDA with Triton), ``False`` for TRL's.

Each :func:`lm_head_swapped` block installs a head object of its own, holding its trainer's
settings, and puts back what it found on leaving: two trainers in one process (a sweep, a
notebook) each score with their own settings, however their blocks nest.

Older TRLs (1.10 to 1.14) score GRPO's completions with the full logits by default, and their
``_ChunkedLogProbFunction`` has another interface (no bias, no ``outputs``, two outputs): there
nothing is swapped, and a scoring pass that ran without the head gmpo_core stands in for warns
once that TRL's head scored the tokens (never a silent no-op).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any, ClassVar

import torch
import trl.trainer.utils as trl_utils
from torch import Tensor

from gmpo_core import token_logprobs
from gmpo_trl.compat import chunked_head_unsupported

_OURS = {"log_probs", "entropy"}
#: device types whose tokens gmpo_core's torch backend scores under the default setting
_GMPO_BY_DEFAULT = ("cpu", "meta")
#: gmpo_core.token_logprobs backends a head may be forced to (GMPOTrainer.gmpo_lm_head_backend)
BACKENDS = ("torch", "triton")


@functools.cache
def triton_importable() -> bool:
    """Whether Triton imports here (checked once a process): the fused backend's condition."""
    try:
        import triton  # noqa: F401
    except Exception:  # an ImportError, or a broken install: the fused head is not offered
        return False
    return True


def head_for(setting: bool | None, device_type: str, fused: bool | None = None) -> str | None:
    """Which head scores hidden states on ``device_type`` under ``GMPOConfig.gmpo_lm_head =
    setting``: None for TRL's, else the ``gmpo_core.token_logprobs`` backend (``"torch"`` or
    ``"triton"``). ``fused``: whether Triton is importable (default: :func:`triton_importable`).

    - False: TRL's everywhere.
    - None (the default): the torch backend on the CPU (and ``meta``, shapes only), the fused
      backend on CUDA with Triton, TRL's elsewhere (CUDA without Triton, other accelerators).
    - True: gmpo_core's everywhere, fused on CUDA with Triton, the torch backend elsewhere.
    """
    if setting is False:
        return None
    if device_type == "cuda" and (triton_importable() if fused is None else fused):
        return "triton"
    if setting is None and device_type not in _GMPO_BY_DEFAULT:
        return None
    return "torch"


def uses_gmpo_head(setting: bool | None, device_type: str, fused: bool | None = None) -> bool:
    """Whether gmpo_core's head (either backend) scores hidden states on ``device_type``."""
    return head_for(setting, device_type, fused) is not None


class TokenLogProbHead:
    """Stands where TRL's ``ChunkedLogProbFunction`` stands, with its ``apply`` signature; one
    object per :func:`lm_head_swapped` block, holding that block's (its trainer's) settings."""

    warned: ClassVar[set[str]] = set()  # fallback reasons already reported, once per process

    def __init__(
        self, fallback: Any, backward_precision: str = "half", setting: bool | None = None,
        backend: str | None = None,
    ) -> None:  # fmt: skip
        self.fallback = fallback  # TRL's class
        self.backward_precision = backward_precision  # GMPOConfig.gmpo_lm_head_backward
        self.setting = setting  # GMPOConfig.gmpo_lm_head (head_for)
        self.backend = backend  # a forced gmpo_core backend, or None: head_for's
        self.calls = 0  # calls of apply, ours or the fallback
        # TRL's forward, so that what inspects TRL's head (gmpo_trl.compat) reads its interface
        self.forward = getattr(fallback, "forward", None)

    @classmethod
    def warn_once(cls, reason: str, message: str) -> None:
        if reason not in cls.warned:
            cls.warned.add(reason)
            warnings.warn(message, stacklevel=3)

    def apply(
        self, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
        temperature: float, chunk_size: int, softcap: float | None, logit_scale: float,
        outputs: tuple[str, ...],
    ) -> tuple[Tensor | None, ...]:  # fmt: skip
        self.calls += 1
        backend = head_for(self.setting, hidden.device.type)  # the documented choice
        if backend is None:
            return self.fallback.apply(  # type: ignore[no-any-return]
                hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale,
                outputs,
            )  # fmt: skip
        if softcap is not None or not set(outputs) <= _OURS:
            reason = (
                f"a logit soft-cap ({softcap})"
                if softcap is not None
                else f"outputs {sorted(set(outputs) - _OURS)}"
            )
            self.warn_once(
                reason,
                f"gmpo_lm_head: gmpo_core.token_logprobs does not compute {reason}; "
                "TRL's LM head scores these tokens",
            )
            return self.fallback.apply(  # type: ignore[no-any-return]
                hidden, weight, bias, labels, temperature, chunk_size, softcap, logit_scale,
                outputs,
            )  # fmt: skip
        backend = self.backend or backend
        if hidden.dtype == torch.float64 or weight.dtype == torch.float64:
            backend = "torch"  # the fused kernels take float32, bf16 and fp16
        # chunk_size is TRL's (vocabulary columns); gmpo_core chunks tokens, with its own default
        logps, entropies = token_logprobs(
            hidden, weight, labels, bias=bias, temperature=temperature, logit_scale=logit_scale,
            compute_entropy="entropy" in outputs, backward_precision=self.backward_precision,
            backend=backend,
        )  # fmt: skip
        return logps, entropies, None, None, None


@contextlib.contextmanager
def lm_head_swapped(
    backward_precision: str = "half", setting: bool | None = None, backend: str | None = None
) -> Iterator[None]:
    """Within the block, TRL's patched forward scores tokens with a :class:`TokenLogProbHead` of
    this block's own (its backward GEMMs in ``backward_precision``,
    ``GMPOConfig.gmpo_lm_head_backward``; ``backend`` forces a gmpo_core backend), which hands
    the calls that ``setting`` (``GMPOConfig.gmpo_lm_head``; :func:`head_for`) gives to TRL's
    head over to it. On leaving, the head found on entering is put back (an enclosing block's
    keeps its settings).
    A block that scored nothing through it (a TRL whose chunked head has another interface, or
    whose scoring pass computes the full logits) warns once that TRL's head was used."""
    reason = chunked_head_unsupported()
    if reason is not None:
        yield
        _used_trls_head(reason)
        return
    found = trl_utils._ChunkedLogProbFunction
    original = found.fallback if isinstance(found, TokenLogProbHead) else found
    head = TokenLogProbHead(original, backward_precision, setting, backend)
    trl_utils._ChunkedLogProbFunction = head
    try:
        yield
    finally:
        trl_utils._ChunkedLogProbFunction = found
    if head.calls == 0:
        _used_trls_head("this scoring pass does not call its chunked head")


def _used_trls_head(reason: str) -> None:
    TokenLogProbHead.warn_once(
        reason,
        f"gmpo_core's LM head (GMPOConfig.gmpo_lm_head) is not used with trl {version('trl')}: "
        f"{reason}; TRL's LM head scores the tokens (gmpo_core's head replaces the chunked head "
        "of trl >= 1.16)",
    )
