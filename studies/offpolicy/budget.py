"""The off-policy study's budget (docs/offpolicy_plan.md, "Budget"): each part's estimated
wall-clock from numbers measured before the plan (in results/), replaced by the pilot's own
measured run time once the pilot has run, and the cumulative rule for what is dropped.

Parts run in the order of :data:`PARTS`. The first two are never dropped. Before the third, the
wall-clock spent so far plus its estimate is compared with :data:`BUDGET_H`: it runs only if
that fits, else it and every later part are dropped. The last part, the 1-update arm, runs seed
by seed: a seed (both losses) starts only if the time spent plus its estimate fits."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from studies.offpolicy.design import (
    EXTEND,
    GRID_SEEDS,
    LADDER,
    LOSSES,
    PILOT_SEEDS,
    TINY_GRID_SEEDS,
    TINY_PILOT_SEEDS,
    TINY_REGIMES,
)
from studies.stability.updates_plan import EXTEND as TINY_EXTEND
from studies.stability.updates_plan import LADDER as TINY_LADDER

#: hours of wall-clock on the two-core machine for the whole study
BUDGET_H = 8.0
PARTS = ("the real model's pilot", "the real model's grid (4 updates)",
         "chain_sum's pilot and grid", "the real model's 1-update arm")  # fmt: skip
NEVER_DROPPED = 2


def measured(results: Path) -> dict[str, Any]:
    """The numbers measured before the plan, and a real-model run's wall-clock at 1 and 4
    updates derived from them (seconds; each run scores the held-out prompts twice):

    - ``compare_1u``: the regime study's cross-check (``results/updates/real/wall.tsv``): one
      ``gmpo compare`` a seed, GMPO and ``dapo_trl`` at 1 update, the held-out prompts scored
      three times (once before, once after each run): the longest seed over two;
    - ``eval``: one scoring of the 128 held-out completions (``results/real-model/
      calibration.json``: chat_chain_sum's three seeds' time over three);
    - ``train_2u``: ``gmpo train --task chat_chain_sum`` at 2 updates (1 minibatch x 2 epochs),
      scored twice (``results/real-model/train_chat_chain_sum.json``): the longest seed;
    - ``phases``: one optimizer step's CPU seconds per phase on 16 completions of 32 tokens
      (``results/figures-bench/trainer_step_real_cpu.json``, float32, GMPOTrainer);
    - ``run_1u`` = ``compare_1u`` + ``eval`` / 2; ``run_4u`` = ``run_1u`` + (``train_2u`` -
      ``run_1u``) x (scoring + 3 optimizer steps) / (scoring + forward + backward + optimizer
      step): 4 minibatches x 1 epoch add, per generation, one scoring pass (the old log-probs)
      and three optimizer steps to 1 update; 2 x 1 epochs add a scoring pass, a forward and
      backward pass and an optimizer step."""
    wall = [
        line.split("\t") for line in (results / "updates/real/wall.tsv").read_text().splitlines()
    ]
    compare_1u = max(int(w[5]) for w in wall if len(w) == 6) / 2
    cal = json.loads((results / "real-model/calibration.json").read_text())
    row = next(r for r in cal["rows"] if r["task"] == "chat_chain_sum")
    evaluation = row["seconds"] / len(row["per_seed"])
    train = json.loads((results / "real-model/train_chat_chain_sum.json").read_text())
    train_2u = max(r["seconds"] for r in train["runs"])
    bench = json.loads((results / "figures-bench/trainer_step_real_cpu.json").read_text())
    ph = bench["summary"]["float32:16x32"]["gmpo"]["cpu"]["phases_median_s"]
    run_1u = compare_1u + evaluation / 2
    share = (ph["scoring"] + 3 * ph["optimizer"]) / (
        ph["scoring"] + ph["forward"] + ph["backward"] + ph["optimizer"]
    )
    run_4u = run_1u + (train_2u - run_1u) * share
    timing = json.loads((results / "updates/timing.json").read_text())
    return {"compare_1u": compare_1u, "eval": evaluation, "train_2u": train_2u, "phases": ph,
            "share": share, "run_1u": run_1u, "run_4u": run_4u,
            "tiny": tiny_estimate(timing)}  # fmt: skip


def tiny_estimate(timing: dict[str, Any]) -> dict[str, float]:
    """chain_sum's pilot (the ladder, the extension at its most) and grid for two losses, from
    the regime study's timing (``results/updates/timing.json``): each regime's CPU seconds per
    run times the mean of the two losses' relative cost (``dapo_trl`` at ``grpo``'s), a warm
    start per seed, wall-clock at the measured CPU seconds per second."""
    rows = [r for r in timing["runs"] if r["task"] == "chain_sum"]
    ratio = timing["loss_cost"]["chain_sum"]
    cost = statistics.fmean((ratio["gmpo"], ratio["grpo"]))
    per_run = sum(r["run_cpu_s"] for r in rows if r["updates"] in TINY_REGIMES) * cost
    warm = statistics.fmean(r["warm_cpu_s"] for r in rows)
    runs = len(LOSSES) * len(TINY_REGIMES) * (
        len(TINY_LADDER) * len(TINY_PILOT_SEEDS) + 2 * TINY_EXTEND * len(TINY_PILOT_SEEDS)
        + len(TINY_GRID_SEEDS))  # fmt: skip
    cpu = (
        len(LOSSES)
        * ((len(TINY_LADDER) + 2 * TINY_EXTEND) * len(TINY_PILOT_SEEDS) + len(TINY_GRID_SEEDS))
        * per_run
        + (len(TINY_PILOT_SEEDS) + len(TINY_GRID_SEEDS)) * warm
    )
    return {"runs": runs, "cpu_s": cpu, "wall_s": cpu / timing["throughput"]["cpu_per_wall"]}


def estimate(m: dict[str, Any], pilot_wall: list[float] | None = None) -> list[dict[str, Any]]:
    """Each part of :data:`PARTS`: its runs and estimated wall-clock seconds. With
    ``pilot_wall`` (the pilot's finished runs' wall-clock), a 4-update run costs their mean and
    a 1-update run that times ``run_1u / run_4u``."""
    run_4u, run_1u = m["run_4u"], m["run_1u"]
    if pilot_wall:
        run_4u = statistics.fmean(pilot_wall)
        run_1u = run_4u * m["run_1u"] / m["run_4u"]
    pilot = len(LOSSES) * (len(LADDER) + EXTEND) * len(PILOT_SEEDS)
    grid = len(LOSSES) * len(GRID_SEEDS)
    return [
        {"part": PARTS[0], "runs": pilot, "wall_s": pilot * run_4u},
        {"part": PARTS[1], "runs": grid, "wall_s": grid * run_4u},
        {"part": PARTS[2], "runs": m["tiny"]["runs"], "wall_s": m["tiny"]["wall_s"]},
        {"part": PARTS[3], "runs": grid, "wall_s": grid * run_1u, "per_seed_s": 2 * run_1u},
    ]


def decide(spent_s: float, parts: list[dict[str, Any]], budget_h: float = BUDGET_H) -> list[str]:
    """The rule, forecast from now: each part's verdict when the time spent so far is
    ``spent_s`` and the parts not yet run take their estimates, in order."""
    total, out, dropped = spent_s, [], False
    for i, p in enumerate(parts):
        if i < NEVER_DROPPED:
            total += p["wall_s"]
            out.append("never dropped (the plan)")
        elif dropped:
            out.append("dropped, as an earlier part was")
        elif "per_seed_s" in p:
            fit = max(0, min(len(GRID_SEEDS), int((budget_h * 3600 - total) // p["per_seed_s"])))
            total += fit * p["per_seed_s"]
            out.append(f"{fit} of {len(GRID_SEEDS)} seeds fit")
        elif total + p["wall_s"] <= budget_h * 3600:
            total += p["wall_s"]
            out.append("fits")
        else:
            dropped = True
            out.append("does not fit: dropped, with every later part")
    return out


def fits(spent_s: float, cost_s: float, budget_h: float = BUDGET_H) -> bool:
    """Whether a part (or an arm's seed) of estimated ``cost_s`` may start after ``spent_s``."""
    return spent_s + cost_s <= budget_h * 3600


def table(parts: list[dict[str, Any]], spent_s: float = 0.0) -> list[str]:
    """Markdown: each part, its runs, its estimate, the running total and the rule's verdict."""
    lines = ["| part, in the order it runs | runs | wall-clock h | cumulative h | rule |",
             "|---|---:|---:|---:|---|"]  # fmt: skip
    total = spent_s
    for p, v in zip(parts, decide(spent_s, parts), strict=True):
        total += p["wall_s"]
        lines.append(f"| {p['part']} | {p['runs']} | {p['wall_s'] / 3600:.2f} | "
                     f"{total / 3600:.2f} | {v} |")  # fmt: skip
    return lines
