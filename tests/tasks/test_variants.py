"""gmpo_tasks.variants: each of the study's methods against the independent float64 reference
of its variant, and docs/recipes.md's blocks against the module's functions."""

from __future__ import annotations

import inspect
import math
import re
from pathlib import Path

import pytest
import torch

import gmpo_tasks.variants as variants
from gmpo_core import reference
from gmpo_tasks.variants import METHODS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"


# each study method against the independent float64 reference of the same variant
REFERENCE = {
    "grpo": dict(variant="grpo_arithmetic", epsilon=0.2),
    "grpo_wide": dict(variant="grpo_arithmetic", epsilon=-math.expm1(-0.4),
                      epsilon_high=math.expm1(0.4)),
    "gmpo": dict(variant="token_clip", epsilon=0.4),
    "gmpo_narrow": dict(variant="token_clip", epsilon=0.2),
    "gmpo_noclip": dict(variant="no_clip"),
    "gmpo_seqclip": dict(variant="sequence_clip", epsilon=0.4),
}  # fmt: skip


@pytest.mark.parametrize("method", sorted(METHODS))
def test_methods_match_the_reference(method: str) -> None:
    assert set(REFERENCE) == set(METHODS)
    g = torch.Generator().manual_seed(0)
    b, t = 12, 7
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    old = logp + 0.6 * torch.randn(b, t, generator=g, dtype=torch.float64)  # the clip acts
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    adv[0] = 0.0
    mask = torch.arange(t)[None, :] < torch.randint(0, t + 1, (b,), generator=g)[:, None]
    loss, clipped = METHODS[method].loss(logp, old, adv, mask)
    want = reference.variant_loss(logp.numpy(), old.numpy(), adv.numpy(), mask.numpy(),
                                  **REFERENCE[method])  # fmt: skip
    assert float(loss) == pytest.approx(float(want), rel=1e-10, abs=1e-12)
    assert 0.0 <= float(clipped) <= 1.0
    if method != "gmpo_noclip":
        assert float(clipped) > 0  # with this drift some token is clipped


def _page_functions() -> dict[str, str]:
    """Every top-level function of the page's python blocks: name -> source."""
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.M | re.S)
    defs = re.split(r"\n(?=def )", "\n".join(blocks))
    out = {}
    for chunk in defs:
        if chunk.startswith("def "):
            name = chunk[4 : chunk.index("(")]
            out[name] = chunk.strip()
    return out


def test_the_recipes_page_shows_the_module() -> None:
    """docs/recipes.md's recipes are gmpo_tasks.variants' functions, letter for letter: the page
    a user reads is the code the study imports (tests/tasks/test_recipes.py runs the page)."""
    page = _page_functions()
    assert {"masked_log_ratio", "policy_loss", "gmpo_from_blocks", "sequence_clip_loss",
            "grpo_arithmetic_loss"} <= set(page)  # fmt: skip
    for name, source in page.items():
        assert source == inspect.getsource(getattr(variants, name)).strip(), (
            f"docs/recipes.md's {name} differs from gmpo_tasks.variants.{name}"
        )
