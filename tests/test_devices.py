"""Device-generic code, proven without a GPU.

On the ``meta`` device a tensor has no values: any host read (``.item()``, ``.tolist()``,
``bool(t)``) raises, and so does mixing with a CPU tensor. A call that runs end to end on meta
tensors therefore makes no host-device synchronization and creates no constant on the wrong
device, which is what a GPU step needs (docs/semantics.md, "Devices").
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch

import gmpo_core
from gmpo_core import gmpo_loss
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
    for package in ("gmpo_core", "gmpo_trl", "gmpo_verl"):
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
    """Defect 1 (issue 19): ``out.metrics`` and ``gmpo_core.metrics.minima`` raised "Tensor on
    device cpu is not on the expected device meta!"."""
    out = gmpo_loss(**_meta_args())
    m = out.metrics
    assert all(v.device.type == "meta" for v in m.values())
    assert minima(out.stats).device.type == "meta"
    assert metrics(sums(out.stats), minima(out.stats), dual=False)["log_ratio/max"].is_meta


@pytest.mark.parametrize("name", gmpo_core.__all__)
def test_public_names_resolve(name: str) -> None:
    assert getattr(gmpo_core, name) is not None


# Regression, defect 1 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): tensors on different devices crashed the interpreter on the default path; now a
# ValueError naming the argument and both devices, before any kernel.
@pytest.mark.parametrize("name", ["old_logp", "advantages", "mask", "ref_logp", "is_weights"])
def test_tensors_on_another_device_are_a_value_error(impl: str, name: str) -> None:
    from typing import Any

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
    from gmpo_core import clip_metrics, masked_geometric_mean, sequence_kl, trust_region_log_ratio

    r, adv, mask = torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages is on device meta"):
        trust_region_log_ratio(r, adv.to("meta"))
    with pytest.raises(ValueError, match="mask is on device meta"):
        masked_geometric_mean(r, mask.to("meta"))
    with pytest.raises(ValueError, match="ref_logp is on device meta"):
        sequence_kl(r, r.to("meta"), mask)
    with pytest.raises(ValueError, match="mask is on device meta"):
        clip_metrics(r, adv, mask.to("meta"))
