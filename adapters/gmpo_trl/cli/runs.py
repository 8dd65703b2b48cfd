"""One training run of a ``gmpo`` command: its trainer (the user's model, dataset and rewards, or
the built-in task's), the training, and its outputs (``metrics.jsonl``, ``metrics.png``,
``summary.json``/``summary.md``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gmpo_trl.cli.callbacks import json_lines, quiet_progress_bar
from gmpo_trl.cli.checks import check_model, load_dataset, resolve_reward
from gmpo_trl.cli.options import CLIError
from gmpo_trl.cli.plots import log_clip_range, plot_training
from gmpo_trl.cli.reports import read_metrics, run_summary, summary_line, summary_markdown


@dataclass(frozen=True)
class Task:
    """A built-in task: what a run trains on when the user names no dataset, reward or model.
    ``dataset(seed)`` returns the prompts (a ``datasets.Dataset``), ``reward`` is a TRL reward
    function, ``model(seed)`` returns ``(model, tokenizer)``."""

    dataset: Callable[[int], Any]
    reward: Callable[..., list[float]]
    model: Callable[[int], tuple[Any, Any]]


def successor_task(heads: int = 4) -> Task:
    """The toy run's task (``gmpo_trl.toy``): a tiny Qwen2-style model learns ``d= -> d + 1``."""
    from gmpo_trl import toy

    def model(seed: int) -> tuple[Any, Any]:
        tokenizer = toy.char_tokenizer()
        return toy.tiny_model(tokenizer, seed=seed, heads=heads), tokenizer

    return Task(lambda seed: toy.successor_dataset(seed=seed), toy.successor_reward, model)


#: the reverse run's supervised warm start (gmpo_trl.reverse_trl.warm_start): Adam steps of 64
#: noisy demonstrations at this learning rate
WARM_STEPS, WARM_LR = 400, 3e-3


def reverse_task(heads: int = 4) -> Task:
    """``--task reverse`` (``gmpo_trl.reverse``): reverse 16 digits, exact-match reward; the model
    of a seed is warm-started on noisy demonstrations (the same model for every method of a
    seed: the warm start is computed once per seed and process)."""
    from gmpo_trl.reverse import ReverseTask
    from gmpo_trl.reverse_trl import reverse_dataset, reverse_model, sampled_reward, warm_start

    task = ReverseTask()
    states: dict[int, tuple[dict[str, Any], float]] = {}

    def model(seed: int) -> tuple[Any, Any]:
        tokenizer, net = reverse_model(task, seed=seed, heads=heads)
        if seed not in states:
            losses = warm_start(net, tokenizer, task, steps=WARM_STEPS, lr=WARM_LR, seed=seed)
            start = sampled_reward(net, tokenizer, task, seed=seed)
            print(f"warm start (seed {seed}): {WARM_STEPS} supervised steps, loss "
                  f"{losses[0]:.2f} -> {losses[-1]:.2f}, sampled reward {start:.3f}")  # fmt: skip
            states[seed] = ({k: v.clone() for k, v in net.state_dict().items()}, start)
        net.load_state_dict(states[seed][0])
        return net, tokenizer

    return Task(lambda seed: reverse_dataset(task, seed=seed), task.reward_function(), model)


#: --use_vllm without --model: the built-in models with heads of 32 (hidden 32 and 64), the
#: smallest head_dim vLLM's CPU attention takes (docs/vllm.md)
VLLM_HEADS = {"successor": 1, "reverse": 2}


@functools.cache
def named_task(name: str, vllm: bool = False) -> Task:
    """The built-in task of ``--task`` (one per process, so that its warm starts are shared)."""
    heads = {"heads": VLLM_HEADS[name]} if vllm and name in VLLM_HEADS else {}
    return reverse_task(**heads) if name == "reverse" else successor_task(**heads)


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
    task = task or named_task(script.task, bool(config.use_vllm))
    out = Path(config.output_dir)
    rewards = [resolve_reward(r) for r in script.reward] or [task.reward]
    if script.dataset is None:
        dataset = task.dataset(config.seed)
    else:
        dataset = load_dataset(script.dataset, script.dataset_split)
    if script.model is None:
        import torch

        torch.set_num_threads(1)  # a tiny model: more threads only add synchronization
        model, tokenizer = task.model(config.seed)
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
