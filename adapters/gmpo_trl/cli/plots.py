"""The figures of a ``gmpo`` run (``metrics.png``) and of ``gmpo compare`` (``compare.png``),
drawn from the logged rows with matplotlib (Agg)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from gmpo_trl.cli.reports import series

#: TRL's loss types that clip each token's ratio to (1 - epsilon, 1 + epsilon_high)
RATIO_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo")


def log_clip_range(config: Any, variant: Any = None) -> tuple[float, float] | None:
    """The clip range of a run in log space: GMPO's (-epsilon, epsilon_high); a TRL loss's token
    ratio range (1 - epsilon, 1 + epsilon_high) as log(1 - epsilon), log(1 + epsilon_high); a
    loss variant's ``bounds`` (``gmpo_variants.Variant``; ``variant``, resolved by the run's
    plan, or the config's ``loss_variant``); None where there is no token clip (a sequence-level
    clip, CISPO's clipped weight, SAPO's gate, a variant without bounds)."""
    if variant is None and getattr(config, "loss_variant", None) is not None:
        from gmpo_trl.config import loss_variant

        variant = loss_variant(config)
    if variant is not None:
        bounds = variant.bounds
        return None if bounds is None else (-bounds[0], bounds[1])
    from gmpo_core.options import upper

    eps, high = float(config.epsilon), float(upper(config.epsilon, config.epsilon_high))
    loss_type = getattr(config, "loss_type", "gmpo")
    if loss_type == "gmpo":
        return -eps, high
    if (
        loss_type not in RATIO_CLIPPED
        or getattr(config, "importance_sampling_level", "token") != "token"
    ):
        return None
    if eps >= 1:  # no lower bound in ratio space
        return -math.inf, math.log1p(high)
    from gmpo_variants.grpo import ratio_bounds

    low, high = ratio_bounds(eps, high)
    return -low, high


def _clip_lines(ax: Any, bounds: tuple[float, float] | None) -> None:
    """The clip range as two dashed lines, one legend entry."""
    if bounds is None:
        return
    label = f"clip range [{bounds[0]:+.2f}, {bounds[1]:+.2f}]"
    for b in bounds:
        if math.isfinite(b):
            ax.axhline(b, color="gray", linestyle="--", linewidth=1, label=label)
            label = "_nolegend_"


def _marker(n: int) -> dict[str, Any]:
    return {"marker": "o", "markersize": 3 if n <= 60 else 1.5}


def plot_training(
    rows: list[dict[str, Any]],
    path: Path,
    title: str = "GMPO",
    bounds: tuple[float, float] | None = None,
) -> None:
    """Reward, token log-ratio range (off-policy steps; the clip range as dashed lines), clip
    fractions and entropy per step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    ax = axes[0]
    steps, values = series(rows, "reward")
    ax.plot(steps, values, color="tab:green", **_marker(len(steps)))
    ax.set_title("reward")

    ax = axes[1]
    for key, color in (("log_ratio/min", "tab:blue"), ("log_ratio/max", "tab:red")):
        steps, values = series(rows, key)
        ax.plot(steps, values, color=color, label=key.split("/")[1], **_marker(len(steps)))
    _clip_lines(ax, bounds)
    ax.set_title("token log-ratio range (off-policy steps)")
    ax.legend(fontsize=7)

    ax = axes[2]
    steps, values = series(rows, "clip_ratio/region_mean")
    if steps:  # the sum, drawn wide and pale under its two parts
        ax.plot(steps, values, color="0.6", linewidth=5, alpha=0.45, label="region (low + high)")
    for key, color, marker in (
        ("clip_ratio/low_mean", "tab:blue", "v"),
        ("clip_ratio/high_mean", "tab:red", "^"),
        ("variant/clip_ratio", "tab:green", "o"),  # a loss variant's own (loss_variant)
    ):
        steps, values = series(rows, key)
        if steps:
            style = {**_marker(len(steps)), "marker": marker}
            ax.plot(steps, values, color=color, label=key.split("/")[1], **style)
    ax.set_title("fraction of tokens clipped")
    ax.legend(fontsize=7)

    ax = axes[3]
    steps, values = series(rows, "entropy")
    ax.plot(steps, values, color="tab:purple", **_marker(len(steps)))
    ax.set_title("entropy")
    for ax in axes:
        ax.set_xlabel("optimizer step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _band(runs: list[list[dict[str, Any]]], key: str) -> tuple[list[int], list[float], list[float]]:
    """Per step: the mean over runs and the standard deviation (0 for one run), at the steps
    every run logged."""
    per_run = [dict(zip(*series(rows, key), strict=True)) for rows in runs]
    steps = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    mean = [statistics.fmean(d[s] for d in per_run) for s in steps]
    std = [statistics.stdev([d[s] for d in per_run]) if len(per_run) > 1 else 0.0 for s in steps]
    return steps, mean, std


#: each method's color in ``compare.png``
COLORS = {"GRPO": "tab:orange", "GMPO": "tab:green", "DAPO": "tab:blue", "GSPO": "tab:red",
          "CISPO": "tab:purple", "SAPO": "tab:brown"}  # fmt: skip


def plot_compare(
    runs: dict[str, list[list[dict[str, Any]]]],
    path: Path,
    bounds: dict[str, tuple[float, float] | None] | None = None,
) -> None:
    """The reward of each method (mean over seeds, ± one standard deviation shaded), and per
    method the token log-ratio range at off-policy steps (the per-step min and max, mean over
    seeds ± one standard deviation) with its clip range dashed, on a shared y axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_seeds = max(len(v) for v in runs.values())
    if len(runs) <= 2:
        fig, axes = plt.subplots(1, 1 + len(runs), figsize=(5.5 * (1 + len(runs)), 4))
    else:  # four panels a row, the reward first
        rows = math.ceil((1 + len(runs)) / 4)
        fig, grid = plt.subplots(rows, 4, figsize=(22, 4 * rows), squeeze=False)
        axes = list(grid.flat)[: 1 + len(runs)]
        for spare in list(grid.flat)[1 + len(runs) :]:
            spare.set_visible(False)
    ax = axes[0]
    for name, seed_rows in runs.items():
        steps, mean, std = _band(seed_rows, "reward")
        c = COLORS.get(name)
        ax.plot(steps, mean, color=c, label=name, **_marker(len(steps)))
        ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                        [m + s for m, s in zip(mean, std, strict=True)], color=c, alpha=0.2)  # fmt: skip
    ax.set_title(f"reward (mean of {n_seeds} seed{'s' * (n_seeds > 1)} ± std)")
    ax.set_xlabel("optimizer step")
    ax.legend(fontsize=8)
    range_axes = axes[1:]
    for ax, (name, seed_rows) in zip(range_axes, runs.items(), strict=True):
        for key, c in (("log_ratio/min", "tab:blue"), ("log_ratio/max", "tab:red")):
            steps, mean, std = _band(seed_rows, key)
            ax.plot(steps, mean, color=c, label=key.split("/")[1], **_marker(len(steps)))
            ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                            [m + s for m, s in zip(mean, std, strict=True)], color=c, alpha=0.2)  # fmt: skip
        _clip_lines(ax, (bounds or {}).get(name))
        ax.set_title(f"{name}: token log-ratio range")
        ax.set_xlabel("optimizer step (off-policy steps)")
        ax.legend(fontsize=8)
    lo = min(a.get_ylim()[0] for a in range_axes)
    hi = max(a.get_ylim()[1] for a in range_axes)
    for a in range_axes:
        a.set_ylim(lo, hi)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
