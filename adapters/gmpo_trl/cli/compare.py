"""``gmpo compare``: GRPO (TRL, ratio clip 1 ± grpo_epsilon) and GMPO on the same task and seeds,
with a plot and a table of the token log-ratio range and the reward.

Both configs come from one parse (:class:`~gmpo_trl.cli.parsing.Parsed`): GMPO's is
``GMPOConfig`` of the user's values; GRPO's is ``GRPOConfig`` of the same values (its own fields
only, so GMPO-only options such as ``gmpo_impl`` do not reach it, and its defaults are
GRPOConfig's) with GRPO's loss and clip forced.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gmpo_tasks.rules import DROP, WINDOW
from gmpo_trl.cli.checks import check_grpo_epsilon, check_inputs, check_task_lengths, check_vllm
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.cli.parsing import Parsed
from gmpo_trl.cli.plots import log_clip_range, plot_compare
from gmpo_trl.cli.reports import FINAL_STEPS, JUDGED_FROM, compare_table
from gmpo_trl.cli.runs import interruptible, quiet, run, stop_if_interrupted


def configs(parsed: Parsed) -> tuple[Any, Any]:
    """``(GRPOConfig, GMPOConfig)`` of a parsed ``gmpo compare`` command line."""
    from trl import GRPOConfig

    from gmpo_trl import GMPOConfig

    gmpo = parsed.config(GMPOConfig)
    if parsed.script.seeds < 1:
        raise CLIError(f"--seeds must be at least 1, got {parsed.script.seeds}")
    if gmpo.resume_from_checkpoint not in (None, False, "false", "False"):
        raise CLIError(
            "--resume_from_checkpoint: gmpo compare does not resume (it trains a run per method "
            "and seed); resume one run with gmpo train --resume_from_checkpoint"
        )
    epsilon = check_grpo_epsilon(parsed.script.grpo_epsilon)
    check_inputs(parsed.script)
    check_task_lengths(parsed.script, gmpo, "compare")
    check_vllm(parsed.script, gmpo)
    grpo = parsed.config(GRPOConfig, loss_type="grpo", epsilon=epsilon, epsilon_high=None)
    return grpo, gmpo


def gmpo_settings(config: Any) -> str:
    """What ran as GMPO: its log-space clip, or the loss variant (``loss_variant``) by name and
    label."""
    if config.loss_variant is None:
        return f"log-space clip [-{config.epsilon}, {config.epsilon_high or config.epsilon}]"
    from gmpo_tasks.variants import resolve

    return f"loss variant {config.loss_variant!r} ({resolve(config.loss_variant).label})"


def main(parsed: Parsed) -> Path:
    """``gmpo compare``: GRPO, then GMPO, on each seed; returns the output directory."""
    script = parsed.script
    grpo_config, gmpo_config = configs(parsed)
    # the trainers after the checks: importing them imports vLLM where installed (10-20 s)
    from gmpo_trl import GMPOTrainer
    from gmpo_trl.grpo_range import RangeLoggingGRPOTrainer

    base = Path(gmpo_config.output_dir)
    quiet()
    first_seed = gmpo_config.seed
    runs: dict[str, list[list[dict[str, Any]]]] = {"GRPO": [], "GMPO": []}
    summaries: dict[str, list[dict[str, Any]]] = {"GRPO": [], "GMPO": []}
    bounds = {"GRPO": log_clip_range(grpo_config), "GMPO": log_clip_range(gmpo_config)}
    gmpo_side, variant = gmpo_settings(gmpo_config), gmpo_config.loss_variant
    for k in range(script.seeds):
        seed = first_seed + k
        for name, config, cls in (
            ("GRPO", grpo_config, interruptible(RangeLoggingGRPOTrainer)),
            ("GMPO", gmpo_config, interruptible(GMPOTrainer)),
        ):
            config.seed = seed
            config.output_dir = str(base / name.lower() / f"seed{seed}")
            what = name if name == "GRPO" or variant is None else f"GMPO variant {variant}"
            done = run(script, config, cls, f"gmpo compare ({what}, seed {seed})")
            stop_if_interrupted(done, config.output_dir)  # its run's outputs; no compare table
            runs[name].append(done.rows)
            summaries[name].append(done.summary)
    plot_compare(runs, base / "compare.png", bounds)
    table, agg = compare_table(summaries)
    task = script.task if script.model is None else f"{script.task} (model {script.model})"
    settings = (
        f"task {task}; GRPO: loss_type='grpo', ratio clip [1 - {grpo_config.epsilon}, 1 + "
        f"{grpo_config.epsilon}]; GMPO: {gmpo_side}; "
        f"num_iterations={gmpo_config.num_iterations}, "
        f"steps_per_generation={gmpo_config.steps_per_generation}, "
        f"max_steps={gmpo_config.max_steps}, seeds {first_seed}..{first_seed + script.seeds - 1}"
    )
    note = (
        f"First rewards / final reward: mean of the first / last {FINAL_STEPS} logged rewards of a "
        "run (a reward is logged per generation, every num_iterations x steps_per_generation "
        "optimizer steps); log-ratio "
        "min/max: the extremes of r = logp - old_logp over the run's off-policy steps; mean "
        "step width: the mean over those steps of (max - min); mean ± sample std over seeds. "
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
