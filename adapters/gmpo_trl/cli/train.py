"""``gmpo train``: one GMPO run (the toy run unless ``--model`` is given)."""

from __future__ import annotations

from pathlib import Path

from gmpo_trl.cli.arguments import ScriptArguments
from gmpo_trl.cli.base import Command
from gmpo_trl.cli.runs import Parsed, build_plan, interruptible, run, stop_if_interrupted


class TrainCommand(Command):
    name = "train"
    description = "Train with GMPO (TRL's GRPOTrainer, gmpo_core's loss)."
    arguments = ScriptArguments

    def run(self, parsed: Parsed) -> Path:
        """One run of the plan; returns the output directory."""
        import gmpo_trl

        plan = build_plan(parsed)
        config = plan.config
        trainer_cls = interruptible(gmpo_trl.GMPOTrainer)
        done = run(plan, config, trainer_cls, "gmpo train", resume=plan.resume)
        stop_if_interrupted(done, config.output_dir)  # no final model: it is not the run asked for
        done.trainer.save_model(str(Path(config.output_dir) / "final"))
        return Path(config.output_dir)
