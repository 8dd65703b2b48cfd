"""Device-generic code, proven without a GPU.

On the ``meta`` device a tensor has no values: any host read (``.item()``, ``.tolist()``,
``bool(t)``) raises, and so does mixing with a CPU tensor. A call that runs end to end on meta
tensors therefore makes no host-device synchronization and creates no constant on the wrong
device, which is what a GPU step needs (docs/semantics.md, "Devices").
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
import torch

import gmpo_core
from gmpo_core import (
    clip_log_ratio,
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    masked_power_mean,
    sequence_kl,
    trust_region_log_ratio,
)
from gmpo_core.metrics import metrics, minima, sums

B, T = 3, 7


def _modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(pkg.__path__, prefix=package + "."):
        names.append(info.name)
    return names


def test_no_tensor_at_module_level() -> None:
    """Defect: metrics multiplied the stats by a module-level CPU tensor (crash on every GPU
    step). No module of the core or the adapters may hold a tensor in its globals: a tensor made
    at import lives on the CPU, whatever device the inputs are on."""
    found = []
    for package in ("gmpo_core", "gmpo_kit", "gmpo_trl", "gmpo_verl"):
        for name in _modules(package):
            try:
                module = importlib.import_module(name)
            except ImportError:  # an adapter whose host is not installed
                continue
            for key, value in vars(module).items():
                if isinstance(value, torch.Tensor):
                    found.append(f"{name}.{key}")
    assert found == []


def _meta_args() -> dict[str, torch.Tensor]:
    return {
        "logp": torch.empty(B, T, device="meta", requires_grad=True),
        "old_logp": torch.empty(B, T, device="meta"),
        "advantages": torch.empty(B, device="meta"),
        "mask": torch.empty(B, T, dtype=torch.bool, device="meta"),
    }


def test_metrics_on_meta() -> None:
    """(CHANGELOG, 0.2): ``out.metrics`` and ``gmpo_core.metrics.minima`` raised "Tensor on
    device cpu is not on the expected device meta!"."""
    out = gmpo_loss(**_meta_args())
    m = out.metrics
    assert all(v.device.type == "meta" for v in m.values())
    assert minima(out.stats).device.type == "meta"
    assert metrics(sums(out.stats), minima(out.stats), dual=False)["log_ratio/max"].is_meta


@pytest.mark.parametrize("name", gmpo_core.__all__)
def test_public_names_resolve(name: str) -> None:
    assert getattr(gmpo_core, name) is not None


# the power mean's branches: p > 0, p = 0, p < 0, the expansion at tiny |p|
POWERS = (0.5, 0.0, -1.0, 1e-30)

OPTIONS = {
    "plain": {},
    "kl": {"beta": 0.05, "ref_logp": True},
    "token weights": {"is_weights": "token"},
    "row weights": {"is_weights": "row"},
    "dual clip": {"dual_clip": 2.0, "epsilon_high": 0.28},
    "all": {"beta": 0.05, "ref_logp": True, "is_weights": "token", "dual_clip": 2.0},
}


def _call(layout: str, option: str) -> tuple[dict[str, Any], torch.Tensor]:
    """gmpo_loss arguments on meta, padded (B, T) or packed (N,) with S = B segments."""
    shape = (B, T) if layout == "padded" else (B * T,)
    logp = torch.empty(shape, device="meta", requires_grad=True)
    args: dict[str, Any] = {
        "old_logp": torch.empty(shape, device="meta"),
        "advantages": torch.empty(B, device="meta"),
        "mask": torch.empty(shape, dtype=torch.bool, device="meta"),
    }
    for key, value in OPTIONS[option].items():
        if key == "ref_logp":
            args["ref_logp"] = torch.empty(shape, device="meta")
        elif key == "is_weights":
            rows = (B,) if layout == "padded" else (B, 1)
            args["is_weights"] = torch.empty(shape if value == "token" else rows, device="meta")
        else:
            args[key] = value
    if layout == "packed":
        args["cu_seqlens"] = torch.empty(B + 1, dtype=torch.int64, device="meta")
    return args, logp


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("upstream", ["loss", "per_sequence_loss", "log_coef"])
def test_loss_forward_and_backward_on_meta(
    impl: str, layout: str, option: str, upstream: str
) -> None:
    """Both paths end to end on meta tensors: no host read, no CPU constant. ``log_coef`` as the
    upstream recomputes the math under autograd in the backward. (CHANGELOG, 0.2): the
    compiled path on meta ended in an Inductor-internal error ("Argument
    'empty_strided_default_2' of Node 'where_4' was used before it has been defined!"); on meta
    it runs the same function uncompiled (docs/api.md, "Devices")."""
    args, logp = _call(layout, option)
    out = gmpo_loss(logp, **args, impl=impl)  # type: ignore[arg-type]
    assert out.loss.is_meta and out.per_sequence_loss.shape == (B,)
    target = {
        "loss": out.loss,
        "per_sequence_loss": out.per_sequence_loss.sum(),
        "log_coef": out.log_coef.sum(),
    }[upstream]
    (grad,) = torch.autograd.grad(target, logp)
    assert grad.is_meta and grad.shape == logp.shape
    m = out.metrics
    assert ("kl" in m) == ("beta" in OPTIONS[option])
    assert ("clip_ratio/dual_mean" in m) == ("dual_clip" in OPTIONS[option])
    assert all(v.is_meta for v in m.values())
    reduced = metrics(sums(out.stats, out.kl_sum), minima(out.stats), "dual_clip" in args)
    assert all(v.is_meta for v in reduced.values())


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_building_blocks_on_meta(layout: str) -> None:
    args, logp = _call(layout, "plain")
    r, adv, mask = args["old_logp"], args["advantages"], args["mask"]
    seg = {"cu_seqlens": args["cu_seqlens"]} if layout == "packed" else {}
    outs = [
        clip_log_ratio(r, epsilon=0.2),
        trust_region_log_ratio(r, adv, epsilon=0.2, dual_clip=2.0, **seg),
        masked_geometric_mean(r, mask, **seg),
        sequence_kl(logp, r, mask, **seg),
        *clip_metrics(r, adv, mask, epsilon=0.2, dual_clip=2.0, **seg),
    ]
    assert all(t.is_meta for t in outs if t is not None)
    (grad,) = torch.autograd.grad(sequence_kl(logp, r, mask, **seg).sum(), logp)
    assert grad.is_meta
    for p in POWERS:  # each branch of the power mean, its gradient too
        out = masked_power_mean(logp, mask, p, **seg)
        assert out.is_meta and out.shape == (B,)
        (grad,) = torch.autograd.grad(out.sum(), logp)
        assert grad.is_meta and grad.shape == logp.shape


# Regression, defect 1 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): tensors on different devices crashed the interpreter on the default path; now a
# ValueError naming the argument and both devices, before any kernel.
@pytest.mark.parametrize("name", ["old_logp", "advantages", "mask", "ref_logp", "is_weights"])
def test_tensors_on_another_device_are_a_value_error(impl: str, name: str) -> None:
    from tests._helpers import random_inputs

    x = random_inputs()
    kw: dict[str, Any] = {"beta": 0.1, "ref_logp": x["old_logp"].clone()}
    if name == "is_weights":
        kw["is_weights"] = torch.ones(3)
    target = x if name in x else kw
    target[name] = target[name].to("meta")
    with pytest.raises(ValueError, match=rf"{name} is on device meta but logp is on cpu"):
        gmpo_loss(**x, **kw, impl=impl)


def test_building_blocks_check_devices() -> None:
    r, adv, mask = torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages is on device meta"):
        trust_region_log_ratio(r, adv.to("meta"))
    with pytest.raises(ValueError, match="mask is on device meta"):
        masked_geometric_mean(r, mask.to("meta"))
    with pytest.raises(ValueError, match="mask is on device meta"):
        masked_power_mean(r, mask.to("meta"), 0.5)
    with pytest.raises(ValueError, match="ref_logp is on device meta"):
        sequence_kl(r, r.to("meta"), mask)
    with pytest.raises(ValueError, match="mask is on device meta"):
        clip_metrics(r, adv, mask.to("meta"))
