"""``gmpo compare``: GRPO (TRL, ratio clip 1 ± grpo_epsilon) and GMPO on the same task and seeds,
with a plot and a table of the token log-ratio range and the reward.

Both configs come from one parse, in one plan (:func:`~gmpo_trl.cli.runs.build_plan`): GMPO's
is ``GMPOConfig`` of the user's values; GRPO's is ``GRPOConfig`` of the same values (its own
fields only, so GMPO-only options such as ``gmpo_impl`` do not reach it, and its defaults are
GRPOConfig's) with GRPO's loss and clip forced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gmpo_stats.outcome import DROP, WINDOW
from gmpo_trl.cli.arguments import CompareArguments
from gmpo_trl.cli.base import Command
from gmpo_trl.cli.checks import check_grpo_epsilon
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.cli.plots import log_clip_range, plot_compare
from gmpo_trl.cli.reports import FINAL_STEPS, JUDGED_FROM, compare_table
from gmpo_trl.cli.runs import Parsed, Plan, build_plan, interruptible, run, stop_if_interrupted


def compare_plan(parsed: Parsed) -> Plan:
    """The plan of a parsed ``gmpo compare`` command line, GRPO's config in it."""
    script = parsed.script
    if script.seeds < 1:
        raise CLIError(f"--seeds must be at least 1, got {script.seeds}")
    if parsed.values.get("resume_from_checkpoint") not in (None, False, "false", "False"):
        raise CLIError(
            "--resume_from_checkpoint: gmpo compare does not resume (it trains a run per method "
            "and seed); resume one run with gmpo train --resume_from_checkpoint"
        )
    epsilon = check_grpo_epsilon(script.grpo_epsilon)
    grpo = {"loss_type": "grpo", "epsilon": epsilon, "epsilon_high": None}
    return build_plan(parsed, resumable=False, comparators={"grpo": grpo})


def configs(parsed: Parsed) -> tuple[Any, Any]:
    """``(GRPOConfig, GMPOConfig)`` of a parsed ``gmpo compare`` command line."""
    plan = compare_plan(parsed)
    return plan.comparators["grpo"], plan.config


def gmpo_settings(config: Any, variant: Any) -> str:
    """What ran as GMPO: its log-space clip, or the loss variant (``loss_variant``) by name and
    label."""
    if variant is None:
        return f"log-space clip [-{config.epsilon}, {config.epsilon_high or config.epsilon}]"
    return f"loss variant {config.loss_variant!r} ({variant.label})"


class CompareCommand(Command):
    name = "compare"
    description = (
        "Train GRPO (TRL, ratio clip 1 ± grpo_epsilon) and GMPO on the same task and seeds; "
        "plot and summarize the token log-ratio range and the reward."
    )
    arguments = CompareArguments

    def run(self, parsed: Parsed) -> Path:
        """GRPO, then GMPO, on each seed; returns the output directory."""
        import gmpo_trl
        from gmpo_trl.grpo_range import RangeLoggingGRPOTrainer

        plan = compare_plan(parsed)
        script, gmpo_config = plan.script, plan.config
        base = Path(gmpo_config.output_dir)
        first_seed = gmpo_config.seed
        methods = {"GRPO": plan.comparators["grpo"], "GMPO": gmpo_config}
        runs: dict[str, list[list[dict[str, Any]]]] = {label: [] for label in methods}
        summaries: dict[str, list[dict[str, Any]]] = {label: [] for label in methods}
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
        plot_compare(runs, base / "compare.png", bounds)
        table, agg = compare_table(summaries)
        task = script.task if script.model is None else f"{script.task} (model {script.model})"
        eps = methods["GRPO"].epsilon
        settings = (
            f"task {task}; GRPO: loss_type='grpo', ratio clip [1 - {eps}, 1 + {eps}]; GMPO: "
            f"{gmpo_settings(gmpo_config, plan.variant)}; "
            f"num_iterations={gmpo_config.num_iterations}, "
            f"steps_per_generation={gmpo_config.steps_per_generation}, "
            f"max_steps={gmpo_config.max_steps}, seeds {first_seed}..{first_seed + script.seeds - 1}"
        )
        note = (
            f"First rewards / final reward: mean of the first / last {FINAL_STEPS} logged rewards "
            "of a run (a reward is logged per generation, every num_iterations x "
            "steps_per_generation optimizer steps); log-ratio min/max: the extremes of r = logp - "
            "old_logp over the run's off-policy steps; mean step width: the mean over those steps "
            "of (max - min); mean ± sample std over seeds. "
            f"Final (20) / peak (20): the last / largest mean of {WINDOW} consecutive "
            f"logged rewards; collapsed: final (20) at least {DROP} below peak (20), the "
            f"rule of docs/study.md (runs with at least {JUDGED_FROM} logged rewards)."
        )
        (base / "summary.md").write_text(f"{settings}\n\n{table}\n\n{note}\n")
        (base / "summary.json").write_text(
            json.dumps(dict(settings=settings, variant=variant, aggregate=agg, runs=summaries),
                       indent=1) + "\n"
        )  # fmt: skip
        print(f"\n{settings}\n\n{table}\n\n{note}\n")
        print(f"gmpo compare: plot in {base / 'compare.png'}, table in {base / 'summary.md'}")
        return base
