"""gmpo_variants' registry: every registered variant against its float64 reference counterpart,
registration rules, ``resolve`` (names, ``module:function``, and one-line refusals), a variant
that returns the loss alone, and docs/recipes.md's blocks against the package's functions."""

from __future__ import annotations

import inspect
import json
import math
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gmpo_variants
from gmpo_variants import VARIANTS, Variant, register, resolve
from gmpo_variants import registry as registry_module
from tests._user_code import run_with_modules

PAGE = Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
WITH_REFERENCE = [name for name, v in VARIANTS.items() if v.reference is not None]


def _inputs(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    b, t = 12, 7
    logp = -torch.rand(b, t, generator=g, dtype=dtype) * 3
    old = logp + 0.6 * torch.randn(b, t, generator=g, dtype=dtype)  # the clip acts
    adv = torch.randn(b, generator=g, dtype=dtype)
    adv[0] = 0.0
    mask = torch.arange(t)[None, :] < torch.randint(0, t + 1, (b,), generator=g)[:, None]
    return logp, old, adv, mask


def test_the_built_in_variants_are_listed_grpo_first() -> None:
    names = list(VARIANTS)
    assert names[:6] == ["grpo", "grpo_wide", "gmpo", "gmpo_narrow", "gmpo_noclip", "gmpo_seqclip"]
    assert all(VARIANTS[n].name == n for n in names)


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_each_variant_matches_its_float64_reference(name: str) -> None:
    logp, old, adv, mask = _inputs()
    variant = VARIANTS[name]
    loss, clipped = variant(logp, old, adv, mask)
    want = variant.reference(logp.numpy(), old.numpy(), adv.numpy(), mask.numpy())  # type: ignore[misc]
    assert float(loss) == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert 0.0 <= float(clipped) <= 1.0
    if variant.bounds is not None:
        assert float(clipped) > 0  # with this drift some token is clipped


def test_the_recipes_variants_have_references_and_the_clip_variants_bounds() -> None:
    assert {"grpo", "grpo_wide", "gmpo", "gmpo_narrow", "gmpo_noclip", "gmpo_seqclip"} <= set(
        WITH_REFERENCE
    )
    assert VARIANTS["gmpo"].bounds == (0.4, 0.4) and VARIANTS["gmpo_narrow"].bounds == (0.2, 0.2)
    low, high = VARIANTS["grpo"].bounds  # type: ignore[misc]
    assert (low, high) == pytest.approx((-math.log(0.8), math.log(1.2)), rel=1e-15)


def test_registering_another_function_under_a_taken_name_raises() -> None:
    def other(lp, old, a, m):  # type: ignore[no-untyped-def]
        return lp.sum()

    with pytest.raises(ValueError, match="'gmpo' is already registered to gmpo_variants"):
        register("gmpo", label="x")(other)
    gmpo = VARIANTS["gmpo"]
    with pytest.raises(ValueError, match=r"already registered .* with other settings"):
        register("gmpo", label="GMPO again")(gmpo.loss)
    settings = {"label": gmpo.label, "bounds": gmpo.bounds, "reference": gmpo.reference}
    assert register("gmpo", **settings)(gmpo.loss) is gmpo.loss  # the same: a no-op
    assert VARIANTS["gmpo"] == gmpo


def test_a_parameterised_variant_is_one_registration_per_setting(monkeypatch) -> None:
    """The power means are one function registered at each p (``register_power``): the loss,
    its bounds and its reference carry the same p and epsilon. Registering it again at the same
    settings (its module imported again) replaces it; another p under a taken name raises and
    names the registered one's settings."""
    from gmpo_variants import power

    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    for name, p in (("hmpo", -1.0), ("pmpo_0.5", 0.5), ("pmpo_1", 1.0)):
        variant = VARIANTS[name]
        assert variant.loss.keywords == {"p": p, "epsilon": 0.4}  # type: ignore[attr-defined]
        assert variant.reference.keywords == {"p": p, "epsilon": 0.4}  # type: ignore[union-attr]
        assert variant.bounds == (0.4, 0.4)
    half = VARIANTS["pmpo_0.5"]
    again = power.register_power("pmpo_0.5", half.label, p=0.5)
    assert again is not half.loss and VARIANTS["pmpo_0.5"].loss is again
    with pytest.raises(ValueError) as err:
        power.register_power("pmpo_0.5", half.label, p=0.25)
    assert str(err.value) == (
        "variant 'pmpo_0.5' is already registered to "
        "gmpo_variants.power.power_mean_variant(epsilon=0.4, p=0.5)"
    )
    assert resolve("gmpo_variants.power:hmpo") is VARIANTS["hmpo"]


def test_a_new_module_in_the_package_registers_on_import(tmp_path, monkeypatch) -> None:
    """A new variant is one file: every module of the package is imported by the registry."""
    package = tmp_path / "more_variants"
    package.mkdir()
    (package / "mine.py").write_text(
        textwrap.dedent(
            """
            from gmpo_variants import register

            @register("demo_mine", label="demo")
            def mine(logp, old_logp, advantages, mask):
                return (logp - old_logp).sum() * 0
            """
        )
    )
    monkeypatch.setattr(gmpo_variants, "__path__", [*gmpo_variants.__path__, str(package)])
    monkeypatch.setattr(registry_module, "_LOADED", False)
    monkeypatch.setattr(registry_module, "_REGISTRY", dict(registry_module._REGISTRY))
    monkeypatch.delitem(sys.modules, "gmpo_variants.mine", raising=False)
    assert "demo_mine" in VARIANTS and resolve("demo_mine").label == "demo"


# --- resolve: module:function, and its refusals ------------------------------------------------


def test_module_function_resolves_to_the_registered_variant_or_a_new_one() -> None:
    assert resolve("gmpo_variants.gmpo:gmpo_variant") is VARIANTS["gmpo"]
    fn = resolve("gmpo_variants.ablations:no_clip_loss")
    assert fn.name == fn.label == "gmpo_variants.ablations:no_clip_loss" and fn.bounds is None


_CASES = {
    "nope": "unknown variant 'nope': choose from grpo, grpo_wide, gmpo",
    "vmod_raises:fn": "variant 'vmod_raises:fn': importing 'vmod_raises' failed: RuntimeError: boom",
    "vmod_syntax:fn": "variant 'vmod_syntax:fn': importing 'vmod_syntax' failed: SyntaxError: ",
    "vmod_ok:missing": "variant 'vmod_ok:missing': module 'vmod_ok' has no 'missing'",
    "vmod_ok:x": "variant 'vmod_ok:x' is int, not a function",
    "no_such_module_xyz:fn": "no module 'no_such_module_xyz' found",
}
_MODULES = {"vmod_raises": "raise RuntimeError('boom')\n", "vmod_syntax": "def fn(:\n",
            "vmod_ok": "x = 1\n"}  # fmt: skip
_RESOLVE = f"""
import json
from gmpo_variants import resolve
out = {{}}
for spec in {list(_CASES)!r}:
    try:
        resolve(spec)
    except ValueError as err:
        out[spec] = str(err)
print(json.dumps(out))
"""


def test_resolve_refuses_in_one_line(tmp_path) -> None:
    """A user's module that raises at import or does not parse, a missing or non-callable
    attribute, an unknown name: each a ValueError of one line (CHANGELOG, Unreleased)."""
    proc = run_with_modules(["-c", _RESOLVE], tmp_path, _MODULES)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got) == set(_CASES)
    for spec, message in _CASES.items():
        assert message in got[spec] and "\n" not in got[spec], (spec, got[spec])


@pytest.mark.parametrize("spec", [5, None, 1.5, ["gmpo"]])
def test_a_name_that_is_not_a_string_is_one_line(spec: object) -> None:
    with pytest.raises(ValueError, match="a variant is a name or module:function, got"):
        resolve(spec)


def test_a_variant_that_needs_a_missing_extra_is_one_line(monkeypatch) -> None:
    needs = Variant("needs_x", "x", lambda *a: a[0].sum(), requires="no_such_package_xyz")
    monkeypatch.setitem(registry_module._REGISTRY, "needs_x", needs)
    with pytest.raises(ValueError) as err:
        resolve("needs_x")
    assert str(err.value) == (
        "variant 'needs_x' calls no_such_package_xyz's own code, and no_such_package_xyz is not "
        "installed: pip install -e '.[no_such_package_xyz]' in the gmpo clone"
    )


# --- what a variant returns ---------------------------------------------------------------------


def test_a_variant_that_returns_the_loss_alone_has_an_unknown_clipped_fraction() -> None:
    """Every recipe of docs/recipes.md returns the loss alone (CHANGELOG, Unreleased)."""
    variant = resolve("gmpo_variants.ablations:sequence_clip_loss")
    logp, old, adv, mask = _inputs()
    loss, clipped = variant(logp, old, adv, mask)
    assert loss.dim() == 0 and math.isnan(float(clipped)) and not clipped.requires_grad


def _empty_batch_case(name: str) -> object:
    """A registered variant as a test parameter, marked with the extra it needs."""
    requires = VARIANTS[name].requires
    return pytest.param(name, marks=[getattr(pytest.mark, requires)] if requires else [])


def _mean_of_rows(logp, old_logp, advantages, mask):  # type: ignore[no-untyped-def]
    """A user's variant: the mean over rows of -A·(token mean of r), NaN over no rows."""
    r = torch.where(mask != 0, logp - old_logp, 0)
    return (-advantages * r.sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@pytest.mark.parametrize("name", [*map(_empty_batch_case, VARIANTS), "user's .mean()"])
def test_an_empty_batch_gives_a_zero_loss(name: str) -> None:
    """B = 0: every variant's loss is 0, finite, with an empty gradient (docs/semantics.md S4),
    as gmpo_core's. Regression: gspo, sapo, grpo, grpo_wide, gmpo_noclip, gmpo_seqclip, hmpo and
    the pmpo_* returned NaN (a mean over no rows) where dapo, cispo and gmpo gave 0."""
    if name == "user's .mean()":
        variant = Variant(name, name, _mean_of_rows)
    else:
        variant = VARIANTS[name]
        if variant.requires is not None:
            pytest.importorskip(variant.requires)
    for dtype in (torch.float32, torch.float64):
        logp = torch.zeros(0, 5, dtype=dtype, requires_grad=True)
        empty = torch.zeros(0, 5, dtype=dtype)
        loss, clipped = variant(logp, empty, torch.zeros(0, dtype=dtype), torch.ones(0, 5))
        assert loss.dim() == 0 and loss.dtype == dtype and loss.requires_grad
        assert float(loss.detach()) == 0.0
        assert clipped.dim() == 0 and not clipped.requires_grad
        loss.backward()
        assert logp.grad is not None and logp.grad.shape == (0, 5)


@pytest.mark.parametrize(
    ("result", "got"),
    [
        (torch.zeros(3), "a tensor of shape (3,)"),
        ((torch.zeros(()),), "a tuple of 1"),
        ([torch.zeros(())], "list"),
    ],
)
def test_a_variant_with_another_return_names_the_signature(result, got) -> None:
    variant = Variant("bad", "bad", lambda *a: result)
    with pytest.raises(TypeError) as err:
        variant(*_inputs())
    assert str(err.value) == (
        f"variant 'bad' must be {registry_module.SIGNATURE}; it returned {got}"
    )


# --- docs/recipes.md shows the package's functions ---------------------------------------------


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


def _package_functions() -> dict[str, object]:
    out: dict[str, object] = {}
    for module in ("recipes", "gmpo", "ablations", "grpo", "power"):
        mod = sys.modules.get(f"gmpo_variants.{module}") or __import__(
            f"gmpo_variants.{module}", fromlist=["_"]
        )
        out.update({k: v for k, v in vars(mod).items() if inspect.isfunction(v)})
    return out


def test_the_recipes_page_shows_the_package() -> None:
    """docs/recipes.md's recipes are gmpo_variants' functions, letter for letter: the page a user
    reads is the code the study imports (tests/variants/test_recipes.py runs the page)."""
    page, package = _page_functions(), _package_functions()
    assert {"masked_log_ratio", "policy_loss", "gmpo_from_blocks", "sequence_clip_loss",
            "grpo_arithmetic_loss"} <= set(page)  # fmt: skip
    for name, source in page.items():
        assert name in package, f"docs/recipes.md's {name} is in no gmpo_variants module"
        assert source == inspect.getsource(package[name]).strip(), (  # type: ignore[arg-type]
            f"docs/recipes.md's {name} differs from gmpo_variants' {name}"
        )


def test_the_power_mean_at_1_is_grpo_wide_and_at_0_gmpo() -> None:
    """p = 1 of the log-space clipped ratios is the arithmetic mean of PPO's clipped ratios in
    ratio space at (e^-0.4, e^0.4); p = 0 is GMPO's geometric mean."""
    from gmpo_variants.gmpo import gmpo_from_blocks
    from gmpo_variants.power import power_mean_loss

    args = _inputs()
    assert float(VARIANTS["pmpo_1"](*args)[0]) == pytest.approx(
        float(VARIANTS["grpo_wide"](*args)[0]), rel=1e-12
    )
    assert float(power_mean_loss(*args, p=0.0)) == pytest.approx(
        float(gmpo_from_blocks(*args)), rel=1e-12
    )
    hmpo, half, gmpo = (float(VARIANTS[n](*args)[0]) for n in ("hmpo", "pmpo_0.5", "gmpo"))
    assert len({hmpo, half, gmpo}) == 3
