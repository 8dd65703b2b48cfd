"""What differs between the TRL releases the adapter supports (trl >= 1.10), pinned down where
gmpo_trl depends on it. ``make compat`` runs this file at trl 1.10; the main run at trl 1.16.
Other differences are tested where the feature is: the LM head (test_lm_head_default.py), the
field table, the fingerprint and the version warning (test_config.py), the MoE coefficient and
``use_liger_kernel`` (test_loss_step.py)."""

from __future__ import annotations

import inspect

import pytest

trl = pytest.importorskip("trl")

from trl import GRPOTrainer  # noqa: E402

from gmpo_trl.compat import forward_keys  # noqa: E402
from gmpo_trl.trainer import FORWARD_KEYS  # noqa: E402
from tests.trl._support import loss_and_grad, make_inputs, make_trainer  # noqa: E402

pytestmark = pytest.mark.trl

_MULTIMODAL = {"pixel_values", "image_grid_thw", "num_images", "token_type_ids"}


class _Trl114Shape(GRPOTrainer):  # type: ignore[misc]
    """The scoring helpers' signatures as trl 1.14.2 has them (bodies irrelevant)."""

    def _get_per_token_logps_and_entropies(  # type: ignore[override]
        self, model, *args, batch_size=None, compute_aux_loss=False, **kwargs
    ):
        raise AssertionError("never called")

    def _full_logits_logps(  # type: ignore[no-untyped-def]
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
        compute_entropy=False, compute_aux_loss=False, pixel_values=None, image_grid_thw=None,
        num_images=None, token_type_ids=None, mm_token_type_ids=None,
    ):  # fmt: skip
        raise AssertionError("never called")

    def _chunked_logps(  # type: ignore[no-untyped-def]
        self, model, input_ids, attention_mask, logits_to_keep, compute_entropy=False,
        pixel_values=None, image_grid_thw=None, num_images=None, token_type_ids=None,
    ):  # fmt: skip
        raise AssertionError("never called")


def test_forward_keys_of_a_helper_taking_args_and_kwargs():
    """trl 1.14's scoring helper is (self, model, *args, batch_size, compute_aux_loss, **kwargs):
    the forward's keywords are the named ones every helper it forwards to takes, never 'args' or
    'kwargs' (GMPOTrainer passed args=None, kwargs=None: "_full_logits_logps() got an
    unexpected keyword argument 'args'")."""
    keys = forward_keys(_Trl114Shape)
    assert keys == ("pixel_values", "image_grid_thw", "num_images", "token_type_ids")


def test_forward_keys_of_the_installed_trl():
    """Every key is a named parameter of the installed helper or of the helpers it forwards to,
    and the multimodal fields are among them."""
    assert _MULTIMODAL <= set(FORWARD_KEYS)
    assert not {"args", "kwargs", "self", "model"} & set(FORWARD_KEYS)
    params = inspect.signature(GRPOTrainer._get_per_token_logps_and_entropies).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert takes_any or set(FORWARD_KEYS) <= set(params)


def test_a_loss_step_runs_on_the_installed_trl(tmp_path):
    """The loss step end to end (the forward with every key of FORWARD_KEYS passed by name)."""
    trainer = make_trainer(tmp_path)
    loss, grad = loss_and_grad(trainer, make_inputs(trainer, drift=0.5))
    assert loss.isfinite() and grad.abs().sum() > 0
