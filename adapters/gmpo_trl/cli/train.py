"""``gmpo train``: one GMPO run (the toy run unless ``--model`` is given)."""

from __future__ import annotations

from pathlib import Path

from gmpo_trl.cli.checks import check_inputs, check_resume, check_task_lengths, check_vllm
from gmpo_trl.cli.parsing import Parsed
from gmpo_trl.cli.runs import interruptible, quiet, run, stop_if_interrupted


def main(parsed: Parsed) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig

    config = parsed.config(GMPOConfig)
    check_inputs(parsed.script)
    check_task_lengths(parsed.script, config, "train")
    resume = check_resume(config.resume_from_checkpoint, config.output_dir)
    check_vllm(parsed.script, config)
    # the trainer after the checks: importing it imports vLLM where installed (10-20 s)
    from gmpo_trl import GMPOTrainer

    quiet()
    done = run(parsed.script, config, interruptible(GMPOTrainer), "gmpo train", resume=resume)
    stop_if_interrupted(done, config.output_dir)  # no final model: it is not the run asked for
    done.trainer.save_model(str(Path(config.output_dir) / "final"))
    return Path(config.output_dir)
