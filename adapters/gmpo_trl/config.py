"""``GMPOConfig``: ``trl.GRPOConfig`` with GMPO's log-space clip range and its rejections."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from gmpo_core.options import IMPLS, check_beta, check_hyperparameters, check_impl
from gmpo_trl.fields import GMPO_FIELDS, OTHER_LOSS_FIELDS

RECIPES = "docs/recipes.md"

# gmpo_loss's epsilon, epsilon_high and dual_clip, as GMPOConfig calls them
_NAMES = ("epsilon", "epsilon_high", "delta")


def _option(name: str) -> Any:
    """The dataclass field of one of GMPO's own fields (``gmpo_trl.fields.GMPO_FIELDS``)."""
    option = GMPO_FIELDS[name]
    return field(default=option.default, metadata={"help": option.help})


@dataclass
class GMPOConfig(GRPOConfig):
    r"""Configuration for :class:`gmpo_trl.GMPOTrainer` (GMPO, arXiv 2507.20673).

    Every ``trl.GRPOConfig`` argument is accepted; ``gmpo_trl.fields.FIELDS`` says what each does
    under GMPO. The differences:

    - ``epsilon`` / ``epsilon_high`` are *log-space* bounds: the token ratio is clipped to
      ``(exp(-epsilon), exp(epsilon_high))``, one-sidedly by the sign of the advantage. Default
      0.4 (the paper's ``e^±0.4``). Same meaning as ``trl.experimental.gmpo.GMPOConfig``.
    - ``delta`` is GMPO's dual clip: the ratio of negative-advantage tokens is capped at
      ``delta`` (> 1), as GRPO's ``delta`` does.
    - ``loss_type`` is ``"gmpo"`` and ``importance_sampling_level`` is ``"token"``; any other
      value is refused (GMPO's aggregation is its geometric mean). The paper's ablations are
      recipes in ``docs/recipes.md``.
    - ``use_bias_correction_kl`` defaults to False (GRPOConfig: True); True is refused, and so are
      non-default ``sapo_*`` / ``vespo_*`` values.
    - ``beta`` must be a finite number >= 0 (gmpo_core's rule; GRPOTrainer builds the reference
      model whenever it is not 0).
    - ``gmpo_impl``: which ``gmpo_core`` path computes the loss: ``"plain"`` (default) or
      ``"compiled"`` (opt-in; TRL's ``torch_compile`` does not turn it on).
    - ``gmpo_lm_head`` (default True): tokens are scored by :func:`gmpo_core.token_logprobs`
      instead of TRL's chunked LM head, for every scoring pass; where it does not apply (a logit
      soft-cap, extra kernel outputs) TRL's head is used and a warning says so once.
    """

    epsilon: float = _option("epsilon")
    epsilon_high: float | None = _option("epsilon_high")
    delta: float | None = _option("delta")
    loss_type: str = _option("loss_type")
    use_bias_correction_kl: bool = _option("use_bias_correction_kl")
    gmpo_impl: str = _option("gmpo_impl")
    gmpo_lm_head: bool = _option("gmpo_lm_head")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_config(self)


def check_config(args: GRPOConfig) -> None:
    """Refuse every value that would change nothing, or is meaningless, under GMPO.

    Raises:
        ValueError: naming the field, the value, and what to do instead.
    """
    if args.loss_type != "gmpo":
        raise ValueError(
            f"loss_type={args.loss_type!r} has no meaning for GMPO: its loss is the geometric mean "
            "of the clipped token ratios of each sequence, averaged over sequences, whatever "
            f"loss_type says. Leave loss_type='gmpo'; the paper's ablations are in {RECIPES}."
        )
    if args.importance_sampling_level != "token":
        raise ValueError(
            f"importance_sampling_level={args.importance_sampling_level!r} has no meaning for "
            "GMPO: it clips each token's ratio, then takes the geometric mean over the sequence. "
            f"For a sequence-level clip see `sequence_clip_loss` in {RECIPES}."
        )
    if args.use_bias_correction_kl:
        raise ValueError(
            "use_bias_correction_kl=True is not supported by GMPO: its KL is the sequence-level "
            "k3 estimator of gmpo_core, which has no ratio-weighted form. Set it to False."
        )
    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    for name in OTHER_LOSS_FIELDS:  # a non-default value would be silently dropped
        if getattr(args, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(args, name)!r} only applies to another loss_type and would "
                f"change nothing under GMPO; remove it (see {RECIPES} for GMPO's variants)."
            )
    # gmpo_core's own rules, under this config's field names
    check_hyperparameters(args.epsilon, args.epsilon_high, args.delta, names=_NAMES)
    # beta's own rule (finite, >= 0); its reference log-probs come from the reference model that
    # GRPOTrainer builds whenever beta != 0
    check_beta(args.beta, has_ref_logp=True)
    check_impl(getattr(args, "gmpo_impl", IMPLS[0]), name="gmpo_impl")
