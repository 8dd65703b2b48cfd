"""``dapo``, ``gspo``, ``cispo`` and ``sapo`` (gmpo_variants.hosts) are verl's own losses, and
against TRL 1.16's own loss step of the same ``loss_type`` on the same batch they are:

- ``dapo`` (verl ``vanilla``, token-mean, clip (0.2, 0.28)) = TRL ``loss_type="dapo"`` at
  ε (0.2, 0.28) with ``delta=3``: verl's dual clip (``clip_ratio_c`` = 3, for A < 0) is TRL's
  two-sided clip ``delta``. TRL's default (``delta=None``) differs by exactly the dual-clipped
  tokens: verl = TRL - Σ_{A<0, ρ>3} |A|(ρ - 3) / N;
- ``gspo`` (verl ``gspo``, seq-mean-token-mean, (3e-4, 4e-4)) = TRL's documented GSPO
  (``loss_type="grpo"``, ``importance_sampling_level="sequence"``, same ε), loss and gradient:
  verl's token-level s_i·π/sg(π) has the sequence ratio's gradient once averaged over the
  sequence's tokens. At verl's actor default ``loss_agg_mode="token-mean"``, verl 0.9's gspo
  is not TRL's (it weights each sequence by its length); verl 0.8's always aggregates
  seq-mean-token-mean;
- ``cispo`` (verl ``cispo`` at verl's defaults: weight clip [0.8, 1.2], token-mean) = TRL
  ``loss_type="cispo"`` with ``epsilon_high=1.2`` (TRL's ε_max is the ratio's cap itself, and
  TRL has no lower clip) where no ratio is below 0.8; elsewhere verl = TRL +
  Σ_{ρ<0.8} -(0.8 - ρ)·A·log π / N (the difference's gradient included);
- ``sapo`` (verl ``sapo`` at verl's defaults: τ+ 1.0, τ- 1.05) = TRL ``loss_type="sapo"`` at
  TRL's defaults (the same temperatures, the same seq-mean-token-mean).

N is the batch's valid token count (TRL's ``num_items_in_batch`` for one accumulation window
that holds the whole batch). TRL's side runs ``GRPOTrainer._compute_loss`` (tests/trl/_support),
ours gets the trainer's own log-probs. The registry and refusal tests need neither host.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from gmpo_variants import VARIANTS, resolve
from gmpo_variants.grpo import ratio_bounds
from gmpo_variants.hosts import HOSTS

NAMES = ("dapo", "gspo", "cispo", "sapo")
ROOT = Path(__file__).resolve().parents[2]
RTOL, ATOL = 1e-5, 1e-7  # float32 losses: the same inputs, only summation order differs
GRAD_RTOL = 1e-4  # as tests/trl/test_variants_grpo.py: per-parameter sums of many terms


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """The tiny model's matrices are kilobytes: one thread (tests/conftest.py's ``one_thread``)."""


# ---- the registry, with or without verl ----


@pytest.mark.parametrize("name", NAMES)
def test_registered(name: str) -> None:
    variant = VARIANTS[name]
    assert variant.requires == "verl" and variant.reference is None
    assert variant.bounds == (ratio_bounds(0.2, 0.28) if name == "dapo" else None)
    assert variant.label.startswith(name.upper())


@pytest.mark.parametrize("name", NAMES)
def test_refused_without_verl(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = importlib.util.find_spec

    def find_spec(module: str, *args: Any, **kwargs: Any) -> Any:
        return None if module == "verl" else real(module, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(ValueError) as err:
        resolve(name)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"variant {name!r} calls verl's own code, and verl is not installed: "
        "pip install -e '.[verl]' in the gmpo clone"
    )


def test_imports_without_verl() -> None:
    """verl is imported on a variant's first call only: with ``import verl`` failing, the
    package imports, lists the four and refuses each in one line."""
    code = (
        "import sys; sys.modules['verl'] = None\n"
        "import gmpo_variants as v\n"
        "names = [n for n in v.VARIANTS if v.VARIANTS[n].requires == 'verl']\n"
        "print(*names)\n"
        "for n in names:\n"
        "    try: v.resolve(n)\n"
        "    except ValueError as e: print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].split() == list(NAMES)
    assert [line.split("'")[1] for line in lines[1:]] == list(NAMES)
    assert all(line.endswith("pip install -e '.[verl]' in the gmpo clone") for line in lines[1:])


# ---- with verl: verl's own functions and defaults ----


def _verl() -> ModuleType:
    pytest.importorskip("verl")
    from verl.trainer.ppo import core_algos

    return core_algos


@pytest.mark.verl
def test_settings_are_verls() -> None:
    """Each variant calls the function verl registered under its loss mode, with the stated
    settings; ``cispo`` and ``sapo`` are the installed verl's ``ActorConfig`` defaults."""
    core_algos = _verl()
    from verl.workers.config import ActorConfig

    from gmpo_variants.hosts import host_loss

    defaults = {f.name: f.default for f in dataclasses.fields(ActorConfig)}
    assert (defaults["clip_ratio_low"], defaults["clip_ratio_high"]) == HOSTS["cispo"].clip
    assert (defaults["tau_pos"], defaults["tau_neg"]) == HOSTS["sapo"].taus
    assert defaults["loss_agg_mode"] == HOSTS["cispo"].loss_agg_mode
    assert defaults["clip_ratio_c"] == 3.0  # dapo's dual clip
    for name in NAMES:
        host = HOSTS[name]
        fn, config = host_loss(name)
        assert fn is core_algos.get_policy_loss_fn(host.loss_mode)
        assert config.policy_loss.loss_mode == host.loss_mode
        assert config.loss_agg_mode == host.loss_agg_mode
        assert (config.clip_ratio_low, config.clip_ratio_high) == host.clip
        assert (config.tau_pos, config.tau_neg) == host.taus


@pytest.mark.verl
@pytest.mark.parametrize("name", NAMES)
def test_resolves_and_runs(name: str) -> None:
    """Resolved, each returns a 0-d loss and clipped fraction with a gradient; an empty batch
    gives 0 (verl's actor would divide 0 by 0)."""
    _verl()
    variant = resolve(name)
    assert variant is VARIANTS[name]
    g = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=g)).requires_grad_()
    old = logp.detach() + 0.1 * torch.randn(3, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    loss, clipped = variant(logp, old, torch.tensor([1.0, -0.5, 0.3]), mask)
    assert loss.dim() == 0 and clipped.dim() == 0 and clipped.dtype == torch.float32
    loss.backward()
    assert logp.grad is not None and bool(logp.grad.abs().sum() > 0)
    empty, _ = variant(logp, old, torch.tensor([1.0, -0.5, 0.3]), torch.zeros(3, 4))
    assert float(empty.detach()) == 0.0


# ---- with verl and TRL: the host-equality tests ----


@pytest.fixture
def trl() -> ModuleType:
    _verl()
    pytest.importorskip("trl")
    from tests.trl import _support

    return _support


def _trainer(trl: ModuleType, tmp: Path, **config: Any) -> Any:
    return trl.make_trainer(tmp, trl.GRPOTrainer, trl.GRPOConfig, beta=0.0, **config)


def _inputs(trl: ModuleType, trainer: Any, **spec: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = trl.make_inputs(trainer, rows=16, length=8, **spec)
    # TRL's token-mean losses divide by the generation batch's token count, per accumulation
    # window: one window holding this batch divides by its own count, as verl's token-mean
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()
    return inputs


def _ours(
    trainer: Any,
    inputs: dict[str, Any],
    name: str,
    minus: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The variant on the trainer's own log-probs (train mode, as TRL's loss step): loss,
    clipped fraction, the flat gradient and the log-probs (``variant_step``)."""
    from tests.trl._support import variant_step

    return variant_step(trainer, inputs, VARIANTS[name], minus)


def _assert_same(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(ours[2], theirs[1], rtol=GRAD_RTOL, atol=ATOL)


def _parts(inputs: dict[str, Any], logps: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(ratio ρ, advantages as (B, 1), the bool mask, N) of a batch."""
    mask = inputs["completion_mask"].bool()
    rho = torch.exp(logps - inputs["old_per_token_logps"])
    return rho, inputs["advantages"][:, None], mask, mask.sum()


@pytest.mark.verl
@pytest.mark.trl
def test_dapo_is_trl_dapo_with_the_dual_clip(trl: ModuleType, tmp_path: Path) -> None:
    eps = {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}
    trainer = _trainer(trl, tmp_path / "delta", delta=3.0, **eps)
    inputs = _inputs(trl, trainer, seed=2, drift=0.8, zero_advantage=True, empty_row=True)
    trl_delta = trl.loss_and_grad(trainer, inputs)
    ours = _ours(trainer, inputs, "dapo")
    _assert_same(ours, trl_delta)

    rho, a, mask, n = _parts(inputs, ours[3])
    dual = mask & (a < 0) & (rho > 3)
    assert int(dual.sum()) > 0  # the dual clip acts on this batch
    clipped = mask & (((a > 0) & (rho > 1.28)) | ((a < 0) & (rho < 0.8)) | dual)
    torch.testing.assert_close(ours[1], clipped.sum() / n, rtol=RTOL, atol=0.0)

    # TRL's default, no delta: it keeps those tokens' -A·ρ, verl caps them at -A·3
    plain = _trainer(trl, tmp_path / "plain", **eps)
    trl_plain = trl.loss_and_grad(plain, inputs)
    assert not torch.isclose(trl_plain[0], trl_delta[0], rtol=1e-3)

    def difference(logps: torch.Tensor) -> torch.Tensor:  # verl - TRL
        r = torch.exp(logps - inputs["old_per_token_logps"])
        return -torch.where(dual, -a * (r - 3), 0).sum() / n

    _assert_same(_ours(plain, inputs, "dapo", minus=difference), trl_plain)


@pytest.mark.verl
@pytest.mark.trl
def test_gspo_is_trls_documented_gspo(trl: ModuleType, tmp_path: Path) -> None:
    trainer = _trainer(
        trl, tmp_path, loss_type="grpo", importance_sampling_level="sequence",
        epsilon=3e-4, epsilon_high=4e-4,
    )  # fmt: skip
    # the sequence ratios straddle GSPO's narrow clip; an empty row counts in the mean over B
    inputs = _inputs(trl, trainer, seed=3, drift=1e-3, zero_advantage=True, empty_row=True)
    theirs = trl.loss_and_grad(trainer, inputs)
    ours = _ours(trainer, inputs, "gspo")
    _assert_same(ours, theirs)

    rho, a, mask, n = _parts(inputs, ours[3])
    log_s = (torch.log(rho) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    s = torch.exp(log_s)  # (B, 1), the sequence ratio
    rows = ((a > 0) & (s > 1 + 4e-4)) | ((a < 0) & (s < 1 - 3e-4))  # (B, 1)
    clipped = (mask & rows).sum() / n
    assert 0 < float(clipped) < 1  # some sequences are clipped, some are not
    torch.testing.assert_close(ours[1], clipped, rtol=RTOL, atol=0.0)

    # at verl's actor default, loss_agg_mode="token-mean", verl 0.9's gspo weights each sequence
    # by its length (not GSPO's objective); verl 0.8's ignores loss_agg_mode (seq-mean-token-mean)
    from gmpo_variants.hosts import host_loss

    fn, config = host_loss("gspo")  # global_batch_info: this batch, from the call above
    token_mean, _ = fn(
        old_log_prob=inputs["old_per_token_logps"], log_prob=ours[3],
        advantages=a * mask, response_mask=mask, loss_agg_mode="token-mean", config=config,
    )  # fmt: skip
    if tuple(int(x) for x in version("verl").split(".")[:2]) < (0, 9):
        torch.testing.assert_close(token_mean.detach(), theirs[0], rtol=RTOL, atol=ATOL)
    else:
        assert not torch.isclose(token_mean, theirs[0], rtol=1e-3)


@pytest.mark.verl
@pytest.mark.trl
def test_gspo_caps_the_sequence_log_ratio_at_10(trl: ModuleType, tmp_path: Path) -> None:
    """verl's gspo clamps the sequence's log-ratio at 10, TRL's does not: where A < 0 and the
    ratio s passes e^10 (PPO's clip keeps A·s there), verl = TRL + |A|·(e^10 - s) / B per such
    sequence, and verl's gradient there is 0."""
    trainer = _trainer(
        trl, tmp_path, loss_type="grpo", importance_sampling_level="sequence",
        epsilon=3e-4, epsilon_high=4e-4,
    )  # fmt: skip
    inputs = _inputs(trl, trainer, seed=3, drift=1e-3)
    logps = trl.model_logps(trainer, inputs)
    inputs["advantages"][2] = -0.5
    inputs["old_per_token_logps"][2] = logps[2] - 11.0  # log s = 11 > 10
    theirs = trl.loss_and_grad(trainer, inputs)
    rows = inputs["advantages"].size(0)

    def difference(logp: torch.Tensor) -> torch.Tensor:  # verl - TRL
        mask = inputs["completion_mask"][2].bool()
        s = torch.exp((logp[2] - inputs["old_per_token_logps"][2])[mask].mean())
        return 0.5 * (torch.exp(torch.tensor(10.0)) - s) / rows

    ours = _ours(trainer, inputs, "gspo", minus=difference)
    _assert_same(ours, theirs)
    assert float(difference(logps)) < -100  # the cap changes the loss


@pytest.mark.verl
@pytest.mark.trl
def test_cispo_is_trl_cispo_capped_at_verls_clip(trl: ModuleType, tmp_path: Path) -> None:
    trainer = _trainer(trl, tmp_path / "cap", loss_type="cispo", epsilon_high=1.2)
    inputs = _inputs(trl, trainer, seed=4, drift=0.5, zero_advantage=True)
    logps = trl.model_logps(trainer, inputs)

    # every ratio >= 1: verl's lower clip (0.8) never acts, the cap 1.2 does on both sides
    upper = dict(inputs, old_per_token_logps=logps - (inputs["old_per_token_logps"] - logps).abs())
    ours = _ours(trainer, upper, "cispo")
    _assert_same(ours, trl.loss_and_grad(trainer, upper))
    rho, _, mask, n = _parts(upper, ours[3])
    assert int((mask & (rho > 1.2)).sum()) > 0
    torch.testing.assert_close(ours[1], (mask & (rho > 1.2)).sum() / n, rtol=RTOL, atol=0.0)

    # ratios on both sides: verl also raises the weight of ρ < 0.8 to 0.8; TRL keeps ρ
    theirs = trl.loss_and_grad(trainer, inputs)
    rho, a, mask, n = _parts(inputs, logps)
    low = mask & (rho < 0.8)
    assert int(low.sum()) > 0

    def difference(logp: torch.Tensor) -> torch.Tensor:  # verl - TRL
        return torch.where(low, -(0.8 - rho) * a * logp, 0).sum() / n

    ours = _ours(trainer, inputs, "cispo", minus=difference)
    _assert_same(ours, theirs)
    clipped = mask & ((rho < 0.8) | (rho > 1.2))  # verl counts both sides, whatever A's sign
    torch.testing.assert_close(ours[1], clipped.sum() / n, rtol=RTOL, atol=0.0)
    assert not torch.isclose(difference(logps), torch.zeros(()), atol=1e-4)
    # TRL's epsilon_high falls back to epsilon (0.2): its cispo then caps every weight at 0.2
    assert _trainer(trl, tmp_path / "default", loss_type="cispo").epsilon_high == 0.2


@pytest.mark.verl
@pytest.mark.trl
def test_sapo_is_trl_sapo(trl: ModuleType, tmp_path: Path) -> None:
    trainer = _trainer(trl, tmp_path / "sapo", loss_type="sapo")
    args = trainer.args
    assert (args.sapo_temperature_pos, args.sapo_temperature_neg) == HOSTS["sapo"].taus
    inputs = _inputs(trl, trainer, seed=5, drift=0.5, zero_advantage=True, empty_row=True)
    theirs = trl.loss_and_grad(trainer, inputs)
    ours = _ours(trainer, inputs, "sapo")
    _assert_same(ours, theirs)
    assert float(ours[1]) == 0.0  # no clip

    # the batch tells the temperatures apart
    swapped = _trainer(
        trl, tmp_path / "swapped", loss_type="sapo",
        sapo_temperature_pos=1.05, sapo_temperature_neg=1.0,
    )  # fmt: skip
    assert not torch.isclose(trl.loss_and_grad(swapped, inputs)[0], theirs[0], rtol=1e-4)
