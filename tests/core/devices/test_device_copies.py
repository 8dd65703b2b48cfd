"""No copy of host data to the device, proven without a GPU.

On a GPU, a tensor built from host data (``torch.tensor([...], device="cuda")``, ``t.to("cuda")``
of a CPU tensor, ``cuda_t.copy_(cpu_t)``) is a host-to-device copy from pageable memory: the host
waits for the stream, which ``torch.cuda.set_sync_debug_mode("error")`` refuses (docs/semantics.md
S16). The ``meta`` device runs such code without complaint (it has no values to copy), so the
meta tests cannot see it; :class:`Copies` does. It records, over a forward and its backward on
meta tensors:

* every ATen op that takes a CPU tensor and touches another device (an argument, an output or a
  ``device=`` keyword elsewhere): ``_to_copy``, ``copy_``, ``_copy_from``, ``to``, and a CPU
  scalar tensor mixed into an op on another device (a ``TorchDispatchMode``);
* every tensor made from Python or NumPy data on a device other than the CPU: ``torch.tensor``,
  ``torch.as_tensor``, ``torch.asarray``, ``Tensor.new_tensor``. These never reach the
  dispatcher as a copy (``torch.tensor(data, device="meta")`` dispatches nothing at all, measured
  on torch 2.13), so they are caught where Python calls them (a ``TorchFunctionMode``).

``torch.full(shape, value, device=...)`` and other factories with a Python number are fills on
the device (the number travels as a kernel argument, not through memory) and are not copies.

Covered: every entry point the meta tests cover (tests/core/devices/test_devices.py,
tests/core/devices/test_lm_head_devices.py, tests/core/devices/test_metrics_devices.py), on both impls for ``gmpo_loss``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from gmpo_core import (
    clip_log_ratio,
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    masked_power_mean,
    sequence_kl,
    token_logprobs,
    trust_region_log_ratio,
)
from gmpo_core.metrics import metrics, minima, sums
from tests.core.devices.test_devices import OPTIONS, POWERS, B, T, _call

_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}


def _device(d: Any) -> torch.device | None:
    return None if d is None else torch.device(d)


class _Dispatched(TorchDispatchMode):
    def __init__(self, found: list[str]) -> None:
        super().__init__()
        self.found = found

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if any(t.device.type == "cpu" for t in given):
            elsewhere = {t.device.type for t in given + made} - {"cpu"}
            target = _device(kwargs.get("device"))
            if target is not None and target.type != "cpu":
                elsewhere.add(target.type)
            if elsewhere:
                self.found.append(f"{func}: a CPU tensor with {sorted(elsewhere)}")
        return out


class _Called(TorchFunctionMode):
    def __init__(self, found: list[str]) -> None:
        super().__init__()
        self.found = found

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _FROM_DATA or func is torch.Tensor.new_tensor:
            data = args[1] if func is torch.Tensor.new_tensor else (args or [kwargs.get("data")])[0]
            target = _device(kwargs.get("device"))
            if target is None and func is torch.Tensor.new_tensor:
                target = args[0].device
            if not isinstance(data, torch.Tensor) and target is not None and target.type != "cpu":
                self.found.append(f"{func.__name__}({type(data).__name__}) on {target.type}")
        return func(*args, **kwargs)


class Copies:
    """``with Copies() as found: ...``; then ``found`` lists every copy of host data to another
    device made inside (empty when there was none)."""

    def __enter__(self) -> list[str]:
        self.found: list[str] = []
        self.modes = (_Called(self.found), _Dispatched(self.found))
        for mode in self.modes:
            mode.__enter__()
        return self.found

    def __exit__(self, *exc: Any) -> None:
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


# the recorder sees each kind of copy: the tests below can fail
_MISTAKES = {
    "torch.tensor of a list": lambda: torch.tensor([0.2, 0.4], device="meta"),
    "torch.tensor of a float": lambda: torch.tensor(0.2, device="meta"),
    "torch.as_tensor of a list": lambda: torch.as_tensor([1.0], device="meta"),
    "torch.asarray of an array": lambda: torch.asarray(np.ones(2), device="meta"),
    "new_tensor": lambda: torch.empty(2, device="meta").new_tensor([1.0, 2.0]),
    "Tensor.to": lambda: torch.ones(2).to("meta"),
    "Tensor.to a dtype and device": lambda: torch.ones(2).to("meta", torch.float64),
    "copy_ from the CPU": lambda: torch.empty(2, device="meta").copy_(torch.ones(2)),
    "a CPU scalar tensor mixed in": lambda: torch.empty(2, device="meta") * torch.tensor(2.0),
}


@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_the_recorder_sees_each_kind_of_copy(mistake: str) -> None:
    with Copies() as found:
        _MISTAKES[mistake]()
    assert found, mistake


def test_the_recorder_sees_a_copy_in_the_backward() -> None:
    """The backward runs under the modes too: its multiply by the saved CPU scalar is seen."""
    leaf = torch.empty(2, device="meta", requires_grad=True)
    y = (leaf * torch.tensor(3.0)).sum()  # the forward's own copy is not recorded
    with Copies() as found:
        torch.autograd.grad(y, leaf)
    assert found


def test_the_recorder_lets_fills_and_host_work_through() -> None:
    with Copies() as found:
        torch.full((), 0.5, device="meta")
        torch.empty(3, device="meta").new_full((), 2.0)
        torch.zeros(2, device="meta").add_(1.5)
        torch.tensor([1.0, 2.0]).sum()  # the host alone
    assert found == []


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("upstream", ["loss", "per_sequence_loss", "log_coef"])
def test_gmpo_loss_copies_nothing_to_the_device(
    impl: str, layout: str, option: str, upstream: str
) -> None:
    """(CHANGELOG, 0.2): the compiled path built its 0-d hyper-parameters with
    ``torch.tensor(<list>, device=logp.device)``, a host-to-device copy on every call. Forward,
    backward (``log_coef`` as the upstream recomputes the math under autograd), ``out.metrics``
    and the stats reductions."""
    args, logp = _call(layout, option)
    with Copies() as found:
        out = gmpo_loss(logp, **args, impl=impl)  # type: ignore[arg-type]
        target = {
            "loss": out.loss,
            "per_sequence_loss": out.per_sequence_loss.sum(),
            "log_coef": out.log_coef.sum(),
        }[upstream]
        (grad,) = torch.autograd.grad(target, logp)
        m = out.metrics
        reduced = metrics(sums(out.stats, out.kl_sum), minima(out.stats), "dual_clip" in args)
    assert found == []
    assert grad.is_meta and all(v.is_meta for v in [*m.values(), *reduced.values()])


def test_second_order_gradient_copies_nothing(impl: str) -> None:
    args, logp = _call("packed", "all")
    with Copies() as found:
        out = gmpo_loss(logp, **args, impl=impl)  # type: ignore[arg-type]
        (g,) = torch.autograd.grad(out.loss, logp, create_graph=True)
        (hvp,) = torch.autograd.grad(g.sum(), logp)
    assert found == []
    assert hvp.is_meta


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_building_blocks_copy_nothing(layout: str) -> None:
    args, logp = _call(layout, "plain")
    r, adv, mask = args["old_logp"], args["advantages"], args["mask"]
    seg = {"cu_seqlens": args["cu_seqlens"]} if layout == "packed" else {}
    with Copies() as found:
        outs = [
            clip_log_ratio(r, epsilon=0.2),
            trust_region_log_ratio(r, adv, epsilon=0.2, dual_clip=2.0, **seg),
            masked_geometric_mean(r, mask, **seg),
            *clip_metrics(r, adv, mask, epsilon=0.2, dual_clip=2.0, **seg),
        ]
        (grad,) = torch.autograd.grad(sequence_kl(logp, r, mask, **seg).sum(), logp)
    assert found == []
    assert grad.is_meta and all(t.is_meta for t in outs if t is not None)


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("p", POWERS)
def test_power_mean_copies_nothing(layout: str, p: float) -> None:
    args, logp = _call(layout, "plain")
    seg = {"cu_seqlens": args["cu_seqlens"]} if layout == "packed" else {}
    with Copies() as found:
        out = masked_power_mean(logp, args["mask"], p, **seg)
        (grad,) = torch.autograd.grad(out.sum(), logp)
    assert found == []
    assert out.is_meta and grad.is_meta


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stats_reductions_copy_nothing(dtype: torch.dtype) -> None:
    meta = {"device": "meta", "dtype": dtype}
    logp = torch.empty(B, T, **meta, requires_grad=True)
    with Copies() as found:
        out = gmpo_loss(
            logp, torch.empty(B, T, **meta), torch.empty(B, device="meta"),
            torch.empty(B, T, dtype=torch.bool, device="meta"),
            beta=0.1, ref_logp=torch.empty(B, T, **meta), dual_clip=2.0,
        )  # fmt: skip
        s, m = sums(out.stats, out.kl_sum), minima(out.stats)
        for reduced in (m, m.float()):
            metrics(s, reduced, dual=True, kl=True)
    assert found == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("entropy", [False, True])
@pytest.mark.parametrize("tokens", [10, 0])
def test_token_logprobs_copies_nothing(
    dtype: torch.dtype, bias: bool, entropy: bool, tokens: int
) -> None:
    meta = {"device": "meta", "dtype": dtype}
    hidden = torch.empty(tokens, 8, **meta, requires_grad=True)
    weight = torch.empty(11, 8, **meta, requires_grad=True)
    b = torch.empty(11, **meta, requires_grad=True) if bias else None
    targets = torch.empty(tokens, dtype=torch.long, device="meta")
    with Copies() as found:
        out = token_logprobs(
            hidden, weight, targets, bias=b, temperature=0.7, logit_scale=1.5, chunk_size=3,
            compute_entropy=entropy,
        )  # fmt: skip
        total = out.logps.sum() + (out.entropies.sum() if out.entropies is not None else 0)
        total.backward()
    assert found == []
    assert weight.grad is not None and weight.grad.is_meta


def test_token_logprobs_under_a_cpu_autocast_copies_nothing() -> None:
    hidden = torch.empty(4, 8, device="meta", requires_grad=True)
    weight = torch.empty(11, 8, device="meta", requires_grad=True)
    with Copies() as found:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logps, entropies = token_logprobs(
                hidden, weight, torch.empty(4, dtype=torch.long, device="meta")
            )
        assert entropies is not None
        (logps.sum() + entropies.sum()).backward()
    assert found == []
