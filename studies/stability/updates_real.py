"""The regime study's real-model cross-check (docs/regime_plan.md, its erratum of 2026-12-04):
GMPO against TRL's default loss (``dapo_trl``) through ``gmpo compare`` on SmolLM2-135M-Instruct
(``--task chat_chain_sum``), seeds 6100 to 6102, at 1 update per generation batch and at the
regime u* where the primary table's mean difference against ``dapo_trl``, averaged over the two
primary tasks, is largest (the larger number of updates on a tie). Descriptive: three seeds, no
test.

    python -m studies.stability.updates real            # run what is left, then the report
    python -m studies.stability.updates real --dry-run  # print the commands only

A seed is one ``gmpo compare`` (its outputs in ``runs/updates/real/u<u>/seed<S>``); one whose
``summary.json`` exists is not run again. Each finished command appends its wall-clock to
``runs/updates/real/wall.tsv``; a seed starts only if the wall-clock so far plus the longest
seed so far fits in :data:`BUDGET_H` hours, else it is recorded as not run. The report copies
each seed's ``summary.md`` and ``summary.json`` and the wall-clock into
``results/updates/real/`` and writes ``real.md`` and ``real.json`` there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from studies.stability.updates_analysis import group_name
from studies.stability.updates_plan import CROSS_CHECK_SEEDS, TASKS, regime_name
from studies.stability.which_loss import GMPO

TASK = "chat_chain_sum"
AGAINST = "dapo_trl"
#: updates per generation batch -> ``gmpo compare`` flags on top of the task's (the erratum's
#: table: minibatches x epochs of the generation batch of 16 completions)
FLAGS: dict[int, str] = {
    1: "--num_iterations 1 --max_steps 20",
    2: "--per_device_train_batch_size 8 --steps_per_generation 2 --num_iterations 1 --max_steps 40",
    4: "--per_device_train_batch_size 4 --steps_per_generation 4 --num_iterations 1 --max_steps 80",
    16: "--per_device_train_batch_size 2 --steps_per_generation 8 --num_iterations 2 "
    "--max_steps 320",
}
#: the cross-check's wall-clock budget, hours
BUDGET_H = 3.5
#: the labels ``gmpo compare`` gives the two losses in its summary.json
GMPO_LABEL, AGAINST_LABEL = "GMPO", "DAPO_TRL"
#: wall.tsv's columns (one finished command a line; "not run" lines carry no times)
WALL_COLUMNS = ("regime", "seed", "rc", "start", "end", "seconds")


def against_rows(primary: dict[str, Any], u: int) -> list[dict[str, Any]]:
    """The primary table's rows of GMPO against ``dapo_trl`` at ``u`` updates, one per task."""
    return [primary[f"{group_name(t, u)}: {GMPO} vs {AGAINST}"] for t in TASKS]


def averaged_differences(primary: dict[str, Any]) -> dict[int, float]:
    """Per regime: the primary table's mean difference, GMPO minus ``dapo_trl``, averaged over
    the primary tasks' rows."""
    return {u: statistics.fmean(r["mean_diff"] for r in against_rows(primary, u)) for u in FLAGS}


def u_star(primary: dict[str, Any]) -> int:
    """The regime of the largest averaged difference; the larger number of updates on a tie."""
    diffs = averaged_differences(primary)
    return max(diffs, key=lambda u: (diffs[u], u))


def regimes(primary: dict[str, Any]) -> list[int]:
    """1 update, then u* where it is not 1."""
    u = u_star(primary)
    return [1] if u == 1 else [1, u]


def argv(u: int, seed: int, runs: Path) -> list[str]:
    """The erratum's command of one seed and regime (without the executable)."""
    return ["compare", "--task", TASK, "--against", AGAINST, "--seed", str(seed), "--seeds", "1",
            *shlex.split(FLAGS[u]), "--output_dir", str(runs / regime_name(u) / f"seed{seed}")]  # fmt: skip


def read_wall(path: Path) -> list[dict[str, Any]]:
    """wall.tsv's finished commands, as dicts of :data:`WALL_COLUMNS` (other lines skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        cells = line.split("\t")
        if len(cells) == len(WALL_COLUMNS):
            row = dict(zip(WALL_COLUMNS, cells, strict=True))
            rows.append({**row, "seed": int(row["seed"]), "rc": int(row["rc"]),
                         "seconds": int(row["seconds"])})  # fmt: skip
    return rows


def fits(wall: list[dict[str, Any]], budget_h: float = BUDGET_H) -> bool:
    """The plan's rule: the wall-clock so far plus the longest seed so far fits the budget."""
    spent = sum(r["seconds"] for r in wall)
    longest = max((r["seconds"] for r in wall), default=0)
    return spent + longest <= budget_h * 3600


def real(args: argparse.Namespace) -> int:
    """Run the cross-check's seeds that are left (1 update first, then u*), then the report."""
    primary = json.loads((args.results / "updates.json").read_text())["primary"]
    runs, gmpo = args.runs / "real", args.gmpo
    wall_path = runs / "wall.tsv"
    for u in regimes(primary):
        for seed in CROSS_CHECK_SEEDS:
            out = runs / regime_name(u) / f"seed{seed}"
            if (out / "summary.json").exists():
                continue
            command = [gmpo, *argv(u, seed, runs)]
            print(shlex.join(command), flush=True)
            if args.dry_run:
                continue
            runs.mkdir(parents=True, exist_ok=True)
            if not fits(read_wall(wall_path)):
                with wall_path.open("a") as f:
                    f.write(f"{regime_name(u)}\t{seed}\tnot run (budget)\n")
                continue
            start, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.monotonic()
            with (runs / f"{regime_name(u)}_seed{seed}.log").open("w") as log:
                rc = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            with wall_path.open("a") as f:
                f.write(f"{regime_name(u)}\t{seed}\t{rc}\t{start}\t{end}\t"
                        f"{round(time.monotonic() - t0)}\n")  # fmt: skip
    return 0 if args.dry_run else report(args.runs / "real", args.results / "real", primary)


def _seed_row(summary: dict[str, Any], seed: int) -> dict[str, Any]:
    """One seed's figures from its ``gmpo compare`` summary.json."""
    row: dict[str, Any] = {"seed": seed}
    for label, key in ((GMPO_LABEL, "gmpo"), (AGAINST_LABEL, AGAINST)):
        run = summary["runs"][label][0]
        row[f"{key}_final"] = summary["outcomes"][label][0]["final"]
        for what in ("reward", "right"):
            row[f"{key}_held_out_{what}_after"] = run[f"held_out_{what}_after"]
            if key == "gmpo":  # the same prompts and draws before training: one number
                row[f"held_out_{what}_before"] = run[f"held_out_{what}_before"]
    for diff, key in (("final", "final"), ("held_out_reward", "held_out_reward_after"),
                      ("held_out_right", "held_out_right_after")):  # fmt: skip
        row[f"diff_{diff}"] = row[f"gmpo_{key}"] - row[f"{AGAINST}_{key}"]
    return row


def _direction(x: float) -> str:
    return "GMPO higher" if x > 0 else "GMPO lower" if x < 0 else "equal"


def report(runs: Path, results: Path, primary: dict[str, Any]) -> int:
    """Copy each seed's summary and the wall-clock into ``results``; write real.md/real.json."""
    wall = read_wall(runs / "wall.tsv")
    results.mkdir(parents=True, exist_ok=True)
    if (runs / "wall.tsv").exists():
        shutil.copy(runs / "wall.tsv", results / "wall.tsv")
    data: dict[str, Any] = {"task": TASK, "against": AGAINST, "regimes": {},
                            "averaged_primary": {str(u): d for u, d in
                                                 averaged_differences(primary).items()}}  # fmt: skip
    lines = [
        f"# The real-model cross-check: GMPO against `{AGAINST}` on `{TASK}`",
        "",
        "SmolLM2-135M-Instruct, `gmpo compare` (docs/regime_plan.md, erratum of 2026-12-04). "
        "Final reward: `gmpo compare`'s, the mean of the last 20 logged training rewards (at 20 "
        "generation batches, all of them). Held-out: the mean reward of 32 held-out prompts x 4 "
        "samples after training (the same prompts and draws for every seed: the untrained "
        "model's is one number); right: the share of those completions with reward 1. "
        "Differences: GMPO minus "
        f"`{AGAINST}`. Descriptive: three seeds, no test.",
    ]
    for u in regimes(primary):
        rows = []
        for seed in CROSS_CHECK_SEEDS:
            src = runs / regime_name(u) / f"seed{seed}"
            if not (src / "summary.json").exists():
                continue
            dst = results / regime_name(u) / f"seed{seed}"
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("summary.md", "summary.json"):
                shutil.copy(src / name, dst / name)
            row = _seed_row(json.loads((src / "summary.json").read_text()), seed)
            w = [r for r in wall if r["regime"] == regime_name(u) and r["seed"] == seed]
            row["wall_s"] = w[-1]["seconds"] if w else None
            rows.append(row)
        not_run = [s for s in CROSS_CHECK_SEEDS if s not in {r["seed"] for r in rows}]
        lines += _table(u, rows, not_run, primary)
        data["regimes"][regime_name(u)] = {"seeds": rows, "not_run": not_run}
    (results / "real.md").write_text("\n".join(lines) + "\n")
    (results / "real.json").write_text(json.dumps(data, indent=1) + "\n")
    print("\n".join(lines))
    return 0


def _table(
    u: int, rows: list[dict[str, Any]], not_run: list[int], primary: dict[str, Any]
) -> list[str]:
    """Markdown: one regime's seeds, their means, and the primary table's direction beside."""
    out = ["", f"## {group_name(TASK, u)} per generation batch", "",
           f"| seed | GMPO final | {AGAINST} final | difference | GMPO held-out after (right) | "
           f"{AGAINST} held-out after (right) | difference (right) | held-out before (right) | "
           "wall s |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        out.append(
            f"| {r['seed']} | {r['gmpo_final']:.3f} | {r[f'{AGAINST}_final']:.3f} | "
            f"{r['diff_final']:+.3f} | {r['gmpo_held_out_reward_after']:.3f} "
            f"({r['gmpo_held_out_right_after']:.3f}) | {r[f'{AGAINST}_held_out_reward_after']:.3f} "
            f"({r[f'{AGAINST}_held_out_right_after']:.3f}) | {r['diff_held_out_reward']:+.3f} "
            f"({r['diff_held_out_right']:+.3f}) | {r['held_out_reward_before']:.3f} "
            f"({r['held_out_right_before']:.3f}) | {r['wall_s']} |"
        )
    if rows:
        mean = {k: statistics.fmean(r[k] for r in rows)
                for k in ("diff_final", "diff_held_out_reward", "diff_held_out_right")}  # fmt: skip
        higher = {k: sum(r[k] > 0 for r in rows) for k in ("diff_final", "diff_held_out_reward")}
        wall = sum(r["wall_s"] or 0 for r in rows)
        out += ["", f"Mean difference over {len(rows)} seeds: final {mean['diff_final']:+.4f} "
                f"({_direction(mean['diff_final'])}), held-out {mean['diff_held_out_reward']:+.4f} "
                f"({_direction(mean['diff_held_out_reward'])}), held-out right "
                f"{mean['diff_held_out_right']:+.4f}. GMPO higher on {higher['diff_final']} of "
                f"{len(rows)} seeds (final), {higher['diff_held_out_reward']} of {len(rows)} "
                f"(held-out). Wall-clock {wall} s ({wall / 60:.1f} min)."]  # fmt: skip
    out += ["", "The primary table at the same regime (tiny models): " + "; ".join(
        f"{t} {p['mean_diff']:+.4f} ({_direction(p['mean_diff'])}, verdict {p['verdict']})"
        for t, p in zip(TASKS, against_rows(primary, u), strict=True)) + "."]  # fmt: skip
    if not_run:
        out += [
            "",
            "Not run (the budget, or not finished): seeds " + ", ".join(map(str, not_run)) + ".",
        ]
    return out
