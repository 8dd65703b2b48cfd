"""The stability study's figure: collapse rate (and the fraction of runs that ended below their
warm start) against learning rate per method, without and with gradient clipping, and the per-step reward, token log-ratio range and entropy of every
method in one cell (mean over seeds, each seed a thin line for the reward)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

COLORS = {"grpo": "tab:orange", "grpo_wide": "tab:red", "gmpo": "tab:green",
          "gmpo_narrow": "tab:olive", "gmpo_noclip": "tab:purple", "gmpo_seqclip": "tab:blue"}  # fmt: skip


def _collapsed(r: dict[str, Any]) -> bool:
    return bool(r["collapsed"])


def _below_start(r: dict[str, Any]) -> bool:
    return bool(r["final_reward"] < r["start_reward"])


def _mean(rows: list[list[float]]) -> list[float]:
    return [statistics.fmean(v) for v in zip(*rows, strict=True)]


def plot(
    records: list[dict[str, Any]],
    curves: list[dict[str, Any]],
    variants: list[str],
    cell: tuple[float, float | None],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax, clip in zip(axes[0][:2], (None, 1.0), strict=True):
        for i, m in enumerate(variants):
            runs = [r for r in records if r["variant"] == m and r["grad_clip"] == clip]
            lrs = sorted({r["lr"] for r in runs})
            if not lrs:
                continue
            shift = [lr * (1 + 0.05 * (i - (len(variants) - 1) / 2)) for lr in lrs]  # no overlap
            for rule, style in ((_collapsed, "-"), (_below_start, ":")):
                rate = [statistics.fmean(rule(r) for r in runs if r["lr"] == lr) for lr in lrs]
                ax.plot(shift, rate, style, marker="o" if style == "-" else "x",
                        color=COLORS.get(m), label=m if style == "-" else None)  # fmt: skip
        ax.set_xscale("log")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("learning rate")
        ax.set_title("fraction of runs collapsed (solid) / ended below the warm start (dotted)\n"
                     + ("no gradient clipping" if clip is None
                        else f"gradient clipping at {clip:g}"), fontsize=9)  # fmt: skip
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    lr, clip = cell
    where = f"lr {lr:g}, " + ("no grad clip" if clip is None else f"grad clip {clip:g}")
    panels = ((axes[0][2], "reward", "reward"), (axes[1][0], "log_ratio_max", "token log-ratio max"),
              (axes[1][1], "log_ratio_min", "token log-ratio min"),
              (axes[1][2], "entropy", "entropy of the sampling policy"))  # fmt: skip
    for ax, key, title in panels:
        for m in variants:
            runs = [
                c for c in curves if c["variant"] == m and c["lr"] == lr and c["grad_clip"] == clip
            ]
            if not runs:
                continue
            if key == "reward":
                for c in runs:
                    ax.plot(c["curves"][key], color=COLORS.get(m), alpha=0.25, linewidth=0.7)
            ax.plot(_mean([c["curves"][key] for c in runs]), color=COLORS.get(m), label=m)
        ax.set_title(f"{title}\n{where}, mean over seeds", fontsize=9)
        ax.set_xlabel("RL step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    axes[1][0].set_yscale("symlog")
    axes[1][1].set_yscale("symlog")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
