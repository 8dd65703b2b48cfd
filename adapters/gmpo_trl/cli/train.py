"""``gmpo train``: one GMPO run (the toy run unless ``--model`` is given)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gmpo_trl.cli.checks import check_inputs, check_resume, check_task_lengths, check_vllm
from gmpo_trl.cli.options import Interrupted
from gmpo_trl.cli.parsing import Parsed
from gmpo_trl.cli.runs import Run, quiet, run


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={
            "help": "Local model directory (as save_pretrained writes it) or hub id. "
            "Default: the built-in toy run (a tiny Qwen2-style model on the successor task)."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            "'prompt' column. Default: the built-in toy task."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Dataset split."})
    task: str = field(
        default="successor",
        metadata={
            "help": "The built-in task, for what --model, --dataset or --reward does not name: "
            "'successor' (the toy run) or 'reverse' (reverse 16 digits, exact match; a tiny "
            "GPT-2-style model warm-started on noisy demonstrations; without --model, the "
            "setting of docs/study.md instead of the toy values: 100 generations of 16 prompts "
            "x 8 completions, 16 optimizer steps on each (steps_per_generation=8, "
            "num_iterations=2), learning_rate=0.002, max_grad_norm=0).",
            "choices": ["successor", "reverse"],
        },
    )
    reward: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward function(s) as module:function (the module in the current directory "
            "or on PYTHONPATH). Default: the toy task's."
        },
    )


def interruptible(trainer_cls: type) -> type:
    """``trainer_cls`` whose ``train()`` returns on Ctrl-C (a ``KeyboardInterrupt``) with
    ``interrupted`` set, so that the run's metrics, plot and summary are written for the steps
    done (:func:`stop_if_interrupted` then ends the command)."""

    class Interruptible(trainer_cls):  # type: ignore[misc, valid-type]
        interrupted = False

        def train(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().train(*args, **kwargs)
            except KeyboardInterrupt:
                self.interrupted = True
                for callback in self.callback_handler.callbacks:  # the progress bar's last line
                    bar = getattr(callback, "training_bar", None)
                    if bar is not None:
                        bar.close()
                        callback.training_bar = None
                return None

    Interruptible.__name__ = Interruptible.__qualname__ = trainer_cls.__name__
    return Interruptible


def stop_if_interrupted(done: Run, output_dir: str | Path) -> None:
    """Raise :class:`~gmpo_trl.cli.options.Interrupted` after a run that Ctrl-C stopped."""
    if getattr(done.trainer, "interrupted", False):
        state = done.trainer.state
        raise Interrupted(
            f"interrupted after {state.global_step} of {state.max_steps} optimizer steps; the "
            f"summary and plot of the steps done are in {output_dir}"
        )


def main(parsed: Parsed) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig, GMPOTrainer

    config = parsed.config(GMPOConfig)
    check_inputs(parsed.script)
    check_task_lengths(parsed.script, config, "train")
    resume = check_resume(config.resume_from_checkpoint, config.output_dir)
    check_vllm(parsed.script, config)
    quiet()
    done = run(parsed.script, config, interruptible(GMPOTrainer), "gmpo train", resume=resume)
    stop_if_interrupted(done, config.output_dir)  # no final model: it is not the run asked for
    done.trainer.save_model(str(Path(config.output_dir) / "final"))
    return Path(config.output_dir)
