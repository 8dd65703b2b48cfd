"""The off-policy study's fixed settings and rules (docs/offpolicy_plan.md): its task, losses,
regimes, rates and seeds; the pilot's rate rule; the paired standard deviation and the minimum
detectable difference of the exact sign test; the exclusion of runs where the clip never acted;
the verdict. Pure functions of records: no run, no file."""

from __future__ import annotations

import math
import statistics
from statistics import NormalDist
from typing import Any

from gmpo_stats.paired import sign_test_two_sided
from studies.stability.updates_plan import REGIMES

#: the real model's task (gmpo_tasks' chat_arith: a held-out split disjoint by construction)
TASK = "chat_arith"
#: GMPO first; TRL's default loss (GRPOConfig's loss_type="dapo" at its defaults)
GMPO, AGAINST = "gmpo", "dapo_trl"
LOSSES = (GMPO, AGAINST)
#: the primary regime: optimizer updates per generation batch, counted as the regime study
#: counts them (minibatches x epochs: TRL's steps_per_generation x num_iterations)
UPDATES = 4
#: the secondary arm, at each loss's primary rate: on-policy, where the clip cannot act
ARM_UPDATES = 1
#: the pilot's learning rates (constant schedule), each twice the one before
LADDER = (1e-5, 2e-5, 4e-5)
#: where a loss's pick is the lowest (highest) rate it ran, the pilot runs half (twice) that
#: rate too, at most this many times each way
EXTEND = 1
PILOT_SEEDS = (8000, 8001)
GRID_SEEDS = tuple(range(8100, 8112))
#: run in order, each in place of a grid seed excluded because the clip never acted
SPARE_SEEDS = tuple(range(8112, 8116))
#: the tiny model's part: the regime study's chain_sum, GMPO against dapo_trl
TINY_TASK = "chain_sum"
TINY_REGIMES = tuple(REGIMES)  # 1, 2, 4 and 16 updates
TINY_PILOT_SEEDS = (8200, 8201, 8202)
TINY_GRID_SEEDS = tuple(range(8300, 8316))

#: the decision rule: the two-sided exact sign test's level and the power the MDE is for
ALPHA, POWER = 0.05, 0.8
#: "helps"/"hurts" also need a mean difference at least this large
MIN_EFFECT = 0.02
#: "same": the whole 95 % interval within +- max(SAME, MDE) ...
SAME = 0.05
#: ... and only where the MDE is at most this (a study that cannot see 0.10 says inconclusive)
SAME_MAX = 0.10
#: helps is reachable when the comparator's pilot mean plus the MDE stays below this
REACH = 0.95

#: a record's primary endpoint, and the key of the clipped fraction that decides exclusion
ENDPOINT = "held_out_reward_after"
CLIP_KEY = "clipped_fraction_max"


def regime_flags(updates: int, generation_batch: int, generations: int) -> list[str]:
    """``gmpo`` flags of ``updates`` per generation batch of ``generation_batch`` completions,
    ``generations`` of them: ``minibatches x epochs`` of :data:`REGIMES`, one optimizer step a
    minibatch (no gradient accumulation)."""
    m, e = REGIMES[updates]
    if generation_batch % m:
        raise ValueError(f"{generation_batch} completions do not split into {m} minibatches")
    return ["--per_device_train_batch_size", str(generation_batch // m),
            "--gradient_accumulation_steps", "1", "--steps_per_generation", str(m),
            "--num_iterations", str(e), "--max_steps", str(generations * m * e)]  # fmt: skip


def clip_acted(record: dict[str, Any]) -> bool:
    """Whether the clip acted in a run: some logged step clipped a token (a missing value: no)."""
    value = record.get(CLIP_KEY)
    return isinstance(value, int | float) and value > 0


# ---- the pilot's rule ----


def means_by_rate(records: list[dict[str, Any]]) -> dict[str, dict[float, dict[str, Any]]]:
    """Per loss, per rate: the mean endpoint over the pilot seeds, the seeds, and whether the
    clip acted in every one of its runs."""
    by: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in records:
        by.setdefault((r["loss"], r["lr"]), []).append(r)
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for (loss, lr), rs in sorted(by.items()):
        out.setdefault(loss, {})[lr] = {
            "mean": statistics.fmean(r[ENDPOINT] for r in rs),
            "seeds": sorted(r["seed"] for r in rs),
            "clip_acted": all(clip_acted(r) for r in rs),
        }
    return out


def pick(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule on the pilot's records: per loss, among the rates at which the clip acted in
    every pilot run, the one of the highest mean held-out reward after training (the lower rate
    on a tie). ``rates`` (a loss without an eligible rate has none), ``edge`` (the pick is the
    lowest or highest rate the loss ran: "low"/"high"), ``means``."""
    rates: dict[str, float] = {}
    edge: dict[str, str] = {}
    table = means_by_rate(records)
    for loss, by_lr in table.items():
        eligible = {lr: m["mean"] for lr, m in by_lr.items() if m["clip_acted"]}
        if not eligible:
            continue
        best = max(eligible.values())
        rates[loss] = min(lr for lr, m in eligible.items() if m == best)
        if len(by_lr) > 1 and rates[loss] in (min(by_lr), max(by_lr)):
            edge[loss] = "low" if rates[loss] == min(by_lr) else "high"
    means = {loss: {repr(lr): m for lr, m in d.items()} for loss, d in table.items()}
    return {"rates": rates, "edge": edge, "means": means}


def extension(records: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """The pilot's next runs: (loss, rate) of half (twice) the pick where it is the lowest
    (highest) rate the loss ran, within :data:`EXTEND` halvings (doublings) of the ladder."""
    out = []
    chosen = pick(records)
    for loss, side in chosen["edge"].items():
        rate = chosen["rates"][loss]
        if side == "low" and rate / 2 >= min(LADDER) / 2**EXTEND * (1 - 1e-9):
            out.append((loss, rate / 2))
        elif side == "high" and rate * 2 <= max(LADDER) * 2**EXTEND * (1 + 1e-9):
            out.append((loss, rate * 2))
    return out


# ---- the paired standard deviation and the minimum detectable difference ----


def paired_sd(records: list[dict[str, Any]]) -> tuple[float, int]:
    """``(s_d, df)``: the pooled within-rate standard deviation of the pilot's paired
    differences, GMPO minus the other at the same rate on the same seed (pairs where the clip
    acted in both runs), over every rate with at least two such seeds:
    ``s_d^2 = sum_r sum_s (d_rs - mean_r)^2 / sum_r (n_r - 1)``. NaN and 0 without any."""
    value = {(r["loss"], r["lr"], r["seed"]): r for r in records}
    by_rate: dict[float, list[float]] = {}
    for (loss, lr, seed), g in sorted(value.items()):
        o = value.get((AGAINST, lr, seed))
        if loss == GMPO and o is not None and clip_acted(g) and clip_acted(o):
            by_rate.setdefault(lr, []).append(g[ENDPOINT] - o[ENDPOINT])
    groups = [d for d in by_rate.values() if len(d) >= 2]
    df = sum(len(d) - 1 for d in groups)
    if df == 0:
        return math.nan, 0
    ss = sum((x - statistics.fmean(d)) ** 2 for d in groups for x in d)
    return math.sqrt(ss / df), df


def sign_threshold(n: int, alpha: float = ALPHA) -> int | None:
    """The fewest wins of ``n`` seeds (no ties) at which the two-sided exact sign test's p is
    below ``alpha``; None where none is."""
    return next((k for k in range(n // 2 + 1, n + 1) if sign_test_two_sided(k, n - k) < alpha),
                None)  # fmt: skip


def binomial_tail(n: int, k: int, p: float) -> float:
    """P(Binomial(n, p) >= k)."""
    return sum(math.comb(n, j) * p**j * (1 - p) ** (n - j) for j in range(k, n + 1))


def win_probability(n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """p*: the smallest probability that GMPO wins a seed at which the sign test on ``n`` seeds
    reaches :func:`sign_threshold` wins with probability ``power`` (bisection to 1e-12)."""
    k = sign_threshold(n, alpha)
    if k is None:
        return math.nan
    lo, hi = 0.5, 1.0
    while hi - lo > 1e-12:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if binomial_tail(n, k, mid) >= power else (mid, hi)
    return hi


def mde(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The minimum detectable difference of the two-sided exact sign test on ``n`` seeds whose
    paired differences are normal with standard deviation ``sd``: ``MDE = z(p*) * sd``, where
    ``z`` is the standard normal quantile and p* is :func:`win_probability` (a seed's
    difference is above 0 with probability ``Phi(MDE / sd) = p*``)."""
    return NormalDist().inv_cdf(win_probability(n, alpha, power)) * sd


# ---- the verdict ----


def margin(mde_value: float) -> float:
    """The interval a *same* verdict must lie within: +- max(:data:`SAME`, MDE)."""
    return max(SAME, mde_value)


def verdict(t: dict[str, Any], mde_value: float) -> str:
    """The plan's reading of the primary row (GMPO minus ``dapo_trl`` on the held-out reward;
    ``t`` is :func:`studies.stability.which_loss.compare`'s):

    - ``helps``: p < :data:`ALPHA`, GMPO higher on more seeds, the 95 % interval above 0 and the
      mean difference at least :data:`MIN_EFFECT`;
    - ``hurts``: the same in the other's favour;
    - ``same``: p >= :data:`ALPHA`, the MDE at most :data:`SAME_MAX`, and the whole interval
      within +- :func:`margin`;
    - ``inconclusive``: anything else."""
    lo, hi = t["ci"]
    significant = t["p"] < ALPHA
    if significant and t["wins"] > t["losses"] and lo > 0 and t["mean_diff"] >= MIN_EFFECT:
        return "helps"
    if significant and t["losses"] > t["wins"] and hi < 0 and t["mean_diff"] <= -MIN_EFFECT:
        return "hurts"
    m = margin(mde_value)
    if not significant and mde_value <= SAME_MAX and -m <= lo and hi <= m:
        return "same"
    return "inconclusive"


def counted(records: list[dict[str, Any]], seeds: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """``(counted, excluded)`` seeds, in order: a seed counts where both losses' runs finished
    and the clip acted in both; it is excluded where both finished and the clip did not act in
    one of them (a seed not finished is in neither)."""
    by = {(r["loss"], r["seed"]): r for r in records}
    count, out = [], []
    for s in seeds:
        pair = [by.get((loss, s)) for loss in LOSSES]
        if all(p is not None for p in pair):
            (count if all(clip_acted(p) for p in pair if p) else out).append(s)
    return count, out
