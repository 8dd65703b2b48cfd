"""What a plain call costs beyond its arithmetic: on a small batch every torch call is paid in
dispatch whatever its size (docs/benchmarks.md, "Small batches"), and on a large one a bool
(B, T) temporary is a pass of its own (the clip's comparison once cost 12 % at 256 x 4096)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from gmpo_core import gmpo_loss

# torch calls (functions and Tensor methods, attribute reads left out) of one plain call on a
# padded batch: forward, metrics and backward. Measured 77 on torch 2.13 (129 before the clip
# statistics were reduced stacked, 106 before they became one tally of two tensors and the
# metrics read it); raise it only with a reason.
CALL_BUDGET = 77


class _Calls(TorchFunctionMode):
    """Records each torch call from Python and what it returned."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", str(func))
        if name != "__get__":  # .shape, .dtype, .requires_grad, ...
            self.calls.append((name, out))
        return out


def _inputs(b: int, t: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(b, t, generator=g)
    return {
        "logp": logp.requires_grad_(),
        "old_logp": logp.detach() + 0.5 * torch.randn(b, t, generator=g),  # some tokens cut
        "advantages": torch.randn(b, generator=g),
        "mask": torch.rand(b, t, generator=g) < 0.8,
    }


def _plain_call(x: dict[str, torch.Tensor]) -> list[tuple[str, Any]]:
    gmpo_loss(**x).loss.backward()  # warm: first-call work is not what is counted
    x["logp"].grad = None
    with _Calls() as rec:
        out = gmpo_loss(**x)
        _ = out.metrics
        out.loss.backward()
    return rec.calls


def test_the_plain_call_makes_no_token_sized_bool() -> None:
    """The paths' forward clips with ``clamp`` where nothing differentiates it: a comparison on
    the tokens and a ``where`` on its bool result were two extra passes (12 % of a plain call
    at 256 x 4096, one thread)."""
    x = _inputs(4, 8)
    mask = x["mask"].untyped_storage().data_ptr()
    made = [
        name
        for name, out in _plain_call(x)
        if isinstance(out, torch.Tensor)
        and out.dtype == torch.bool
        and out.shape == (4, 8)
        and out.untyped_storage().data_ptr() != mask  # a new tensor, not the mask or a view
    ]
    assert made == []


def test_a_plain_call_stays_within_its_call_budget() -> None:
    calls = _plain_call(_inputs(2, 16))
    assert len(calls) <= CALL_BUDGET, sorted(name for name, _ in calls)
