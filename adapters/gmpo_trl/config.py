"""``GMPOConfig``: ``trl.GRPOConfig`` with GMPO's log-space clip range and its rejections."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from trl import GRPOConfig

RECIPES = "docs/recipes.md"

# Fields whose non-default value only matters for another loss_type (none is silently dropped):
# a user-set value is refused.
_OTHER_LOSS_FIELDS = (
    "sapo_temperature_neg",
    "sapo_temperature_pos",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)
_IMPLS = ("plain", "compiled")


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
    - ``gmpo_impl``: which ``gmpo_core`` path computes the loss: ``"plain"`` (default) or
      ``"compiled"`` (opt-in; TRL's ``torch_compile`` does not turn it on).
    - ``gmpo_lm_head`` (default True): tokens are scored by :func:`gmpo_core.token_logprobs`
      instead of TRL's chunked LM head, for every scoring pass; where it does not apply (a logit
      soft-cap, extra kernel outputs) TRL's head is used and a warning says so once.
    """

    epsilon: float = field(
        default=0.4,
        metadata={
            "help": "Lower clip in log space: the token ratio's lower bound is exp(-epsilon). "
            "GMPO recommends 0.4."
        },
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip in log space: the token ratio's upper bound is exp(epsilon_high). "
            "None means epsilon."
        },
    )
    delta: float | None = field(
        default=None,
        metadata={
            "help": "GMPO's dual clip: caps the ratio of negative-advantage tokens at delta "
            "(> 1), as GRPO's delta does. None: off."
        },
    )
    loss_type: str = field(
        default="gmpo",
        metadata={
            "help": "Always 'gmpo': the geometric mean of the clipped token ratios per sequence, "
            "then the mean over sequences. Other values are refused; see docs/recipes.md."
        },
    )
    use_bias_correction_kl: bool = field(
        default=False,
        metadata={
            "help": "Always False under GMPO (GRPOConfig's default is True): the KL is gmpo_core's "
            "sequence-level k3 estimator, which has no ratio-weighted form. True is refused."
        },
    )
    gmpo_impl: str = field(
        default="plain",
        metadata={
            "help": "gmpo_core path: 'plain' (plain PyTorch, no compilation) or 'compiled' "
            "(torch.compile; compiles on the first step, see docs/api.md for when it pays). "
            "TRL's torch_compile does not switch it on."
        },
    )
    gmpo_lm_head: bool = field(
        default=True,
        metadata={
            "help": "Score tokens with gmpo_core.token_logprobs instead of TRL's chunked LM head: "
            "inside the trainer step it took 0.33x the time and 0.08x the peak memory of TRL's "
            "head (docs/lm_head.md). Where it does not apply (a logit soft-cap, extra kernel "
            "outputs) TRL's head is used, with one warning."
        },
    )

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
    for name in _OTHER_LOSS_FIELDS:
        if getattr(args, name) != defaults[name]:
            raise ValueError(
                f"{name}={getattr(args, name)!r} only applies to another loss_type and would "
                f"change nothing under GMPO; remove it (see {RECIPES} for GMPO's variants)."
            )
    for name in ("epsilon", "epsilon_high"):
        value = getattr(args, name)
        if value is None and name == "epsilon_high":
            continue
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite log-space bound > 0, got {value!r}")
    if args.delta is not None and not (math.isfinite(args.delta) and args.delta > 1):
        raise ValueError(
            f"delta (GMPO's dual clip) must be a finite ratio cap > 1, got {args.delta!r}"
        )
    if getattr(args, "gmpo_impl", "plain") not in _IMPLS:
        raise ValueError(f"gmpo_impl must be one of {_IMPLS}, got {args.gmpo_impl!r}")
