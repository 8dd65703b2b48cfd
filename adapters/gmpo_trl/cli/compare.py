"""``gmpo compare``: GMPO and the losses of ``--against`` (TRL's own ``GRPOTrainer`` with each one's
``loss_type``, :mod:`gmpo_trl.cli.comparators`; by default GRPO, ratio clip 1 ± grpo_epsilon) on
the same task, model and seeds, with a plot and a table of the token log-ratio range and the
reward; with other losses than GRPO alone, each one's wins and losses against GMPO on the same
seeds, with a sign test, and its failed runs.

Every config comes from one parse, in one plan (:func:`~gmpo_trl.cli.runs.build_plan`): GMPO's
is ``GMPOConfig`` of the user's values; each other's is ``GRPOConfig`` of the same values (its
own fields only, so GMPO-only options such as ``gmpo_impl`` do not reach it, and its defaults are
GRPOConfig's) with its loss settings forced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gmpo_stats.outcome import DROP, WINDOW
from gmpo_trl.cli.arguments import CompareArguments
from gmpo_trl.cli.base import Command
from gmpo_trl.cli.checks import check_against, check_grpo_epsilon, check_seeds
from gmpo_trl.cli.comparators import COMPARATORS, DEFAULT_AGAINST
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.cli.plots import log_clip_range, plot_compare
from gmpo_trl.cli.reports import JUDGED_FROM, REWARDS, against_table, compare_table, outcome
from gmpo_trl.cli.runs import Parsed, Plan, build_plan, interruptible, run, stop_if_interrupted


def compare_plan(parsed: Parsed) -> Plan:
    """The plan of a parsed ``gmpo compare`` command line, its comparators' configs in it."""
    script = parsed.script
    if script.seeds < 1:
        raise CLIError(f"--seeds must be at least 1, got {script.seeds}")
    from gmpo_trl import GMPOConfig

    first = {"seed": GMPOConfig.seed, **parsed.defaults, **parsed.values}["seed"]
    check_seeds(first, script.seeds)  # every seed, before any run
    if parsed.values.get("resume_from_checkpoint") not in (None, False, "false", "False"):
        raise CLIError(
            "--resume_from_checkpoint: gmpo compare does not resume (it trains a run per method "
            "and seed); resume one run with gmpo train --resume_from_checkpoint"
        )
    names = check_against(script.against, "grpo_epsilon" in parsed.set_by_user)
    epsilon = check_grpo_epsilon(script.grpo_epsilon)
    forced = {name: dict(COMPARATORS[name].settings) for name in names}
    if "grpo" in forced:
        forced["grpo"]["epsilon"] = epsilon
    return build_plan(parsed, resumable=False, comparators=forced)


def configs(parsed: Parsed) -> tuple[Any, Any]:
    """``(GRPOConfig of the first --against loss, GMPOConfig)`` of a parsed ``gmpo compare``
    command line (by default GRPO's)."""
    plan = compare_plan(parsed)
    return next(iter(plan.comparators.values())), plan.config


def gmpo_settings(config: Any, variant: Any) -> str:
    """What ran as GMPO: its log-space clip, or the loss variant (``loss_variant``) by name and
    label."""
    from gmpo_core.options import upper

    if variant is None:
        return f"log-space clip [-{config.epsilon}, {upper(config.epsilon, config.epsilon_high)}]"
    return f"loss variant {config.loss_variant!r} ({variant.label})"


def what_ran(script: Any) -> str:
    """The prompts, reward and model the runs trained on: the user's (``--dataset``,
    ``--reward``, ``--model``), else the built-in task's."""
    if script.dataset is None and not script.reward and script.model is None:
        return f"task {script.task}"
    task = f"the {script.task} task's"
    prompts = f"{task} prompts"
    if script.dataset is not None:
        prompts = f"dataset {script.dataset} (split {script.dataset_split})"
    reward = f"reward {', '.join(script.reward)}" if script.reward else f"{task} reward"
    model = f"{task} model" if script.model is None else f"model {script.model}"
    return f"{prompts}, {reward}, {model}"


def _forced(name: str, config: Any) -> str:
    """The loss settings a comparator ran with, read back from its config."""
    return ", ".join(f"{k}={getattr(config, k)!r}" for k in COMPARATORS[name].settings)


class CompareCommand(Command):
    name = "compare"
    description = (
        "Train GMPO and the losses of --against (TRL's GRPOTrainer; default GRPO, ratio clip "
        "1 ± grpo_epsilon) on the same task and seeds; plot and summarize the token log-ratio "
        "range and the reward."
    )
    arguments = CompareArguments

    def run(self, parsed: Parsed) -> Path:
        """Each --against loss, then GMPO, on each seed; returns the output directory."""
        import gmpo_trl

        plan = compare_plan(parsed)
        # the trainers after the checks: importing them imports vLLM where installed (10-20 s)
        from gmpo_trl.grpo_range import RangeLoggingGRPOTrainer

        script, gmpo_config = plan.script, plan.config
        base = Path(gmpo_config.output_dir)
        first_seed = gmpo_config.seed
        methods = {COMPARATORS[n].label: c for n, c in plan.comparators.items()}
        methods["GMPO"] = gmpo_config
        runs: dict[str, list[list[dict[str, Any]]]] = {label: [] for label in methods}
        summaries: dict[str, list[dict[str, Any]]] = {label: [] for label in methods}
        outcomes: dict[str, list[dict[str, Any]]] = {label: [] for label in methods}
        bounds = {label: log_clip_range(c, plan.variant if c is gmpo_config else None)
                  for label, c in methods.items()}  # fmt: skip
        variant = gmpo_config.loss_variant
        for k in range(script.seeds):
            seed = first_seed + k
            for label, config in methods.items():
                cls = gmpo_trl.GMPOTrainer if label == "GMPO" else RangeLoggingGRPOTrainer
                config.seed = seed
                config.output_dir = str(base / label.lower() / f"seed{seed}")
                what = label if label != "GMPO" or variant is None else f"GMPO variant {variant}"
                done = run(plan, config, interruptible(cls), f"gmpo compare ({what}, seed {seed})")
                stop_if_interrupted(done, config.output_dir)  # its run's outputs; no table
                runs[label].append(done.rows)
                summaries[label].append(done.summary)
                outcomes[label].append({"seed": seed, **outcome(done.rows)})
        plot_compare(runs, base / "compare.png", bounds)
        report = _report(plan, summaries, outcomes, first_seed)
        (base / "summary.md").write_text(report["markdown"])
        (base / "summary.json").write_text(json.dumps(report["json"], indent=1) + "\n")
        print(f"\n{report['markdown']}")
        print(f"gmpo compare: plot in {base / 'compare.png'}, table in {base / 'summary.md'}")
        return base


def _report(
    plan: Plan,
    summaries: dict[str, list[dict[str, Any]]],
    outcomes: dict[str, list[dict[str, Any]]],
    first_seed: int,
) -> dict[str, Any]:
    """``summary.md`` (also printed) and ``summary.json``: the settings, the table of each
    method's summaries and, with other losses than GRPO alone, the table against GMPO."""
    script, gmpo = plan.script, plan.config
    gmpo_side = gmpo_settings(gmpo, plan.variant)
    run_settings = (
        f"num_iterations={gmpo.num_iterations}, steps_per_generation={gmpo.steps_per_generation}, "
        f"max_steps={gmpo.max_steps}, seeds {first_seed}..{first_seed + script.seeds - 1}"
    )
    names = list(plan.comparators)
    if names == [DEFAULT_AGAINST]:  # gmpo compare as it always was
        eps = plan.comparators["grpo"].epsilon
        sides = f"GRPO: loss_type='grpo', ratio clip [1 - {eps}, 1 + {eps}]; GMPO: {gmpo_side}"
    else:
        sides = "; ".join(
            [*(f"{COMPARATORS[n].label}: TRL GRPOTrainer, {_forced(n, c)}"
               for n, c in plan.comparators.items()), f"GMPO: {gmpo_side}"]
        )  # fmt: skip
    settings = f"{what_ran(script)}; {sides}; {run_settings}"
    table, agg = compare_table(summaries)
    note = (
        "Log-ratio min/max: the extremes of r = logp - old_logp over the run's off-policy steps; "
        "mean step width: the mean over those steps of (max - min); mean ± sample std over "
        f"seeds. Peak (20): the largest mean of {WINDOW} consecutive logged rewards; collapsed: "
        f"the final reward at least {DROP} below peak (20), the rule of docs/study.md (runs with "
        f"at least {JUDGED_FROM} logged rewards)."
    )
    data: dict[str, Any] = dict(settings=settings, rewards=REWARDS, variant=gmpo.loss_variant,
                                aggregate=agg, runs=summaries)  # fmt: skip
    if names == [DEFAULT_AGAINST]:
        return {"markdown": f"{settings}\n\n{REWARDS}\n\n{table}\n\n{note}\n", "json": data}
    against, against_agg = against_table(outcomes)
    sources = "; ".join(f"{COMPARATORS[n].label}: {COMPARATORS[n].source}" for n in names)
    against_note = (
        "Against GMPO: a pair is GMPO's run and the method's run on the same seed (the same warm "
        "start and prompts); GMPO wins it when its final reward is higher, loses it when lower "
        "(ties dropped); p: the one-sided exact sign test (gmpo_stats.paired.sign_test_p), H1: "
        "GMPO wins more often. Failed: the final reward below the first (the warm start's) or "
        f"collapsed (the final reward at least {DROP} below the peak {WINDOW}-reward mean), "
        f"gmpo_stats.outcome's rule. Settings' sources: {sources}."
    )
    data.update(against=names, against_gmpo=against_agg, outcomes=outcomes)
    markdown = f"{settings}\n\n{REWARDS}\n\n{against}\n\n{against_note}\n\n{table}\n\n{note}\n"
    return {"markdown": markdown, "json": data}
