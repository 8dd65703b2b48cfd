"""The regime study's planned analysis (docs/regime_plan.md; ``python -m
studies.stability.updates analysis``): GMPO against each other loss per task and regime, each
loss at its own rate, the seed as the unit, Holm over each family, each row's verdict and the
plan's answer, the sanity row at 1 update, and the secondary families."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from gmpo_stats.paired import holm
from studies.stability.updates_plan import (
    EXTRA_TASK,
    LOSSES,
    REGIMES,
    TASKS,
    USERS,
    copy_summaries,
    has_records,
    records_of,
    regime_name,
)
from studies.stability.which_loss import GMPO, _test_rows, compare

ALPHA = 0.05
#: "GMPO helps": the mean difference in final reward at least this, beside significance
MIN_EFFECT = 0.02
#: "the same": the whole 95 % interval of the mean difference within +- this
SAME = 0.05


def verdict(t: dict[str, Any]) -> str:
    """The plan's reading of one row (GMPO minus the other on the final reward):

    - ``helps``: Holm-adjusted p < :data:`ALPHA`, GMPO higher on more seeds, the interval above
      0 and the mean difference at least :data:`MIN_EFFECT`;
    - ``hurts``: the same in the other's favour;
    - ``same``: the whole interval within +- :data:`SAME` and no significant difference;
    - ``inconclusive``: anything else."""
    lo, hi = t["ci"]
    significant = t["holm"] < ALPHA
    if significant and t["wins"] > t["losses"] and lo > 0 and t["mean_diff"] >= MIN_EFFECT:
        return "helps"
    if significant and t["losses"] > t["wins"] and hi < 0 and t["mean_diff"] <= -MIN_EFFECT:
        return "hurts"
    if not significant and -SAME <= lo and hi <= SAME:
        return "same"
    return "inconclusive"


def primary_cells(records: list[dict[str, Any]], rates: dict[str, float]) -> list[Any]:
    """The records of each loss at its own rate (the primary cells), as one cell: ``lr`` 0
    for all, so that a seed's runs pair across losses (``own_lr``: the rate it ran at)."""
    return [{**r, "lr": 0.0, "own_lr": r["lr"]} for r in records
            if r["lr"] == rates.get(r["variant"])]  # fmt: skip


def family_of(
    groups: dict[str, list[dict[str, Any]]], key: str, sign: int
) -> dict[str, dict[str, Any]]:
    """GMPO against each other loss in each group (task and regime) on ``key``, Holm over all."""
    tests: dict[str, dict[str, Any]] = {}
    for group, records in groups.items():
        for other in [v for v in LOSSES if v != GMPO and any(r["variant"] == v for r in records)]:
            tests[f"{group}: {GMPO} vs {other}"] = {"group": group, "other": other,
                                                    **compare(records, other, key, sign)}  # fmt: skip
    for t, adj in zip(tests.values(), holm([t["p"] for t in tests.values()]), strict=True):
        t["holm"] = adj
    for name, t in tests.items():
        t["name"] = name
    return tests


def groups_of(
    by_dir: dict[tuple[str, int], list[dict[str, Any]]], outcome: dict[str, Any],
    tasks: tuple[str, ...], scale: float = 1.0,
) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    """Per task and regime (``"reverse, 4 updates"``): the records of each loss at ``scale``
    times its pilot rate."""
    out = {}
    for (task, u), records in by_dir.items():
        if task not in tasks:
            continue
        rates = outcome["tasks"][task][regime_name(u)]["rates"]
        out[group_name(task, u)] = primary_cells(records, {v: scale * r for v, r in rates.items()})
    return out


def group_name(task: str, updates: int) -> str:
    return f"{task}, {updates} update{'s' * (updates != 1)}"


def sanity(by_dir: dict[tuple[str, int], list[dict[str, Any]]], outcome: dict[str, Any]) -> Any:
    """At 1 update, per task: ``gmpo`` against ``grpo`` at ``gmpo``'s rate, and whether it
    passes (no significant difference, unadjusted, and the interval within +- :data:`SAME`),
    with the seeds whose two final rewards are equal."""
    out = {}
    for (task, u), records in by_dir.items():
        if u != 1:
            continue
        rate = outcome["tasks"][task][regime_name(u)]["rates"][GMPO]
        rs = [r for r in records if r["lr"] == rate and r["variant"] in (GMPO, "grpo")]
        t = compare(rs, "grpo", "final_reward")
        final = {(r["variant"], r["seed"]): r["final_reward"] for r in rs}
        equal = sum(final[(GMPO, s)] == final.get(("grpo", s)) for v, s in final if v == GMPO)
        passed = t["p"] >= ALPHA and -SAME <= t["ci"][0] and t["ci"][1] <= SAME
        out[task] = {**t, "rate": rate, "equal_seeds": equal, "passed": passed}
    return out


def headline(primary: dict[str, dict[str, Any]], tasks: tuple[str, ...]) -> str:
    """The plan's answer, from the primary rows' verdicts (:func:`verdict`)."""
    users = {n: t for n, t in primary.items() if _updates(t["group"]) in USERS}
    hurts = [n for n, t in users.items() if t["verdict"] == "hurts"]
    helps = [n for n, t in users.items() if t["verdict"] == "helps"]
    default = [any(t["verdict"] == "helps" and t["other"] == "dapo_trl"
                   and t["group"].startswith(f"{task},") for t in users.values())
               for task in tasks]  # fmt: skip
    far = [n for n, t in primary.items() if _updates(t["group"]) == 16 and t["verdict"] == "helps"]
    if helps and not hurts and all(default):
        return "GMPO helps at the settings users run"
    if helps and hurts:
        return "mixed: GMPO helps in some rows of the users' regimes and hurts in others"
    if helps:
        return "GMPO helps in some rows of the users' regimes, not against TRL's default loss on every task"
    if hurts:
        return "no evidence that GMPO helps at the settings users run; it hurts in some rows"
    if far:
        return "no evidence that GMPO helps at the settings users run; it helps only at 16 updates"
    return "no evidence that GMPO helps at the settings users run"


def _updates(group: str) -> int:
    return int(group.split(", ")[1].split()[0])


def analyze(results: Path, tasks: tuple[str, ...] = TASKS) -> tuple[dict[str, Any], list[str]]:
    """The plan's tests and tables over ``results``' grid folders: ``(json, markdown lines)``."""
    outcome = json.loads((results / "pilot" / "pilot.json").read_text())
    by_dir = {(t, u): records_of(results / t / regime_name(u)) for t in (*TASKS, EXTRA_TASK)
              for u in REGIMES if has_records(results / t / regime_name(u))}  # fmt: skip
    tasks = tuple(t for t in tasks if any(k[0] == t for k in by_dir))
    groups = groups_of(by_dir, outcome, tasks)
    primary = family_of(groups, "final_reward", +1)
    for t in primary.values():
        t["verdict"] = verdict(t)
    out: dict[str, Any] = {"primary": primary, "headline": headline(primary, tasks),
                           "sanity": sanity(by_dir, outcome), "means": means_of(groups)}  # fmt: skip
    for name, key, sign in (("failures", "failed", -1), ("spread", "spread_all", -1),
                            ("entropy", "entropy_all", +1), ("length", "length_all", +1)):  # fmt: skip
        out[name] = family_of(groups, key, sign)
    out["verdicts"] = verdict_counts(primary)
    out["ceiling"] = ceiling(results, out["means"], tasks)
    out["pilot_spread"] = pilot_spread(results, tasks)
    if any(t == EXTRA_TASK for t, _ in by_dir):
        extra = family_of(groups_of(by_dir, outcome, (EXTRA_TASK,)), "final_reward", +1)
        for t in extra.values():
            t["verdict"] = verdict(t)
        out["chain_sum"] = extra
    robust = {
        g: rs
        for g, rs in groups_of(by_dir, outcome, tasks, scale=2.0).items()
        if {r["variant"] for r in rs} == set(LOSSES)
    }  # every loss ran at twice its rate
    if robust:
        out["robustness"] = family_of(robust, "final_reward", +1)
    return out, report(out)


def verdict_counts(tests: dict[str, dict[str, Any]]) -> dict[str, int]:
    """How many rows of a family have each verdict (the counts the pages write in words)."""
    return {v: sum(t["verdict"] == v for t in tests.values())
            for v in ("same", "inconclusive", "helps", "hurts")}  # fmt: skip


def ceiling(
    results: Path, means: dict[str, dict[str, Any]], tasks: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """Per task: the smallest mean final reward with which GMPO could have been *helps* against
    TRL's default loss (``dapo_trl``'s mean plus :data:`MIN_EFFECT`, in the users' regime where
    that is lowest), against the best final reward of any single run, pilot and grid, any loss
    and rate (the reward is at most 1)."""
    out = {}
    for task in tasks:
        need = min(means[group_name(task, u)]["dapo_trl"]["mean"] + MIN_EFFECT for u in USERS
                   if group_name(task, u) in means)  # fmt: skip
        runs = [r for base in (results, results / "pilot") for u in REGIMES
                if has_records(base / task / regime_name(u))
                for r in records_of(base / task / regime_name(u))]  # fmt: skip
        out[task] = {"helps_needs": need, "runs": len(runs),
                     "best_run": max(r["final_reward"] for r in runs)}  # fmt: skip
    return out


def pilot_spread(results: Path, tasks: tuple[str, ...], updates: int = 16) -> dict[str, Any]:
    """Exploratory (not in the plan): the pilot's token log-ratio spread at ``updates``, each
    loss at the same rate, the mean over the pilot seeds, per task and rate. The primary cells
    compare each loss at its own rate, so their spread mixes the loss with the rate."""
    out: dict[str, Any] = {}
    for task in tasks:
        d = results / "pilot" / task / regime_name(updates)
        if not has_records(d):
            continue
        records = records_of(d)
        for lr in sorted({r["lr"] for r in records}):
            row = {v: statistics.fmean(xs) for v in LOSSES
                   if (xs := [r["spread_all"] for r in records
                              if r["variant"] == v and r["lr"] == lr])}  # fmt: skip
            out.setdefault(task, {})[f"{lr:g}"] = row
    return out


def means_of(groups: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per group (task and regime) and loss at its own rate: the rate, the seeds, the mean and
    the standard deviation of the final reward over the seeds, and the failed runs."""
    out: dict[str, dict[str, Any]] = {}
    for group, records in groups.items():
        for v in LOSSES:
            runs = [r for r in records if r["variant"] == v]
            xs = [r["final_reward"] for r in runs]
            if xs:
                out.setdefault(group, {})[v] = {
                    "rate": runs[0]["own_lr"], "seeds": len(xs), "mean": statistics.fmean(xs),
                    "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                    "failed": sum(r["failed"] for r in runs),
                }  # fmt: skip
    return out


def means_table(means: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown: a row per task and regime, a column per loss: the mean final reward over the
    seeds ± its standard deviation, the failed runs, and the loss's own rate."""
    lines = ["| task, regime | " + " | ".join(LOSSES) + " |", "|---|" + "---:|" * len(LOSSES)]
    for group, by_loss in means.items():
        cells = [
            "—" if v not in by_loss else
            f"{by_loss[v]['mean']:.3f} ± {by_loss[v]['sd']:.3f}, {by_loss[v]['failed']} failed, "
            f"lr {by_loss[v]['rate']:g}"
            for v in LOSSES
        ]  # fmt: skip
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return lines


def report(out: dict[str, Any]) -> list[str]:
    lines = ["## The answer", "", f"**{out['headline']}** (the plan's definition).", "",
             "## Each loss's mean final reward, task by regime", "",
             "Each loss at its own rate (the pilot's); the mean over the grid seeds ± its "
             "standard deviation, and the failed runs (descriptive; the tests follow).", "",
             *means_table(out["means"]), "",
             "## Primary: final reward, each loss at its own rate", "",
             "GMPO minus the other, the seed as the unit; two-sided exact sign test, Holm over "
             "every row; verdict by the plan's rule.", "", *verdict_table(out["primary"]), "",
             "## Sanity row: 1 update, gmpo against grpo at gmpo's rate", "",
             "| task | rate | seeds | GMPO higher | GMPO worse | equal | mean difference "
             "(95 % CI) | p | passed |", "|---|---:|---:|---:|---:|---:|---|---:|---|"]  # fmt: skip
    for task, t in out["sanity"].items():
        lines.append(f"| {task} | {t['rate']:g} | {t['seeds']} | {t['wins']} | {t['losses']} | "
                     f"{t['equal_seeds']} | {t['mean_diff']:.3f} [{t['ci'][0]:.3f}, "
                     f"{t['ci'][1]:.3f}] | {t['p']:.4f} | {'yes' if t['passed'] else 'NO'} |")  # fmt: skip
    for name, title, better in (("failures", "each seed's failed run", "fails less"),
                                ("spread", "the token log-ratio spread", "narrower"),
                                ("entropy", "the policy's entropy", "higher"),
                                ("length", "the completions' length", "longer")):  # fmt: skip
        lines += ["", f"## Secondary: {title}", "", *_test_rows(out[name], better)]
    lines += ["", "## Counts of the primary rows' verdicts", "",
              ", ".join(f"{n} {v}" for v, n in out["verdicts"].items()) + f" of {len(out['primary'])}.",
              "", "## The ceiling: what *helps* needed, against the best single run", "",
              "| task | GMPO's mean final reward needed for helps against dapo_trl (1, 2 or 4 "
              "updates) | runs (pilot and grid) | best single run's final reward |",
              "|---|---:|---:|---:|"]  # fmt: skip
    for task, c in out["ceiling"].items():
        lines.append(f"| {task} | {c['helps_needs']:.3f} | {c['runs']} | {c['best_run']:.4f} |")
    lines += ["", "## Exploratory: the pilot's spread at 16 updates, each loss at the same rate",
              "", "Not in the plan: the mean token log-ratio spread over the pilot seeds; the "
              "primary cells run each loss at its own rate, so their spread mixes loss and rate.",
              "", "| task | rate | " + " | ".join(LOSSES) + " |",
              "|---|---:|" + "---:|" * len(LOSSES)]  # fmt: skip
    for task, by_lr in out["pilot_spread"].items():
        for lr, row in by_lr.items():
            cells = [f"{row[v]:.3f}" if v in row else "—" for v in LOSSES]
            lines.append(f"| {task} | {lr} | " + " | ".join(cells) + " |")
    if "chain_sum" in out:
        lines += ["", "## chain_sum (run after the primary tasks; its own family)", "",
                  *verdict_table(out["chain_sum"])]  # fmt: skip
    if "robustness" in out:
        lines += ["", "## Secondary: each loss at twice its rate", "",
                  *_test_rows(out["robustness"], "higher")]  # fmt: skip
    return lines


def verdict_table(tests: dict[str, dict[str, Any]]) -> list[str]:
    rows = _test_rows(tests, "higher")
    rows[0] += " verdict |"
    rows[1] += "---|"
    return rows[:2] + [f"{row} {t['verdict']} |" for row, t in zip(rows[2:], tests.values(),
                                                                  strict=True)]  # fmt: skip


def analysis(args: argparse.Namespace) -> int:
    for task in (*args.tasks, EXTRA_TASK):
        for u in REGIMES:
            src = args.runs / task / regime_name(u)
            if has_records(src):
                copy_summaries(src, args.results / task / regime_name(u))
    out, lines = analyze(args.results, tuple(args.tasks))
    head = ["# The regime study's planned analysis", "",
            f"Command: `python -m studies.stability.updates analysis --runs {args.runs} "
            f"--results {args.results}`", ""]  # fmt: skip
    (args.results / "updates.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.results / "updates.md").write_text("\n".join(head + lines) + "\n")
    print("\n".join(head + lines))
    return 0
