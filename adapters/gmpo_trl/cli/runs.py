"""One training run of a ``gmpo`` command: its trainer (the user's model, dataset and rewards, or
the built-in task's: ``gmpo_tasks.registry.TASKS``), the training, and its outputs
(``metrics.jsonl``, ``metrics.png``, ``summary.json``/``summary.md``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmpo_tasks.registry import get_task
from gmpo_tasks.task import Task
from gmpo_trl.cli.callbacks import json_lines, quiet_progress_bar
from gmpo_trl.cli.checks import check_model, load_dataset, resolve_reward
from gmpo_trl.cli.errors import CLIError, Interrupted
from gmpo_trl.cli.plots import log_clip_range, plot_training
from gmpo_trl.cli.reports import read_metrics, run_summary, summary_line, summary_markdown


def quiet() -> None:
    """Only the progress bar and errors from transformers; no FutureWarnings."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # file-writing bars; the training bar is the Trainer's
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*trl.experimental.*")


def build_trainer(script: Any, config: Any, trainer_cls: type, task: Task | None = None) -> Any:
    """The trainer for the parsed arguments: ``task``'s parts (``--task``'s by default) where the
    user named no model, dataset or reward."""
    task = task or get_task(script.task)
    out = Path(config.output_dir)
    rewards = [resolve_reward(r) for r in script.reward] or [task.reward]
    if script.dataset is None:
        dataset = task.dataset(config.seed)
    else:
        dataset = load_dataset(script.dataset, script.dataset_split)
    if script.model is None:
        import torch

        torch.set_num_threads(1)  # a tiny model: more threads only add synchronization
        # --use_vllm: the task's heads of 32 dimensions, the smallest vLLM's CPU attention takes
        model, tokenizer = task.model(config.seed, task.vllm_heads if config.use_vllm else None)
        init = out / "init-model"  # a path, so that beta's reference model can be loaded
        model.save_pretrained(init)
        model.config._name_or_path = model.name_or_path = str(init)  # (vLLM loads it from there)
        model_arg: Any = model
        kwargs: dict[str, Any] = {"processing_class": tokenizer}
    else:
        check_model(script.model)
        model_arg, kwargs = script.model, {}
    try:
        trainer = trainer_cls(
            model=model_arg,
            reward_funcs=rewards if len(rewards) > 1 else rewards[0],
            args=config,
            train_dataset=dataset,
            callbacks=[json_lines(out / "metrics.jsonl")],
            **kwargs,
        )
    except (ValueError, TypeError, OSError, ImportError) as err:  # refused settings, missing model
        raise CLIError(str(err).splitlines()[0]) from err
    quiet_progress_bar(trainer)
    return trainer


@dataclass(frozen=True)
class Run:
    """A finished run: its trainer, its logged rows and its summary."""

    trainer: Any
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


def run(script: Any, config: Any, trainer_cls: type, title: str, resume: str | None = None) -> Run:
    """Train one run, from the checkpoint directory ``resume`` when given (as
    ``Trainer.train(resume_from_checkpoint=...)`` does: the steps after it only); metrics.png,
    summary.json/.md in its output directory."""
    trainer = build_trainer(script, config, trainer_cls)
    if resume is not None:
        done = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"]
        total = f" of {trainer.args.max_steps}" if trainer.args.max_steps > 0 else ""
        print(f"resuming from {resume} at step {done}{total}")
    trainer.train(resume_from_checkpoint=resume)
    out = Path(config.output_dir)
    rows = read_metrics(out / "metrics.jsonl")
    plot_training(rows, out / "metrics.png", title=title, bounds=log_clip_range(config))
    summary = {"seed": config.seed, **run_summary(rows, trainer.state.global_step)}
    line = summary_line(title, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(summary_markdown(summary, line))
    print(f"{line}; outputs in {out}")
    return Run(trainer, rows, summary)


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
    """Raise :class:`~gmpo_trl.cli.errors.Interrupted` after a run that Ctrl-C stopped."""
    if getattr(done.trainer, "interrupted", False):
        state = done.trainer.state
        raise Interrupted(
            f"interrupted after {state.global_step} of {state.max_steps} optimizer steps; the "
            f"summary and plot of the steps done are in {output_dir}"
        )
