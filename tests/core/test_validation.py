"""Bad input gets a ValueError naming the argument (docs/semantics.md S13); shape checks never
synchronize with the device; value checks are opt-in."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch

from gmpo_core import (
    clip_log_ratio,
    clip_metrics,
    gmpo_loss,
    masked_geometric_mean,
    options,
    sequence_kl,
    trust_region_log_ratio,
)

B, T = 3, 5


def good() -> dict[str, Any]:
    return {
        "logp": torch.zeros(B, T),
        "old_logp": torch.zeros(B, T),
        "advantages": torch.ones(B),
        "mask": torch.ones(B, T, dtype=torch.bool),
    }


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("logp not 2-D", {"logp": torch.zeros(B * T)}, r"logp must have shape \(B, T\)"),
    ("logp integer", {"logp": torch.zeros(B, T, dtype=torch.long)}, r"logp must be a real floating"),
    ("logp complex", {"logp": torch.zeros(B, T, dtype=torch.complex64)}, r"logp must be a real floating"),
    ("old_logp shape", {"old_logp": torch.zeros(B, T + 1)}, r"old_logp must have the shape of logp \(3, 5\), got \(3, 6\)"),
    ("ref_logp shape", {"beta": 0.1, "ref_logp": torch.zeros(B + 1, T)}, r"ref_logp must have the shape of logp"),
    ("advantages (B, T)", {"advantages": torch.ones(B, T)}, r"advantages must have shape \(B,\).*\(3, 5\)"),
    ("advantages 0-d", {"advantages": torch.tensor(1.0)}, r"advantages must have shape \(B,\)"),
    ("advantages wrong B", {"advantages": torch.ones(B + 1)}, r"advantages must have shape \(B,\) with B = logp.shape\[0\]"),
    ("advantages complex", {"advantages": torch.ones(B, dtype=torch.complex64)}, r"advantages must be a real .*complex64"),
    ("advantages bool", {"advantages": torch.ones(B, dtype=torch.bool)}, r"advantages must be a real"),
    ("mask shape", {"mask": torch.ones(B, T - 1)}, r"mask must have the shape of logp \(3, 5\), got \(3, 4\)"),
    ("mask complex", {"mask": torch.ones(B, T, dtype=torch.complex64)}, r"mask must be bool, integer or real floating"),
    ("mask not a tensor", {"mask": [[1] * T] * B}, r"mask must be a tensor"),
    ("epsilon 0", {"epsilon": 0.0}, r"epsilon must be a finite number > 0.*got 0.0"),
    ("epsilon negative", {"epsilon": -0.2}, r"epsilon must be a finite number > 0"),
    ("epsilon nan", {"epsilon": math.nan}, r"epsilon must be a finite number > 0"),
    ("epsilon inf", {"epsilon": math.inf}, r"epsilon must be a finite number > 0"),
    ("epsilon tensor", {"epsilon": torch.tensor(0.4)}, r"epsilon must be a finite number > 0"),
    ("epsilon_high 0", {"epsilon_high": 0}, r"epsilon_high must be a finite number > 0"),
    ("epsilon_high inf", {"epsilon_high": math.inf}, r"epsilon_high must be a finite number > 0"),
    ("beta negative", {"beta": -0.1, "ref_logp": torch.zeros(B, T)}, r"beta must be a finite number >= 0, got -0.1"),
    ("beta nan", {"beta": math.nan, "ref_logp": torch.zeros(B, T)}, r"beta must be a finite number >= 0"),
    ("beta without ref_logp", {"beta": 0.1}, r"beta=0.1 needs ref_logp"),
    ("dual_clip 1", {"dual_clip": 1.0}, r"dual_clip must be a finite number > 1"),
    ("dual_clip 0.5", {"dual_clip": 0.5}, r"dual_clip must be a finite number > 1"),
    ("dual_clip inf", {"dual_clip": math.inf}, r"dual_clip must be a finite number > 1"),
    ("is_weights shape", {"is_weights": torch.ones(B, 2)}, r"is_weights must have shape \(B,\), \(B, 1\) or \(B, T\)"),
    ("is_weights integer", {"is_weights": torch.ones(B, dtype=torch.long)}, r"is_weights must be a real floating"),
    ("impl", {"impl": "fast"}, r"impl must be 'plain' \(the default\) or 'compiled', got 'fast'"),
    # (CHANGELOG, 0.2): numbers no float holds raised OverflowError (not a ValueError), or
    # passed the check and became an infinite bound (a longdouble), or 1 (a dual cap of 1)
    ("epsilon 10**400", {"epsilon": 10**400}, r"epsilon must be a finite number > 0.*got 1000"),
    ("epsilon Fraction 10**400", {"epsilon": Fraction(10**400)}, r"epsilon must be a finite number > 0"),
    ("epsilon longdouble 1e400", {"epsilon": np.longdouble("1e400")}, r"epsilon must be a finite number > 0"),
    ("epsilon_high longdouble 1e400", {"epsilon_high": np.longdouble("1e400")}, r"epsilon_high must be a finite number > 0"),
    ("epsilon 1e-400 (0 as a float)", {"epsilon": Fraction(1, 10**400)}, r"epsilon must be a finite number > 0"),
    ("beta 10**400", {"beta": 10**400, "ref_logp": torch.zeros(B, T)}, r"beta must be a finite number >= 0"),
    ("beta longdouble 1e400", {"beta": np.longdouble("1e400"), "ref_logp": torch.zeros(B, T)}, r"beta must be a finite number >= 0"),
    ("dual_clip 10**400", {"dual_clip": 10**400}, r"dual_clip must be a finite number > 1"),
    ("dual_clip longdouble 1e400", {"dual_clip": np.longdouble("1e400")}, r"dual_clip must be a finite number > 1"),
    ("dual_clip 1 + 1e-20 (1 as a float)", {"dual_clip": Fraction(10**20 + 1, 10**20)}, r"dual_clip must be a finite number > 1"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "override", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_value_error_naming_the_argument(
    case: str, override: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        gmpo_loss(**{**good(), **override})


def test_good_input_passes() -> None:
    out = gmpo_loss(**good(), impl="plain")
    assert out.loss.item() == -1.0  # on-policy, A = 1 everywhere: -mean(A) = -1


@pytest.mark.parametrize("value", [np.longdouble("0.25"), np.float32(0.25), Fraction(1, 4), 1])
def test_hyperparameters_are_read_as_floats(value: Any) -> None:
    """Any real number a float holds is accepted, and read as that float."""
    got = options.check_hyperparameters(value, value, 1 + value)
    assert got == (float(value), float(value), math.log(1 + float(value)))
    beta = options.check_beta(value, True)
    assert beta == float(value)
    assert {type(x) for x in (*got, beta)} == {float}


VALUE_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("mask of 2", {"mask": torch.full((B, T), 2.0)}, r"mask must hold only 0 and 1"),
    ("logp nan at a valid position", {"logp": torch.zeros(B, T).index_fill_(1, torch.tensor([2]), math.nan)}, r"logp has non-finite values at valid"),
    ("old_logp inf", {"old_logp": torch.full((B, T), -math.inf)}, r"old_logp has non-finite values"),
    ("ref_logp nan", {"beta": 0.1, "ref_logp": torch.full((B, T), math.nan)}, r"ref_logp has non-finite values"),
    ("negative weight", {"is_weights": -torch.ones(B)}, r"is_weights must be finite and >= 0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "override", "message"), VALUE_CASES, ids=[c[0] for c in VALUE_CASES]
)
def test_value_checks_are_opt_in(case: str, override: dict[str, Any], message: str) -> None:
    args = {**good(), **override}
    gmpo_loss(**args, impl="plain")  # off by default: no error, no device synchronization
    with pytest.raises(ValueError, match=message):
        gmpo_loss(**args, impl="plain", check_values=True)


def test_nan_at_masked_positions_passes_value_checks() -> None:
    args = good()
    args["mask"][:, -1] = False
    args["logp"][:, -1] = math.nan
    out = gmpo_loss(**args, impl="plain", check_values=True)
    assert out.loss.item() == -1.0


def test_building_blocks_validate() -> None:
    r, a, m = torch.zeros(B, T), torch.ones(B), torch.ones(B, T)
    with pytest.raises(ValueError, match="epsilon must be"):
        clip_log_ratio(r, epsilon=-1)
    with pytest.raises(ValueError, match="advantages must have shape"):
        trust_region_log_ratio(r, torch.ones(B, T))
    with pytest.raises(ValueError, match="dual_clip must be"):
        trust_region_log_ratio(r, a, dual_clip=0.9)
    with pytest.raises(ValueError, match="mask must have the shape of log_values"):
        masked_geometric_mean(r, m[:, :2])
    with pytest.raises(ValueError, match="ref_logp must have the shape of logp"):
        sequence_kl(r, r[:, :2], m)
    with pytest.raises(ValueError, match="mask must be bool"):
        clip_metrics(r, a, m.to(torch.complex64))


def test_validation_does_not_synchronize_with_the_device() -> None:
    """Shape, dtype and argument checks read no tensor value: they run on the meta device, where
    reading a value is impossible."""
    meta = {k: v.to("meta") for k, v in good().items()}
    from gmpo_core import _checks

    options.check_hyperparameters(0.4, 0.28, 3.0)
    options.check_beta(0.1, True)
    weights = torch.ones(B, device="meta")
    inputs = _checks.Inputs(
        meta["logp"], meta["old_logp"], meta["advantages"], meta["mask"], None, weights
    )
    _checks.check_inputs(inputs)
    with pytest.raises(ValueError, match="advantages must have shape"):
        _checks.check_inputs(inputs._replace(advantages=meta["logp"]))
    # and the eager loss itself runs on meta tensors end to end (no .item(), no host sync)
    out = gmpo_loss(**meta, impl="plain")
    assert out.loss.device.type == "meta" and out.loss.shape == ()


def test_option_rules_load_without_torch() -> None:
    """The adapters' configs and command-line help check options with gmpo_core.options, which
    must not load torch (the CLI's --help does not)."""
    import subprocess
    import sys

    code = (
        "import sys, gmpo_core.options as o; o.check_hyperparameters(0.4, None, 2.0); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Regression, defect 10 of those found by trying the 0.1 default path as a new user would
# (CHANGELOG, 0.2): check_values=True let NaN advantages through.
def test_check_values_rejects_nan_advantages(impl: str) -> None:
    from tests._helpers import random_inputs

    x = random_inputs(seed=10)
    x["advantages"] = torch.tensor([1.0, math.nan, 0.5])
    with pytest.raises(ValueError, match="advantages must be finite"):
        gmpo_loss(**x, impl=impl, check_values=True)
