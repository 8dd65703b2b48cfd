"""One run of a ``gmpo`` command, from the parsed command line to its outputs, each step once:

- :class:`Parsed`: the command line as :func:`gmpo_trl.cli.parsing.parse` leaves it;
- :class:`Plan` (:func:`build_plan`): the config, the built-in task, the reward functions, the
  user's dataset, the loss variant and the checkpoint to resume from, each resolved and checked
  once, before any work (:mod:`gmpo_trl.cli.checks`); training, ``gmpo compare``, the plots and
  the summaries read it;
- :func:`build_trainer` and :func:`run`: the trainer of one run of a plan (the user's model,
  dataset and rewards, or the task's: ``gmpo_tasks.catalog.TASKS``), its training, and its
  outputs (``metrics.jsonl``, ``metrics.png``, ``summary.json``/``summary.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmpo_tasks.task import Task
from gmpo_trl.cli.callbacks import json_lines, quiet_progress_bar
from gmpo_trl.cli.checks import (
    check_counts,
    check_resume,
    check_run,
    check_task_lengths,
    check_vllm,
    load_dataset,
    resolve_reward,
)
from gmpo_trl.cli.errors import CLIError, Interrupted
from gmpo_trl.cli.held_out import SAMPLES, held_out_reward
from gmpo_trl.cli.model_checks import check_format_reward, resolve_model
from gmpo_trl.cli.plots import log_clip_range, plot_training
from gmpo_trl.cli.reports import read_metrics, run_summary, summary_line, summary_markdown
from gmpo_trl.cli.upfront import check_columns, task_of


@dataclass(frozen=True)
class Parsed:
    """A parsed command line: the command, its own arguments (``script``), the config values the
    user set (``values``: the YAML file's, then the command line's), the run's ``defaults``, and
    the name of every option the user set (``set_by_user``, the command's own included): what the
    user set is known from parsing, never guessed by comparing a value with its default."""

    command: str
    script: Any
    values: dict[str, Any]
    defaults: dict[str, Any]
    set_by_user: frozenset[str] = frozenset()

    def config(self, cls: type, **forced: Any) -> Any:
        """A ``cls`` (``GMPOConfig``, ``GRPOConfig``) from the defaults, the user's values and
        ``forced`` (highest precedence), each restricted to ``cls``'s own fields."""
        names = {f.name for f in dataclasses.fields(cls)}
        merged = {**self.defaults, **self.values, **forced}
        kwargs = {k: v for k, v in merged.items() if k in names}
        check_counts(kwargs)  # before GRPOConfig divides by them
        try:
            config = cls(**kwargs)
        except (ValueError, TypeError) as err:
            raise CLIError(str(err).splitlines()[0]) from err
        check_run(config)
        return config


@dataclass(frozen=True)
class Plan:
    """What a command runs, resolved and checked once (:func:`build_plan`). ``config``: the
    ``GMPOConfig``; ``rewards``: the user's reward functions, or the task's; ``dataset``: the
    user's, loaded once, or None for the task's (its prompts depend on the run's seed);
    ``variant``: the resolved ``loss_variant`` (None: GMPO's loss); ``resume``: the checkpoint
    directory to resume from; ``model``: what is trained; ``comparators``: ``gmpo compare``'s ``GRPOConfig`` of each loss it
    trains beside GMPO, by ``--against`` name."""

    @property
    def checked(self) -> Any:
        """The check of ``config`` (``gmpo_trl.config.check_config``, done as it was built, not
        again): its values and ``variant``. GMPO's trainer takes it instead of checking."""
        from gmpo_trl.config import check_config

        return check_config(self.config)

    script: Any
    config: Any
    task: Task
    rewards: tuple[Callable[..., Any], ...]
    dataset: Any
    variant: Any
    resume: str | None = None
    comparators: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the model trained: a local directory or hub id (a packaged model's name resolved to its
    #: directory), or None for the task's built-in tiny model
    model: str | None = None


def build_plan(
    parsed: Parsed,
    *,
    resumable: bool = True,
    comparators: Mapping[str, dict[str, Any]] | None = None,
) -> Plan:
    """The plan of a parsed command line, every check before any work: the config (its own rules
    at construction, and a loss variant refused beside any option it replaces that the user set,
    whatever its value), the task, the model, dataset and reward options, the completion length
    the task's model holds, ``--resume_from_checkpoint`` (``resumable``), vLLM, a ``GRPOConfig``
    of the same values for each of ``comparators`` (name -> the values it forces); then the
    user's dataset is loaded."""
    from gmpo_trl import GMPOConfig
    from gmpo_trl.config import check_variant, loss_variant

    script = parsed.script
    config = parsed.config(GMPOConfig)
    if config.loss_variant is not None:
        try:
            check_variant(config, explicit=parsed.set_by_user)
        except ValueError as err:
            raise CLIError(str(err)) from err
    task = task_of(script)
    # the model, dataset and reward options: checked up front (gmpo_trl.cli.upfront)
    rewards = [resolve_reward(spec) for spec in script.reward] or [task.reward]
    if script.format_reward:
        rewards.append(check_format_reward(task, script))
    if script.model is None and script.dataset is None:
        check_task_lengths(task, task.lengths(), config, script, parsed.command)
    resume = check_resume(config.resume_from_checkpoint, config.output_dir) if resumable else None
    check_vllm(script, config)
    others = {}
    if comparators:
        from trl import GRPOConfig

        others = {name: parsed.config(GRPOConfig, **forced) for name, forced in comparators.items()}
    quiet()
    dataset = None if script.dataset is None else load_dataset(script.dataset, script.dataset_split)
    if dataset is not None:  # every column a reward needs, before any model
        check_columns(rewards, dataset.column_names, f"--dataset {script.dataset!r}")
    model = resolve_model(script, task)  # a packaged model converted once, on first use
    variant = loss_variant(config)
    return Plan(script, config, task, tuple(rewards), dataset, variant, resume, others, model)


def checks_rewards(trainer_cls: Any) -> bool:
    """Whether ``trainer_cls`` (a class, or a ``functools.partial`` of one) is a
    ``GMPOTrainer``, which checks its reward functions against the dataset when it is built."""
    from gmpo_trl.trainer import GMPOTrainer

    cls = getattr(trainer_cls, "func", trainer_cls)
    return isinstance(cls, type) and issubclass(cls, GMPOTrainer)


def script_dataset(plan: Plan) -> str:
    """The dataset of ``plan``'s runs, as a message names it."""
    if plan.script.dataset is not None:
        return f"--dataset {plan.script.dataset!r}"
    return f"the {plan.task.name} task's dataset"


def quiet() -> None:
    """Only the progress bar and errors from transformers; no FutureWarnings."""
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # file-writing bars; the training bar is the Trainer's
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*trl.experimental.*")


def build_trainer(plan: Plan, config: Any, trainer_cls: type) -> Any:
    """The trainer of one run of ``plan`` under ``config`` (the plan's, or a comparator's in
    ``gmpo compare``): the plan's task's parts where the user named no model or dataset."""
    task, out = plan.task, Path(config.output_dir)
    dataset = task.dataset(config.seed) if plan.dataset is None else plan.dataset
    if not checks_rewards(trainer_cls):  # TRL's GRPOTrainer (gmpo compare): before the model
        check_columns(plan.rewards, dataset.column_names, script_dataset(plan))
    if plan.model is None:
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
        model_arg, kwargs = plan.model, {}
    rewards = list(plan.rewards)
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


def run(plan: Plan, config: Any, trainer_cls: type, title: str, resume: str | None = None) -> Run:
    """Train one run of ``plan`` under ``config``, from the checkpoint directory ``resume`` when
    given (as ``Trainer.train(resume_from_checkpoint=...)`` does: the steps after it only);
    metrics.png, summary.json/.md in its output directory."""
    if config is plan.config:  # GMPO's run: its trainer takes the plan's check
        trainer_cls = functools.partial(trainer_cls, checked=plan.checked)
    trainer = build_trainer(plan, config, trainer_cls)
    evaluate = held_out(plan, config)
    before = evaluate(trainer, plan.model) if evaluate is not None else None
    if resume is not None:
        done = json.loads((Path(resume) / "trainer_state.json").read_text())["global_step"]
        total = f" of {trainer.args.max_steps}" if trainer.args.max_steps > 0 else ""
        print(f"resuming from {resume} at step {done}{total}")
    trainer.train(resume_from_checkpoint=resume)
    out = Path(config.output_dir)
    rows = read_metrics(out / "metrics.jsonl")
    variant = plan.variant if config is plan.config else None
    plot_training(rows, out / "metrics.png", title=title, bounds=log_clip_range(config, variant))
    summary = {"seed": config.seed, **run_summary(rows, trainer.state.global_step)}
    if evaluate is not None and before is not None and not getattr(trainer, "interrupted", False):
        after = evaluate(trainer, None)
        summary.update({f"held_out_{k}_before": v for k, v in before.items()})
        summary.update({f"held_out_{k}_after": v for k, v in after.items()})
        summary["held_out_completions"] = plan.script.held_out * SAMPLES
    line = summary_line(title, summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(summary_markdown(summary, line))
    print(f"{line}; outputs in {out}")
    return Run(trainer, rows, summary)


def held_out(plan: Plan, config: Any) -> Callable[[Any, str | None], dict[str, float]] | None:
    """The held-out evaluation of a run of ``plan`` under ``config``: a chat task's, on its own
    prompts, ``--held_out`` of them (:mod:`gmpo_trl.cli.held_out`); None where there is none.
    The function takes the trainer and, before training, the model's path: the untrained
    model's reward is computed once per process for each model and setting (every method and
    seed of ``gmpo compare`` starts from it)."""
    task, n = plan.task, plan.script.held_out
    if task.model_name is None or plan.dataset is not None or n <= 0:
        return None
    setting = (task.name, n, config.max_completion_length, config.temperature)

    def evaluate(trainer: Any, base: str | None) -> dict[str, float]:
        if base is not None and (base, *setting) in _UNTRAINED:
            return _UNTRAINED[(base, *setting)]
        when = "before" if base is not None else "after"
        # minutes on a CPU (128 completions of SmolLM2-135M): a line before, and one after
        print(f"held-out reward {when} training: {n * SAMPLES} completions ({n} prompts x "
              f"{SAMPLES}, at most {config.max_completion_length} tokens each) ...",
              file=sys.stderr, flush=True)  # fmt: skip
        start = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        out = held_out_reward(model, trainer.processing_class, task, prompts=n,
                              max_tokens=config.max_completion_length,
                              temperature=config.temperature)  # fmt: skip
        print(f"held-out reward {when} training: {out['reward']:.3f} (right: {out['right']:.3f})"
              f" in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)  # fmt: skip
        if base is not None:
            _UNTRAINED[(base, *setting)] = out
        return out

    return evaluate


#: the untrained models' held-out rewards computed in this process
_UNTRAINED: dict[tuple[Any, ...], dict[str, float]] = {}


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
