"""verl ``PolicyLossFn``s for GMPO: unpack verl's inputs, call :func:`gmpo_core.gmpo_loss`, and
normalize by the *global* mini-batch so that the gradient does not depend on how verl splits it.

verl 0.9's actor (``verl/workers/utils/losses.py::ppo_loss``) calls the registered loss by keyword
once per micro-batch and backpropagates each result separately; the optimizer sees the sum over
micro-batches, averaged over data-parallel ranks. Before each call it stores in
``config.global_batch_info`` the data-parallel size, the global mini-batch size (sequences) and the
global number of valid tokens. With them, per micro-batch and rank::

    seq-mean-token-mean:  loss = sum_i L_i         * dp_size / global_batch_size   (the paper)
    token-mean:           loss = sum_i n_i * L_i   * dp_size / batch_num_tokens

where ``L_i`` is GMPO's per-sequence loss (``gmpo_loss(...).per_sequence_loss``) and ``n_i`` the
row's number of response tokens. Summed over micro-batches and averaged over ranks this is exactly
the mean over the global mini-batch, whatever the split (uneven micro-batches and ranks, fully
masked rows and rollout weights included). It is also exactly what verl's own ``agg_loss`` returns
for a per-token loss matrix that holds ``L_i`` at every valid token of row ``i``, so every engine
that scales verl's built-in losses correctly (FSDP, Megatron's ``num_micro_batch`` factor) scales
this one correctly too.

No GMPO math lives here: the trust region, the geometric mean and the rollout weights are
:mod:`gmpo_core`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import torch
from torch import Tensor

from gmpo_core import gmpo_loss
from gmpo_core.options import Impl, positive_finite
from gmpo_kit import (
    SPREAD,
    HostOptions,
    MetricStates,
    add_core_stats,
    core_metrics,
    read,
    spread_values,
    varies_within_rows,
)

logger = logging.getLogger("gmpo_verl")

#: The ``loss_agg_mode`` values GMPO accepts, and what each means (see the module docstring).
LOSS_AGG_MODES = ("seq-mean-token-mean", "token-mean")
SUM_MODES = ("token-sum", "seq-mean-token-sum", "seq-mean-token-sum-norm")  # verl's, refused
#: Environment variable selecting :func:`gmpo_core.gmpo_loss`'s ``impl`` (verl's config classes
#: reject unknown keys): ``plain`` (default) or ``compiled``. verl's own
#: ``actor.use_torch_compile`` does not turn gmpo's compiled path on.
IMPL_ENV = "GMPO_VERL_IMPL"
#: verl as a host: its actor config's names for gmpo_loss's options, advantages per token
HOST = HostOptions(
    host="gmpo_verl",
    epsilon="clip_ratio_low",
    epsilon_high="clip_ratio_high",
    dual_clip="clip_ratio_c",
    impl=IMPL_ENV,
    mask="response_mask",
    token_advantages=True,
)
_TOKENS = "tokens"  # the micro-batch's response tokens (a metric state)

_notified: set[str] = set()


def _once(key: str, message: str, *args: object) -> None:
    """Log a warning the first time ``key`` is seen in this process."""
    if key not in _notified:
        _notified.add(key)
        logger.warning(message, *args)


@dataclass(frozen=True)
class GlobalBatch:
    """The global mini-batch a micro-batch belongs to, from ``config.global_batch_info``.

    ``denominator`` is the number of sequences (seq-mean-token-mean) or of valid tokens
    (token-mean, possibly 0) in the global mini-batch, as ``global_batch_info`` gives it; the
    micro-batch's summed loss is divided by it (by 1 when it is 0: then no row has a token and
    the sum is 0).
    """

    dp_size: int
    denominator: int

    @property
    def scale(self) -> float:
        """The factor that turns a micro-batch sum into its share of the global mean: data-parallel
        ranks are averaged by the engine, so each rank's share is multiplied by ``dp_size``."""
        return self.dp_size / max(self.denominator, 1)


def _int(info: Any, key: str, minimum: int) -> int:
    value = info.get(key) if hasattr(info, "get") else None
    if isinstance(value, Tensor) and value.numel() == 1 and not value.dtype.is_floating_point:
        value = int(value.item())
    elif isinstance(value, Real) and not isinstance(value, (bool, Integral)):
        value = int(value) if float(value).is_integer() else value
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(
            f"config.global_batch_info[{key!r}] must be an integer >= {minimum}, got {value!r}. "
            "verl's actor (workers/utils/losses.py::ppo_loss) sets dp_size, global_batch_size and "
            "batch_num_tokens before every call; when calling the loss yourself, set them for the "
            "global mini-batch. gmpo never falls back to a local mean (that makes the gradient "
            "depend on the number of micro-batches)."
        )
    return int(value)


def global_batch(config: Any, loss_agg_mode: str, local_rows: int) -> GlobalBatch:
    """Read and check the global mini-batch metadata that ``loss_agg_mode`` needs.

    Raises ``ValueError`` when it is missing or invalid, never falling back to a local mean.
    """
    info = getattr(config, "global_batch_info", None)
    if not info:
        raise ValueError(
            f"loss_mode=gmpo needs config.global_batch_info (dp_size, global_batch_size, "
            f"batch_num_tokens), got {info!r}: verl >= 0.9's engine sets it before every call of "
            "the policy loss; gmpo refuses to fall back to a micro-batch-local mean."
        )
    dp_size = _int(info, "dp_size", 1)
    if loss_agg_mode == "seq-mean-token-mean":
        size = _int(info, "global_batch_size", 1)
        if local_rows > size:
            raise ValueError(
                f"config.global_batch_info['global_batch_size'] = {size} is smaller than this "
                f"micro-batch ({local_rows} sequences): it must count the sequences of the whole "
                "mini-batch over all data-parallel ranks."
            )
        return GlobalBatch(dp_size, size)
    return GlobalBatch(dp_size, _int(info, "batch_num_tokens", 0))


def check_loss_agg_mode(loss_agg_mode: str) -> str:
    """``seq-mean-token-mean`` (the paper) and ``token-mean`` are accepted; the sum modes are not."""
    if loss_agg_mode in LOSS_AGG_MODES:
        if loss_agg_mode == "token-mean":
            _once(
                "token-mean",
                "gmpo_verl: loss_agg_mode=token-mean weights each sequence's GMPO loss by its "
                "number of tokens; the paper's objective is loss_agg_mode=seq-mean-token-mean.",
            )
        return loss_agg_mode
    use = (
        "Use loss_agg_mode=seq-mean-token-mean (the paper's objective) or token-mean (each "
        "sequence weighted by its token count)."
    )
    if loss_agg_mode in SUM_MODES:
        raise ValueError(
            f"loss_mode=gmpo does not support loss_agg_mode={loss_agg_mode!r}: GMPO's loss is "
            "one length-normalized term per sequence, and a token sum would rescale it by the "
            f"sequence length. {use}"
        )
    raise ValueError(
        f"loss_agg_mode={loss_agg_mode!r} is not one of verl's modes "
        f"({', '.join((*LOSS_AGG_MODES, *SUM_MODES))}). {use}"
    )


def _config_value(config: Any, key: str) -> Any:
    return getattr(config, key, None)


def clip_bounds(config: Any) -> tuple[float, float]:
    """Log-space bounds ``(epsilon, epsilon_high)`` from ``clip_ratio_low/high`` (else ``clip_ratio``).

    Under loss_mode=gmpo they bound the log-ratio: the ratio is kept in
    ``[exp(-clip_ratio_low), exp(clip_ratio_high)]`` (the paper uses 0.4 for both). Each must be a
    finite number > 0: a bool or a string (``"0.3"``) is refused, as ``clip_ratio_c`` is (verl's
    configs come from Hydra/OmegaConf, which types them), and the error names the key read.
    """
    low, high = _clip_key(config, "clip_ratio_low"), _clip_key(config, "clip_ratio_high")
    if low[1] is None or high[1] is None:
        raise ValueError(
            "loss_mode=gmpo needs clip_ratio_low and clip_ratio_high (or clip_ratio) in the actor "
            f"config, got clip_ratio={_config_value(config, 'clip_ratio')!r}, "
            f"clip_ratio_low={low[1]!r}, clip_ratio_high={high[1]!r}"
        )
    return positive_finite(*low), positive_finite(*high)


def _clip_key(config: Any, key: str) -> tuple[str, Any]:
    """``(name, value)`` of a clip bound: ``key``'s, or ``clip_ratio``'s where ``key`` is null."""
    value = _config_value(config, key)
    if value is None:
        return "clip_ratio", _config_value(config, "clip_ratio")
    return key, value


def _dual_clip(config: Any) -> object:
    """``clip_ratio_c``: the cap on the ratio of negative-advantage tokens (gmpo_dual_clip),
    checked with the clip range in ``_policy_loss``."""
    c = _config_value(config, "clip_ratio_c")
    if c is None:
        raise ValueError(
            "loss_mode=gmpo_dual_clip needs clip_ratio_c (a number > 1) in the actor config, "
            "got None"
        )
    return c


def _impl() -> Impl:
    """gmpo_core's path from ``GMPO_VERL_IMPL`` (unset or empty: the default)."""
    return HOST.check_impl(os.environ.get(IMPL_ENV) or None)


PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]


def _policy_loss_fn(name: str, *, dual_clip: bool) -> PolicyLossFn:
    """The verl ``PolicyLossFn`` registered as ``loss_mode=<name>``: verl calls it by keyword."""

    def policy_loss(
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, float]]:
        return _policy_loss(
            old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
            rollout_is_weights, dual_clip=dual_clip,
        )  # fmt: skip

    policy_loss.__name__ = policy_loss.__qualname__ = name
    return policy_loss


compute_policy_loss_gmpo = _policy_loss_fn("compute_policy_loss_gmpo", dual_clip=False)
compute_policy_loss_gmpo.__doc__ = """GMPO policy loss for verl (``loss_mode=gmpo``), normalized by
    the global mini-batch.

    Args:
        old_log_prob: behaviour-policy log-probs.
        log_prob: current-policy log-probs (gradients flow here only).
        advantages: per-token advantages, constant along each row for outcome estimators.
        response_mask: valid response tokens.
        loss_agg_mode: ``seq-mean-token-mean`` (the paper) or ``token-mean``; see the module doc.
        config: verl's ``ActorConfig``: ``clip_ratio_low/high`` (log-space bounds) and
            ``global_batch_info``.
        rollout_is_weights: rollout-correction weights, passed to ``gmpo_loss(is_weights=)``.

    Returns:
        ``(loss, metrics)``: the loss of this micro-batch's share of the global mini-batch, and
        per-call float metrics that verl averages over micro-batches and ranks (``Metric(MEAN)``).

    Shape:
        old_log_prob, log_prob, advantages, response_mask, rollout_is_weights: (B, T).
    """
compute_policy_loss_gmpo_dual_clip = _policy_loss_fn(
    "compute_policy_loss_gmpo_dual_clip", dual_clip=True
)
compute_policy_loss_gmpo_dual_clip.__doc__ = """``loss_mode=gmpo_dual_clip``:
    :func:`compute_policy_loss_gmpo` with the ratio of negative-advantage tokens also capped at
    ``config.clip_ratio_c`` (verl's dual-clip constant, default 3.0; must be > 1). Adds the metric
    ``actor/pg_clipfrac_dual``."""


def _policy_loss(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: Tensor | None,
    *,
    dual_clip: bool,
) -> tuple[Tensor, dict[str, float]]:
    if config is None:
        raise ValueError("loss_mode=gmpo needs config (verl's ActorConfig), got None")
    mode = check_loss_agg_mode(loss_agg_mode)
    eps_low, eps_high = clip_bounds(config)
    cap = _dual_clip(config) if dual_clip else None
    # gmpo_core's own rules, under verl's names (gmpo_loss checks them again under its own)
    HOST.check(eps_low, eps_high, cap)
    dual = None if cap is None else float(cap)  # type: ignore[arg-type]
    batch = global_batch(config, mode, log_prob.shape[0])

    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0  # (B, T)
    n = valid.sum(-1)  # (B,)
    states = MetricStates()  # what the metrics are made of (no reduction: verl averages them)
    adv = HOST.advantages(advantages, valid, n, states)  # (B,)
    out = gmpo_loss(
        log_prob, old_log_prob, adv, valid, epsilon=eps_low, epsilon_high=eps_high,
        is_weights=rollout_is_weights, dual_clip=dual, impl=_impl(),
    )  # fmt: skip

    per_seq = out.per_sequence_loss  # (B,)
    if mode == "seq-mean-token-mean":
        loss = per_seq.sum() * batch.scale
    else:  # token-mean: each sequence weighted by its number of response tokens
        loss = (per_seq * n.to(per_seq.dtype)).sum() * batch.scale
    metrics, local_tokens = _metrics(states, out, old_log_prob, log_prob, valid, dual_clip)
    if mode == "token-mean" and batch.denominator < local_tokens:
        raise ValueError(
            f"config.global_batch_info['batch_num_tokens'] = {batch.denominator} is smaller than "
            f"this micro-batch's own {local_tokens} response tokens: it must count the valid "
            "tokens of the whole mini-batch over all data-parallel ranks."
        )
    return loss, metrics


def _metrics(
    states: MetricStates,
    out: Any,
    old_log_prob: Tensor,
    log_prob: Tensor,
    valid: Tensor,
    dual_clip: bool,
) -> tuple[dict[str, float], int]:
    """verl's names and meanings (docs/semantics.md, "Metrics"), as floats, and the micro-batch's
    number of valid tokens, with a single device synchronization.

    ``actor/pg_clipfrac``: fraction of valid tokens with A > 0 and r > eps_high (the clip took
    effect); ``actor/pg_clipfrac_lower``: A < 0 and r < -eps_low; ``actor/ppo_kl``: mean of
    ``old_log_prob - log_prob`` over valid tokens; ``actor/log_ratio_min/max``: range of the
    unclipped log-ratio (0 when the micro-batch has no valid token); ``actor/pg_clipfrac_dual``
    (dual clip only): A < 0 and r > log(clip_ratio_c). Each is a float32 value: the core's
    fractions and extrema are made in the states' float32, ``actor/ppo_kl`` is rounded to it.
    """
    r = torch.where(valid, log_prob.detach().float() - old_log_prob.float(), 0)  # (B, T)
    add_core_stats(states, out.stats)
    states.sum("ppo_kl", -r.sum())
    states.sum(_TOKENS, valid.sum())
    reduced = states.reduce()
    m = core_metrics(reduced, dual_clip)
    values = {
        "actor/pg_clipfrac": m["clip_ratio/high_mean"],
        "actor/pg_clipfrac_lower": m["clip_ratio/low_mean"],
        "actor/ppo_kl": reduced.fraction("ppo_kl", _TOKENS, empty=0.0).float(),
        "actor/log_ratio_min": torch.nan_to_num(m["log_ratio/min"], nan=0.0),
        "actor/log_ratio_max": torch.nan_to_num(m["log_ratio/max"], nan=0.0),
    }
    if dual_clip:
        values["actor/pg_clipfrac_dual"] = m["clip_ratio/dual_mean"]
    host = read({**values, **spread_values(reduced), _TOKENS: reduced[_TOKENS]})
    if varies_within_rows(host):
        _once(
            "advantage-spread",
            "gmpo_verl: advantages vary within a sequence (max deviation from the row mean %.3g); "
            "GMPO uses one advantage per sequence, the mean over the row's response tokens. Use "
            "a sequence-level estimator (algorithm.adv_estimator=grpo, rloo, ...).",
            host[SPREAD],
        )
    return {key: host[key] for key in values}, int(host[_TOKENS])
