"""The recipes of docs/recipes.md, executed from the page and checked against the reference.

Every ```python block of the page is executed, in order, in one namespace, so the page and this
test cannot drift apart. Each recipe is checked against the float64 reference of its variant
(paper Sec. 4 ablations; ``gmpo_variants``' ``*_reference`` functions): values in float32 and float64, gradients against the reference's
closed-form GMPO gradient or central finite differences of the float64 reference.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, event, example, given
from hypothesis import strategies as st

from gmpo_core import gmpo_loss, reference
from tests._helpers import assert_close, to_torch, valid_log_ratio, well_conditioned
from tests.strategies import Batch, batches, garbage
from tests.variants._references import variant_loss

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)

# recipe name -> the reference variant it implements
VARIANT_OF = {
    "gmpo_from_blocks": "token_clip",
    "sequence_clip_loss": "sequence_clip",
    "no_length_norm_loss": "no_length_norm",
    "no_clip_loss": "no_clip",
    "grpo_arithmetic_loss": "grpo_arithmetic",
    "asymmetric_clip_loss": "token_clip",
    "asymmetric_clip_from_blocks": "token_clip",
    "power_mean_loss": "power_mean",
}
HELPERS = {"masked_log_ratio", "policy_loss"}
SIGNATURE = ["logp", "old_logp", "advantages", "mask", "epsilon", "epsilon_high"]
DTYPES = [torch.float32, torch.float64]

# Central differences of the float64 reference: step H, good to ~1e-10 relative (truncation
# H^2/6 of a third derivative of the size of the loss; rounding 1e-16 * loss / H). Inputs within
# MARGIN (>> H) of a kink are discarded. The float64 autograd gradient is compared with FD_TOL,
# since the difference quotient, not the recipe, is the inexact side there.
H, MARGIN = 1e-5, 1e-4
FD_TOL = (1e-7, 1e-9)  # (rtol, atol x scale)

STRATEGY = batches(beta=False, weights=False, dual=False)


def _load_page() -> dict[str, Any]:
    """Execute the page's python blocks in one namespace; line numbers match the page."""
    text = PAGE.read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "recipes"}
    for match in BLOCK.finditer(text):
        first_line = text.count("\n", 0, match.start(1))
        code = compile("\n" * first_line + match.group(1), str(PAGE), "exec")
        exec(code, namespace)
    return namespace


PAGE_NS = _load_page()


def _recipe(name: str) -> Callable[..., torch.Tensor]:
    return PAGE_NS[name]  # type: ignore[no-any-return]


def _call(name: str, batch: Batch, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe's loss on ``batch`` in ``dtype`` and its gradient with respect to logp."""
    args = to_torch(batch, dtype)
    args.setdefault("epsilon_high", None)  # the asymmetric recipes have a different default
    if "impl" in inspect.signature(_recipe(name)).parameters:
        args["impl"] = "plain"  # the compiled path is checked against plain in test_properties
    loss = _recipe(name)(**args)
    (grad,) = torch.autograd.grad(loss, args["logp"])
    return loss, grad


def _eps(batch: Batch) -> dict[str, Any]:
    return {"epsilon": batch.kwargs["epsilon"], "epsilon_high": batch.kwargs.get("epsilon_high")}


def _ref_loss(batch: Batch, variant: str, logp: np.ndarray | None = None) -> float:
    lp = batch.logp.astype(np.float64) if logp is None else logp
    return variant_loss(
        lp, batch.old_logp.astype(np.float64), batch.advantages, batch.mask,
        variant=variant, **_eps(batch),
    )  # fmt: skip


def _ref_rows(batch: Batch, variant: str) -> np.ndarray:
    """Per-row reference losses (the reference returns only the mean; a row alone is its mean)."""
    rows = [
        Batch(batch.logp[i : i + 1], batch.old_logp[i : i + 1], batch.advantages[i : i + 1],
              batch.mask[i : i + 1], batch.kwargs)
        for i in range(batch.shape[0])
    ]  # fmt: skip
    return np.array([_ref_loss(row, variant) for row in rows])


def _scale(rows: np.ndarray) -> float:
    """Scale of the terms averaged into the loss: the atol of a mean is relative to its largest term."""
    return float(max(1.0, np.abs(rows).max(initial=0.0)))


def _fd_grad(batch: Batch, variant: str) -> np.ndarray:
    """Central finite differences of the float64 reference at every valid position (0 elsewhere)."""
    lp = batch.logp.astype(np.float64)
    grad = np.zeros_like(lp)
    for b, t in zip(*np.nonzero(batch.mask), strict=True):
        up, down = lp.copy(), lp.copy()
        up[b, t] += H
        down[b, t] -= H
        grad[b, t] = (_ref_loss(batch, variant, up) - _ref_loss(batch, variant, down)) / (2 * H)
    return grad


def _differentiable(batch: Batch, variant: str) -> bool:
    """No clip kink of ``variant`` within MARGIN of the input (the gradient is defined there, and
    float32 and float64 agree on which side of every bound each value is)."""
    eps_l = batch.kwargs["epsilon"]
    eps_h = batch.kwargs.get("epsilon_high") or eps_l
    if variant in ("token_clip", "no_length_norm", "power_mean"):
        return well_conditioned(batch, MARGIN)
    if variant == "no_clip":
        return True
    if variant == "grpo_arithmetic":  # kinks at rho = 1 + eps_h and rho = 1 - eps_l (if > 0)
        bounds = [math.log1p(eps_h)] + ([math.log1p(-eps_l)] if eps_l < 1 else [])
        r = valid_log_ratio(batch)
        return all(np.all(np.abs(r - k) > MARGIN) for k in bounds)
    assert variant == "sequence_clip"  # kinks where the row mean of r crosses a bound
    r = batch.logp.astype(np.float64) - batch.old_logp.astype(np.float64)
    n = batch.mask.sum(-1)
    s = np.where(batch.mask, r, 0.0).sum(-1) / np.maximum(n, 1)
    rows = n > 0
    return all(np.all(np.abs(s[rows] - k) > MARGIN) for k in (-eps_l, eps_h))


def _hand_batch() -> Batch:
    """Three rows, epsilon = 0.4, NaN/inf in the padding.

    Row 0: A = +1, r = [0.1, 0.9]. Row 1: A = -2, r = [-0.9, -0.6, 0.0]. Row 2: empty, A = +1.
    """
    nan, inf = float("nan"), float("inf")
    logp = np.array([[-1.0, -0.1, nan], [-1.9, -1.6, -0.5], [nan, inf, -inf]])
    old = np.array([[-1.1, -1.0, inf], [-1.0, -1.0, -0.5], [-inf, nan, 0.0]])
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], bool)
    return Batch(logp, old, np.array([1.0, -2.0, 1.0], np.float32), mask, {"epsilon": 0.4})


exp = math.exp
# Row 2 is empty: 0, and B = 3 in every mean.
HAND_EXPECTED = {
    # token clip: row 0 c = [0.1, min(0.9, 0.4)] -> 0.5 / 2 = 0.25, loss -e^0.25;
    #             row 1 c = [max(-0.9, -0.4), max(-0.6, -0.4), 0] -> -0.8 / 3, loss 2 e^(-4/15).
    "token_clip": (-exp(0.25) + 2 * exp(-4 / 15)) / 3,
    # sequence clip: row 0 s = 1.0 / 2 = 0.5 -> min(0.5, 0.4) = 0.4, loss -e^0.4;
    #                row 1 s = -1.5 / 3 = -0.5 -> max(-0.5, -0.4) = -0.4, loss 2 e^-0.4.
    "sequence_clip": (-exp(0.4) + 2 * exp(-0.4)) / 3,
    # no clip: row 0 -e^0.5; row 1 2 e^-0.5.
    "no_clip": (-exp(0.5) + 2 * exp(-0.5)) / 3,
    # no 1/|o|: row 0 exp(0.1 + 0.4) = e^0.5, loss -e^0.5; row 1 exp(-0.4 - 0.4 + 0), loss 2 e^-0.8.
    "no_length_norm": (-exp(0.5) + 2 * exp(-0.8)) / 3,
    # GRPO, ratio clip [0.6, 1.4]: row 0 (A > 0) min(rho, 1.4) = [e^0.1, 1.4], loss -(e^0.1 + 1.4)/2;
    #   row 1 (A < 0) A max(rho, 0.6) = -2 [0.6, 0.6, 1] (e^-0.9 = 0.41, e^-0.6 = 0.55), loss 4.4/3.
    "grpo_arithmetic": (-(exp(0.1) + 1.4) / 2 + 4.4 / 3) / 3,
    # power mean p = -1 (harmonic) of the clipped ratios: row 0 c = [0.1, 0.4],
    #   M = 2 / (e^-0.1 + e^-0.4), loss -M; row 1 c = [-0.4, -0.4, 0], M = 3 / (2 e^0.4 + 1), loss 2M.
    "power_mean": (-2 / (exp(-0.1) + exp(-0.4)) + 2 * 3 / (2 * exp(0.4) + 1)) / 3,
}


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------


def test_page_defines_exactly_the_tested_recipes() -> None:
    defined = {
        name
        for name, obj in PAGE_NS.items()
        if inspect.isfunction(obj) and obj.__module__ == "recipes"
    }
    assert defined == set(VARIANT_OF) | HELPERS
    for name in VARIANT_OF:
        params = list(inspect.signature(_recipe(name)).parameters)
        assert params[: len(SIGNATURE)] == SIGNATURE, name
        assert _recipe(name).__doc__, name


@given(batch=STRATEGY, junk=garbage())
def test_masked_log_ratio_is_exactly_zero_in_the_padding(batch: Batch, junk: float) -> None:
    """The helper's contract (the recipes re-mask downstream, so they alone cannot show it)."""
    logp = np.where(batch.mask, batch.logp, np.float32(junk))
    r, valid = PAGE_NS["masked_log_ratio"](
        torch.tensor(logp), torch.tensor(batch.old_logp), torch.tensor(batch.mask)
    )
    expected = np.where(batch.mask, batch.logp - batch.old_logp, 0.0)
    assert torch.equal(valid, torch.tensor(batch.mask))
    assert np.array_equal(r.numpy(), expected.astype(np.float32))


@pytest.mark.parametrize("name", sorted(VARIANT_OF))
def test_hand_worked_case(name: str) -> None:
    batch = _hand_batch()
    variant = VARIANT_OF[name]
    expected = HAND_EXPECTED[variant]
    assert _ref_loss(batch, variant) == pytest.approx(expected, abs=1e-12)
    loss, grad = _call(name, batch, torch.float64)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert torch.isfinite(grad).all()
    assert torch.equal(grad[~torch.tensor(batch.mask)], torch.zeros(4, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# Values and gradients equal the reference
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VARIANT_OF))
@given(batch=STRATEGY)
@example(  # long rows far outside the clip range: exp(sum) in no_length_norm is e^48
    batch=Batch(
        logp=np.full((3, 12), -1.0, np.float32),
        old_logp=np.array([[-5.0] * 12, [3.0] * 12, [-1.0] * 12], np.float32),
        advantages=np.array([-1.0, 1.0, 0.0], np.float32),
        mask=np.ones((3, 12), bool),
        kwargs={"epsilon": 0.4},
    )
)
def test_matches_reference(name: str, batch: Batch) -> None:
    """Value in float32 and float64 equals ``variant_loss``; where the loss is differentiable the
    gradient equals the reference's closed form (token-clip recipes) or its central finite
    differences (the others). Masked positions always get a gradient of exactly 0."""
    variant = VARIANT_OF[name]
    rows = _ref_rows(batch, variant)
    assume(np.all(np.abs(rows) < 1e30))  # float32's range (docs/semantics.md S9)
    scale = _scale(rows)
    expected = _ref_loss(batch, variant)
    np.testing.assert_allclose(rows.mean(), expected, rtol=1e-12, atol=0)
    results = {dtype: _call(name, batch, dtype) for dtype in DTYPES}
    invalid = torch.tensor(~batch.mask)
    for dtype, (loss, grad) in results.items():
        assert loss.shape == () and loss.dtype == dtype
        assert_close(loss, expected, dtype, "value", scale)
        assert torch.isfinite(grad).all()
        assert torch.equal(grad[invalid], torch.zeros_like(grad[invalid]))

    if not _differentiable(batch, variant):
        event("gradient not checked: within MARGIN of a kink")
        return
    if variant == "token_clip":
        expected_grad = reference.gmpo_loss(
            batch.logp.astype(np.float64), batch.old_logp.astype(np.float64), batch.advantages,
            batch.mask, **_eps(batch),
        ).grad_logp  # fmt: skip
        assert_close(results[torch.float64][1], expected_grad, torch.float64, "grad", scale)
    else:
        expected_grad = _fd_grad(batch, variant)
        rtol, atol = FD_TOL
        np.testing.assert_allclose(
            results[torch.float64][1].numpy(), expected_grad, rtol=rtol, atol=atol * scale
        )
    assert_close(results[torch.float32][1], expected_grad, torch.float32, "grad", scale)


@pytest.mark.parametrize(
    "name", ["gmpo_from_blocks", "asymmetric_clip_loss", "asymmetric_clip_from_blocks"]
)
@given(batch=STRATEGY, epsilon_high=st.sampled_from([None, 0.1, 0.28, 0.6, 2.0]))
def test_token_clip_recipes_equal_gmpo_loss(
    name: str, batch: Batch, epsilon_high: float | None
) -> None:
    """GMPO from the blocks, and both asymmetric recipes, are gmpo_loss(impl="plain") with the
    same (epsilon, epsilon_high): value and gradient."""
    batch = batch.with_kwargs(epsilon_high=epsilon_high)
    for dtype in DTYPES:
        args = to_torch(batch, dtype)
        expected = gmpo_loss(**args, impl="plain")
        (expected_grad,) = torch.autograd.grad(expected.loss, args["logp"])
        loss, grad = _call(name, batch, dtype)
        scale = float(max(1.0, expected.per_sequence_loss.abs().max().item()))
        assert_close(loss, expected.loss, dtype, "value", scale)
        if well_conditioned(batch, MARGIN):  # same clip decisions on both sides
            assert_close(grad, expected_grad, dtype, "grad", scale)


@given(batch=STRATEGY)
def test_on_policy_grpo_and_gmpo_agree(batch: Batch) -> None:
    """At old_logp == logp every ratio is 1: both recipes give -A_i per row, and the gradient
    -A_i / (|o_i| B) on each valid token (docs/semantics.md S10)."""
    on_policy = Batch(batch.logp, batch.logp.copy(), batch.advantages, batch.mask, batch.kwargs)
    loss_grpo, grad_grpo = _call("grpo_arithmetic_loss", on_policy, torch.float64)
    loss_gmpo, grad_gmpo = _call("gmpo_from_blocks", on_policy, torch.float64)
    assert_close(loss_grpo, loss_gmpo, torch.float64, "value", 5.0)
    assert_close(grad_grpo, grad_gmpo, torch.float64, "grad", 5.0)


# ---------------------------------------------------------------------------------------------
# Masking: padding, empty rows and A = 0 rows
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VARIANT_OF))
@given(
    batch=STRATEGY,
    pad=st.integers(1, 3),
    junk=garbage(),
    adv=st.floats(-5, 5, width=32, allow_subnormal=False),
)
def test_garbage_in_padding_empty_and_zero_advantage_rows(
    name: str, batch: Batch, pad: int, junk: float, adv: float
) -> None:
    """Appending masked columns, an empty row and an A = 0 row, all full of NaN/inf/huge values,
    only rescales the loss by B / (B + 2) (the new rows count in the mean), and every new
    position gets a gradient of exactly 0."""
    scale = _scale(_ref_rows(batch, VARIANT_OF[name]))
    assume(scale < 1e30)  # float32's range (docs/semantics.md S9)
    b, t = batch.shape
    width = t + pad

    def grow(a: np.ndarray, fill: float | bool, new_rows: np.ndarray) -> np.ndarray:
        a = np.concatenate([a, np.full((b, pad), fill, a.dtype)], axis=1)
        return np.concatenate([a, new_rows.astype(a.dtype)], axis=0)

    junk_rows = np.full((2, width), junk, np.float32)
    mask_rows = np.stack([np.zeros(width, bool), np.ones(width, bool)])  # empty row, full A = 0 row
    big = Batch(
        grow(batch.logp, junk, junk_rows),
        grow(batch.old_logp, -junk, -junk_rows),
        np.concatenate([batch.advantages, np.array([adv, 0.0], np.float32)]),
        grow(batch.mask, False, mask_rows),
        batch.kwargs,
    )
    loss, grad = _call(name, batch, torch.float32)
    loss_big, grad_big = _call(name, big, torch.float32)
    shrink = b / (b + 2)
    assert_close(loss_big, loss.detach() * shrink, torch.float32, "value", scale)
    assert_close(grad_big[:b, :t], grad * shrink, torch.float32, "grad", scale)
    assert torch.equal(grad_big[:, t:], torch.zeros(b + 2, pad))
    assert torch.equal(grad_big[b:], torch.zeros(2, width))


@pytest.mark.parametrize("name", sorted(VARIANT_OF))
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), 3e38])
def test_only_empty_and_zero_advantage_rows_give_exactly_zero(name: str, junk: float) -> None:
    """Row 0: A = 0 with junk at its valid positions; row 1: empty, A = 1, junk everywhere."""
    batch = Batch(
        logp=np.array([[junk, -1.0, junk], [junk, junk, junk]], np.float32),
        old_logp=np.array([[-junk, -9.0, 0.0], [-junk, 0.0, junk]], np.float32),
        advantages=np.array([0.0, 1.0], np.float32),
        mask=np.array([[1, 1, 1], [0, 0, 0]], bool),
        kwargs={"epsilon": 0.4},
    )
    for dtype in DTYPES:
        loss, grad = _call(name, batch, dtype)
        assert loss.item() == 0.0
        assert torch.equal(grad, torch.zeros_like(grad))
