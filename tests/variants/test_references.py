"""The float64 references of the variants (the paper's ablations, ``gmpo_variants``' ``*_reference``
functions): hand cases, empty and zero-advantage rows, the token-clip variant against
``reference.gmpo_loss``, unknown names."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from gmpo_core import reference
from tests.variants._references import variant_loss

NAN, INF = math.nan, math.inf
EXACT = 1e-12  # hand cases: only float64 rounding separates the two sides


# --------------------------------------------------------------------------- variants


def _variant_case() -> dict[str, Any]:
    """Row 0: A = +1, r = [0.3, 0.9]. Row 1: A = -2, r = [-1.1, 0.2, 0.0]."""
    old = np.full((2, 3), -2.0)
    r = np.array([[0.3, 0.9, NAN], [-1.1, 0.2, 0.0]])
    return {
        "logp": old + r,
        "old_logp": old,
        "advantages": [1.0, -2.0],
        "mask": [[1, 1, 0], [1, 1, 1]],
    }


E = math.exp
VARIANT_CASES = [
    # token clip (eps 0.4): row 0 c = [0.3, 0.4] -> 0.35; row 1 c = [-0.4, 0.2, 0] -> -0.2/3.
    ("token_clip", 0.4, None, (-E(0.35) + 2 * E(-0.2 / 3)) / 2),
    # sequence clip: s_0 = 1.2/2 = 0.6 -> min(0.6, 0.4) = 0.4; s_1 = -0.9/3 = -0.3 (kept).
    ("sequence_clip", 0.4, None, (-E(0.4) + 2 * E(-0.3)) / 2),
    # sequence clip, eps_l 0.2 / eps_h 0.5: s_0 = 0.6 -> 0.5; s_1 = -0.3 -> -0.2.
    ("sequence_clip", 0.2, 0.5, (-E(0.5) + 2 * E(-0.2)) / 2),
    # no clip: l = s = [0.6, -0.3].
    ("no_clip", 0.4, None, (-E(0.6) + 2 * E(-0.3)) / 2),
    # no length norm: l = sum of clipped = [0.3 + 0.4, -0.4 + 0.2 + 0] = [0.7, -0.2].
    ("no_length_norm", 0.4, None, (-E(0.7) + 2 * E(-0.2)) / 2),
    # GRPO, ratio bounds [0.8, 1.2]. Row 0 (A = 1): rho = [e^.3 = 1.35, e^.9 = 2.46] -> both
    #   min(rho, 1.2) = 1.2, row value -1.2.  Row 1 (A = -2): rho = [e^-1.1 = 0.33, e^.2 = 1.22, 1]
    #   o = [min(-0.67, -1.6), min(-2.44, -2.4), -2] = [-1.6, -2 e^.2, -2]; row = (3.6 + 2e^.2)/3.
    ("grpo_arithmetic", 0.2, None, (-1.2 + (3.6 + 2 * E(0.2)) / 3) / 2),
]


@pytest.mark.parametrize(("variant", "eps", "eps_high", "expected"), VARIANT_CASES)
def test_variant_hand_cases(
    variant: str, eps: float, eps_high: float | None, expected: float
) -> None:
    value = variant_loss(**_variant_case(), variant=variant, epsilon=eps, epsilon_high=eps_high)
    assert value == pytest.approx(expected, abs=EXACT)


@pytest.mark.parametrize(("variant", "eps", "eps_high", "expected"), VARIANT_CASES)
def test_variant_empty_and_zero_advantage_rows(
    variant: str, eps: float, eps_high: float | None, expected: float
) -> None:
    # Append an empty row (A = 3) and an A = 0 row with r = 800 (exp overflows to inf there):
    # both contribute exactly 0 and count in the mean, so the loss becomes expected * 2 / 4.
    case = _variant_case()
    case["logp"] = np.vstack([case["logp"], [NAN, NAN, NAN], [800.0, 800.0, 800.0]])
    case["old_logp"] = np.vstack([case["old_logp"], [NAN, NAN, NAN], [0.0, 0.0, 0.0]])
    case["advantages"] = [*case["advantages"], 3.0, 0.0]
    case["mask"] = [*case["mask"], [0, 0, 0], [1, 1, 1]]
    with np.errstate(all="raise"):
        value = variant_loss(**case, variant=variant, epsilon=eps, epsilon_high=eps_high)
    assert value == pytest.approx(expected / 2, abs=EXACT)


def test_token_clip_variant_is_gmpo_loss() -> None:
    rng = np.random.default_rng(7)
    logp, old = rng.normal(-1, 0.6, (4, 7)), rng.normal(-1, 0.6, (4, 7))
    adv, mask = rng.normal(size=4), rng.random((4, 7)) < 0.7
    value = variant_loss(logp, old, adv, mask, variant="token_clip", epsilon=0.25)
    assert value == reference.gmpo_loss(logp, old, adv, mask, epsilon=0.25).loss
    assert value != variant_loss(logp, old, adv, mask, variant="no_clip")


def test_unknown_variant_lists_valid_names() -> None:
    with pytest.raises(ValueError, match=r"token_clip.*sequence_clip.*grpo_arithmetic"):
        variant_loss(**_variant_case(), variant="geo_mean")


def test_bad_epsilon_raises() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        variant_loss(**_variant_case(), variant="sequence_clip", epsilon=0.0)
