"""``GMPOConfig``: ``trl.GRPOConfig`` with GMPO's log-space clip range and its rejections."""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from gmpo_core.lm_head import BACKWARD_PRECISIONS
from gmpo_core.options import IMPLS, check_beta
from gmpo_kit import HostOptions
from gmpo_trl.device import cpu_defaults
from gmpo_trl.fields import GMPO_FIELDS, OTHER_LOSS_FIELDS
from gmpo_variants import Variant, resolve

RECIPES = "docs/recipes.md"

#: TRL as a host: GMPOConfig's name for gmpo_loss's dual_clip, one advantage per sequence
HOST = HostOptions(host="GMPOTrainer", dual_clip="delta", impl="gmpo_impl", mask="completion_mask")


def _option(name: str) -> Any:
    """The dataclass field of one of GMPO's own fields (``gmpo_trl.fields.GMPO_FIELDS``)."""
    option = GMPO_FIELDS[name]
    metadata: dict[str, Any] = {"help": option.help}
    if option.aliases:
        metadata["aliases"] = list(option.aliases)
    return field(default=option.default, metadata=metadata)


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
    - ``gmpo_lm_head`` (default None, auto): which LM head scores the tokens, for every
      scoring pass: None uses :func:`gmpo_core.token_logprobs` on the CPU, its fused Triton
      backend on CUDA where Triton imports, and TRL's chunked head elsewhere
      (``gmpo_trl.head_swap.head_for``; docs/lm_head.md); True uses gmpo_core's head
      everywhere, False TRL's. Where gmpo_core's head does not apply (a logit
      soft-cap, extra kernel outputs) TRL's is used and a warning says so once.
    - ``gmpo_lm_head_backward`` (default ``"half"``): that head's ``backward_precision``, for
      bf16/fp16 (or autocast) on CUDA: ``"half"`` or ``"float32"`` backward GEMMs.
    - ``loss_variant`` (default None): a loss variant (a name of ``gmpo_variants.VARIANTS`` or
      ``module:function``) in place of ``gmpo_core.gmpo_loss``; :func:`check_config` refuses
      what it would drop, and resolves it once (:func:`loss_variant`).
    - ``use_cpu`` (default None) and ``bf16`` (default None, TRL's): where torch sees no
      accelerator (CUDA/ROCm, MPS, XPU), the run trains on the CPU in float32 (``use_cpu=True``,
      ``bf16=False``; TRL's ``bf16=True`` fails there); elsewhere ``use_cpu`` is False and
      ``bf16`` TRL's default. A value you set wins (``gmpo_trl.device.cpu_defaults``, the rule
      the ``gmpo`` command uses too).
    - Checkpoints are TRL's default (``save_strategy="steps"``, every ``save_steps`` = 500 steps
      and at the end of training); ``save_strategy="no"`` writes none (the ``gmpo`` command's
      default).
    """

    epsilon: float = _option("epsilon")
    epsilon_high: float | None = _option("epsilon_high")
    delta: float | None = _option("delta")
    loss_type: str = _option("loss_type")
    use_bias_correction_kl: bool = _option("use_bias_correction_kl")
    gmpo_impl: str = _option("gmpo_impl")
    gmpo_lm_head: bool | None = _option("gmpo_lm_head")
    gmpo_lm_head_backward: str = _option("gmpo_lm_head_backward")
    loss_variant: str | None = _option("loss_variant")
    # None: not set (decided in __post_init__); typed bool so that TRL's parser keeps the bare
    # flag `--use_cpu` (a `bool | None` field would need a value)
    use_cpu: bool = field(  # type: ignore[assignment]
        default=None,
        metadata={
            "help": "Train on the CPU. Default: True where torch sees no accelerator (then bf16 "
            "defaults to False), else False."
        },
    )

    def __post_init__(self) -> None:
        for name, value in cpu_defaults().items():  # no accelerator: the CPU, in float32
            if getattr(self, name) is None:  # not set by the user
                setattr(self, name, value)
        if self.use_cpu is None:
            self.use_cpu = False
        super().__post_init__()
        check_config(self)


#: the fields :func:`check_config` reads: a config is checked again once one of them changes
CHECKED_FIELDS = (
    "loss_type", "importance_sampling_level", "use_bias_correction_kl", *OTHER_LOSS_FIELDS,
    "epsilon", "epsilon_high", "delta", "beta", "gmpo_impl", "gmpo_lm_head",
    "gmpo_lm_head_backward",
    "loss_variant", "use_vllm", "vllm_importance_sampling_correction",
)  # fmt: skip
_read = operator.attrgetter(*CHECKED_FIELDS)
#: the options a loss variant replaces (refused beside it), with what to do instead
_CLIP = "the variant's clip is its own; remove it"
REPLACED = {
    "epsilon": (GMPO_FIELDS["epsilon"].default, _CLIP),
    "epsilon_high": (None, _CLIP),
    "delta": (None, _CLIP),
    "gmpo_impl": (IMPLS[0], "the variant is its own code; remove it"),
}


@dataclass(frozen=True)
class Checked:
    """What :func:`check_config` found for a config: the values it checked (of
    :data:`CHECKED_FIELDS`) and the loss variant they resolve to (None: GMPO's loss). The run
    plan of ``gmpo``'s command line holds it and hands it to ``GMPOTrainer``."""

    values: tuple[Any, ...]
    variant: Variant | None


def loss_variant(args: GMPOConfig) -> Variant | None:
    """``args.loss_variant`` resolved (``gmpo_variants.resolve``) by :func:`check_config`: the
    same object for the same values, which the trainer, ``gmpo compare`` and its plots read.

    Raises:
        ValueError: one line, naming ``loss_variant``.
    """
    return check_config(args).variant


def check_config(args: GMPOConfig) -> Checked:
    """Refuse every value that would change nothing, or is meaningless, under GMPO; return what
    was checked and the loss variant it resolved. The values are checked once per process: a
    config whose values passed before (the same config at its construction, then in the run's
    plan or the trainer; a copy, an unpickled one) gets the same :class:`Checked`, a config whose
    values changed since is checked again. Nothing is kept on the config.

    Raises:
        ValueError: naming the field, the value, and what to do instead.
    """
    values = _read(args)
    key = tuple((type(v), v) for v in values)  # True and 1 are equal, not the same value
    try:
        hash(key)
    except TypeError:  # a value no check accepts (a list...): checked, not remembered
        return _check_values(key)
    return _checked(key)


def _check_values(key: tuple[tuple[type, Any], ...]) -> Checked:
    """The checks of :func:`check_config` on its ``(type, value)`` of each checked field."""
    values = tuple(v for _, v in key)
    args: Any = types.SimpleNamespace(**dict(zip(CHECKED_FIELDS, values, strict=True)))
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
    HOST.check(args.epsilon, args.epsilon_high, args.delta)
    # beta's own rule (finite, >= 0); its reference log-probs come from the reference model that
    # GRPOTrainer builds whenever beta != 0
    check_beta(args.beta, has_ref_logp=True)
    HOST.check_impl(args.gmpo_impl)
    if args.gmpo_lm_head not in (None, True, False):
        raise ValueError(
            f"gmpo_lm_head={args.gmpo_lm_head!r}: choose None (auto: gmpo_core's head on the "
            "CPU and, with Triton, on CUDA; TRL's elsewhere), True (gmpo_core's everywhere) or "
            "False (TRL's everywhere)"
        )
    backward = args.gmpo_lm_head_backward
    if backward not in BACKWARD_PRECISIONS:
        raise ValueError(
            f"gmpo_lm_head_backward={backward!r}: choose one of {BACKWARD_PRECISIONS} "
            "(the LM head's backward GEMMs in half precision or in float32)"
        )
    return Checked(values, _variant_of(args))


#: the last configs' checks (:func:`check_config`), by their values
_checked = functools.lru_cache(maxsize=64)(_check_values)


def _variant_of(args: Any) -> Variant | None:
    """``loss_variant`` resolved, once none of the settings it would silently drop is set.

    A variant maps ``(logp, old_logp, advantages, mask)`` to the loss, or to ``(loss, clipped
    fraction)`` (``gmpo_variants.registry.SIGNATURE``): its clip range is its own (``epsilon``,
    ``epsilon_high``, ``delta``), and it has no KL term (``beta``), no importance weights
    (vLLM's correction) and no ``gmpo_impl``: each is refused at another value than its default
    (:func:`check_variant` refuses them at their default too, where the user set them). The
    masks (entropy, off-policy, tool) reach it as its ``mask``; the host terms (entropy bonus,
    MoE aux loss) are added to its loss as to GMPO's."""
    name = args.loss_variant
    if name is None:
        return None
    try:
        variant = resolve(name)
    except ValueError as err:
        raise ValueError(f"loss_variant: {err}") from None
    conflicts = {  # field -> (whether it is set, why it does not apply and what to do)
        **{f: (getattr(args, f) != default, why) for f, (default, why) in REPLACED.items()},
        "beta": (args.beta != 0.0, "a variant has no KL term; set beta=0"),
        "vllm_importance_sampling_correction": (
            bool(args.use_vllm and args.vllm_importance_sampling_correction),
            "a variant takes no importance weights; set it to False with use_vllm",
        ),
    }
    for field_name, (conflict, why) in conflicts.items():
        if conflict:
            raise ValueError(_refusal(args, field_name, why))
    return variant


def _refusal(args: Any, field_name: str, why: str) -> str:
    return (
        f"{field_name}={getattr(args, field_name)!r} does not apply to "
        f"loss_variant={args.loss_variant!r}: {why}"
    )


def check_variant(args: GMPOConfig, explicit: Collection[str]) -> None:
    """What :func:`check_config` cannot see in the values: an option the loss variant replaces
    (:data:`REPLACED`) that the user set (``explicit``, the names the command line's parse knows
    were set), even to its default value. (At another value, :func:`check_config` refused it.)

    Raises:
        ValueError: one line, naming the field that conflicts with the variant.
    """
    if args.loss_variant is None:
        return
    for field_name, (_, why) in REPLACED.items():
        if field_name in explicit:
            raise ValueError(_refusal(args, field_name, why))
