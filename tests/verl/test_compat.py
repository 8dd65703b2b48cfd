"""What differs between the verl releases the adapter supports (verl >= 0.8), pinned down where
gmpo_verl depends on it. ``make compat`` runs this file at verl 0.8; the main run at verl 0.9.1.

- how the losses get registered: verl >= 0.9 loads the ``verl.plugins`` entry points on
  ``import verl``; verl 0.8 does not (test_registration.py checks the entry point where it
  exists), but imports ``VERL_USE_EXTERNAL_MODULES`` on ``import verl``, and
  ``gmpo_verl.register()`` registers in the calling process;
- one policy-loss call through verl's own ``ppo_loss`` (the engine's loss function), which fills
  ``config.global_batch_info`` on both releases, with verl's own actor config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

import torch
from tensordict import TensorDict

import gmpo_verl
from gmpo_core import gmpo_loss

pytestmark = pytest.mark.verl

_LOOKUP = (
    "import verl; from verl.trainer.ppo.core_algos import get_policy_loss_fn; "
    "print(get_policy_loss_fn('gmpo').__module__, get_policy_loss_fn('gmpo_dual_clip').__name__)"
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env=os.environ | env, cwd=Path(__file__).parent,
    )  # fmt: skip


def test_external_module_registers_in_a_fresh_process() -> None:
    """The way that works on verl 0.8 and 0.9 alike, in every process that inherits the
    environment (Ray workers included): VERL_USE_EXTERNAL_MODULES=gmpo_verl.plugin."""
    run = _python(_LOOKUP, VERL_USE_EXTERNAL_MODULES="gmpo_verl.plugin")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["gmpo_verl.loss", "compute_policy_loss_gmpo_dual_clip"]


def test_register_in_a_fresh_process() -> None:
    """``import gmpo_verl; gmpo_verl.register()``: the calling process only."""
    code = "import gmpo_verl; gmpo_verl.register(); " + _LOOKUP
    run = _python(code, VERL_USE_EXTERNAL_MODULES="")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[0] == "gmpo_verl.loss"


def _engine_batch(seed: int = 0) -> tuple[TensorDict, torch.Tensor, dict[str, torch.Tensor]]:
    """A padded batch as verl's engine hands it to ppo_loss: prompts and responses with their
    attention mask, the model's log-probs flattened over every sequence's valid tokens (the
    log-prob of response token t sits at the position before it), and the global batch's
    metadata as non-tensor data."""
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    b, p, r = 3, 2, 4
    response_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    attention = torch.cat([torch.ones(b, p, dtype=torch.long), response_mask], dim=1)
    logp = torch.randn(b, r, generator=g) * 0.3 - 1.0
    old = logp + torch.randn(b, r, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 0.25])[:, None].expand(b, r).contiguous()
    flat = []
    for i in range(b):
        n = int(response_mask[i].sum())
        row = torch.zeros(p + n)
        row[p - 1 : p - 1 + n] = logp[i, :n]  # shifted by one: position t predicts token t + 1
        flat.append(row)
    data = TensorDict(
        {
            "prompts": torch.zeros(b, p, dtype=torch.long),
            "responses": torch.zeros(b, r, dtype=torch.long),
            "attention_mask": attention,
            "response_mask": response_mask,
            "old_log_probs": old,
            "advantages": adv,
        },
        batch_size=[b],
    )
    n_tokens = int(response_mask.sum())
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=n_tokens, global_batch_size=b)
    tensors = {"logp": logp, "old": old, "adv": adv[:, 0], "mask": response_mask}
    return data, torch.cat(flat), tensors


def test_one_call_through_verls_own_ppo_loss(actor_config) -> None:  # type: ignore[no-untyped-def]
    """verl's engine loss function (verl.workers.utils.losses.ppo_loss) with verl's own actor
    config: it fills config.global_batch_info itself and calls loss_mode=gmpo by name; the
    loss and the gradient are gmpo_core's (seq-mean-token-mean: the paper's mean over rows)."""
    from verl.workers.utils.losses import ppo_loss

    gmpo_verl.register()
    config = actor_config(entropy_coeff=0.0, use_kl_loss=False)  # global_batch_info: empty
    assert dict(config.global_batch_info) == {}
    data, flat, t = _engine_batch()
    flat = flat.requires_grad_()
    loss, _metrics = ppo_loss(config, {"log_probs": flat}, data)
    assert config.global_batch_info["global_batch_size"] == 3
    assert config.global_batch_info["batch_num_tokens"] == int(t["mask"].sum())

    logp = t["logp"].clone().requires_grad_()
    want = gmpo_loss(logp, t["old"], t["adv"], t["mask"], epsilon=0.4).loss
    torch.testing.assert_close(loss, want)
    (g_flat,) = torch.autograd.grad(loss, flat)
    (g_want,) = torch.autograd.grad(want, logp)
    torch.testing.assert_close(g_flat.sum(), g_want.sum())
    torch.testing.assert_close(g_flat.abs().sum(), g_want.abs().sum())
