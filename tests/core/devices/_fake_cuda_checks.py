"""The core on fake CUDA tensors: run by tests/core/devices/test_fake_cuda.py in a subprocess.

``FakeTensorMode`` gives tensors a device and a shape but no storage, so a CUDA tensor can be
created on a machine without a GPU (and without a CUDA build of torch). Inside the mode a host
read (``.item()``, ``.tolist()``, ``bool(t)``) raises, and so does an op mixing a CUDA tensor with
a CPU tensor of one or more dimensions; a check that runs to the end therefore proves that the
call keeps every tensor on the inputs' device and reads nothing back.

A CPU-only torch aborts the whole process (not an exception) on some ops on fake CUDA tensors
that require grad, so every input here is a plain tensor and the checks run in a child process:
``python -m tests.core.devices._fake_cuda_checks`` prints one JSON line per check, ``{"name", "ok", "error"}``,
and exits 0 whatever the checks' results.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable
from typing import Any

import torch

B, T = 3, 7
DEVICE = "cuda"

CHECKS: dict[str, Callable[[], None]] = {}


def check(name: str) -> Callable[[Callable[[], None]], Callable[[], None]]:
    def add(fn: Callable[[], None]) -> Callable[[], None]:
        CHECKS[name] = fn
        return fn

    return add


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=DEVICE)


def _on_cuda(t: Any, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> None:
    assert isinstance(t, torch.Tensor), type(t)
    assert t.device.type == DEVICE, t.device
    assert tuple(t.shape) == shape, (tuple(t.shape), shape)
    if dtype is not None:
        assert t.dtype == dtype, (t.dtype, dtype)


def _args(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    return _t(B, T, dtype=dtype), _t(B, T, dtype=dtype), _t(B), _t(B, T, dtype=torch.bool)


# the padded plain forward, one option at a time and all together
LOSS_OPTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "plain": lambda: {},
    "asymmetric clip": lambda: {"epsilon": 0.2, "epsilon_high": 0.3},
    "kl": lambda: {"beta": 0.1, "ref_logp": _t(B, T)},
    "token weights": lambda: {"is_weights": _t(B, T)},
    "row weights": lambda: {"is_weights": _t(B)},
    "dual clip": lambda: {"dual_clip": 2.0},
    "on-policy": lambda: {"old_logp": None},
    "all": lambda: {
        "beta": 0.1,
        "ref_logp": _t(B, T),
        "is_weights": _t(B, 1),
        "dual_clip": 3.0,
        "epsilon_high": 0.3,
    },
}


def _loss(options: dict[str, Any], dtype: torch.dtype = torch.float32) -> Any:
    from gmpo_core import gmpo_loss

    logp, old, adv, mask = _args(dtype)
    kwargs = {"old_logp": old, **options}
    return gmpo_loss(logp, kwargs.pop("old_logp"), adv, mask, impl="plain", **kwargs)


def _loss_check(options: Callable[[], dict[str, Any]], dtype: torch.dtype) -> Callable[[], None]:
    def run() -> None:
        out = _loss(options(), dtype)
        _on_cuda(out.loss, (), torch.float32)
        _on_cuda(out.per_sequence_loss, (B,), torch.float32)
        _on_cuda(out.log_coef, (B,))

    return run


for _name, _options in LOSS_OPTIONS.items():
    check(f"gmpo_loss: {_name}")(_loss_check(_options, torch.float32))
check("gmpo_loss: bf16")(_loss_check(LOSS_OPTIONS["all"], torch.bfloat16))


def _metrics_check(options: Callable[[], dict[str, Any]]) -> Callable[[], None]:
    def run() -> None:
        opts = options()
        values = _loss(opts).metrics
        assert ("kl" in values) == ("beta" in opts), sorted(values)
        assert ("clip_ratio/dual_mean" in values) == ("dual_clip" in opts), sorted(values)
        for v in values.values():
            _on_cuda(v, ())

    return run


check("out.metrics: plain")(_metrics_check(LOSS_OPTIONS["plain"]))
check("out.metrics: all")(_metrics_check(LOSS_OPTIONS["all"]))


@check("metrics.sums, metrics.minima")
def _sums_minima() -> None:
    from gmpo_core.metrics import minima, sums

    out = _loss(LOSS_OPTIONS["all"]())
    _on_cuda(sums(out.stats, out.kl_sum), (5,), torch.float64)
    _on_cuda(minima(out.stats), (4,), torch.float32)


@check("metrics.metrics")
def _metrics_from_reductions() -> None:
    from gmpo_core.metrics import metrics, minima, sums

    out = _loss(LOSS_OPTIONS["all"]())
    values = metrics(sums(out.stats, out.kl_sum), minima(out.stats), dual=True, kl=True)
    assert {"kl", "clip_ratio/dual_mean", "log_ratio/max"} <= set(values), sorted(values)
    for v in values.values():
        _on_cuda(v, (), torch.float32)


@check("clip_log_ratio")
def _clip() -> None:
    from gmpo_core import clip_log_ratio

    _on_cuda(clip_log_ratio(_t(B, T), epsilon=0.2, epsilon_high=0.3), (B, T))


@check("trust_region_log_ratio")
def _trust_region() -> None:
    from gmpo_core import trust_region_log_ratio

    _on_cuda(trust_region_log_ratio(_t(B, T), _t(B), epsilon=0.4, dual_clip=2.0), (B, T))


@check("masked_geometric_mean")
def _geometric_mean() -> None:
    from gmpo_core import masked_geometric_mean

    _on_cuda(masked_geometric_mean(_t(B, T), _t(B, T, dtype=torch.bool)), (B,))


def _power_mean_check(p: float) -> Callable[[], None]:
    def run() -> None:
        from gmpo_core import masked_power_mean

        out = masked_power_mean(_t(B, T, dtype=torch.bfloat16), _t(B, T, dtype=torch.bool), p)
        _on_cuda(out, (B,), torch.float32)

    return run


for _p in (0.5, 0.0, -1.0, 1e-30):  # each branch
    check(f"masked_power_mean: p={_p}")(_power_mean_check(_p))


@check("sequence_kl")
def _kl() -> None:
    from gmpo_core import sequence_kl

    _on_cuda(sequence_kl(_t(B, T), _t(B, T), _t(B, T, dtype=torch.bool)), (B,))


@check("clip_metrics")
def _clip_metrics() -> None:
    from gmpo_core import clip_metrics

    stats = clip_metrics(_t(B, T), _t(B), _t(B, T, dtype=torch.bool), epsilon=0.4, dual_clip=2.0)
    for field in stats:
        _on_cuda(field, ())


def run_all() -> list[dict[str, Any]]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    results = []
    for name, fn in CHECKS.items():
        error = None
        try:
            with FakeTensorMode():
                fn()
        except Exception as exc:  # reported, not raised: every check runs
            frames = traceback.extract_tb(exc.__traceback__)
            ours = [f for f in frames if "gmpo" in f.filename or "tests" in f.filename]
            where = f"{ours[-1].filename}:{ours[-1].lineno}: {ours[-1].line}" if ours else "?"
            error = f"{type(exc).__name__}: {exc} (at {where})"
        results.append({"name": name, "ok": error is None, "error": error})
    return results


if __name__ == "__main__":
    for result in run_all():
        print(json.dumps(result), flush=True)
