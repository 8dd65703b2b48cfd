"""The ``gmpo`` command: ``gmpo train`` and ``gmpo compare``.

    gmpo train                                  # tiny model + toy task on CPU, about a minute
    gmpo train --model Qwen/Qwen2.5-Math-1.5B --dataset path/or/hub-id \\
               --reward mypkg.rewards:accuracy --use_vllm true --output_dir runs/qwen
    gmpo train --config run.yaml --max_steps 50  # YAML values, overridden by the command line
    gmpo compare                                # GRPO vs GMPO, same seed and task

Every ``GMPOConfig`` field is an option (``--epsilon 0.4``, ``--beta 0.04``, ...). Under the output
directory: ``metrics.jsonl`` (one JSON object per logged step) and ``metrics.png`` (reward,
token log-ratio range, clip fractions and entropy per step); ``compare`` writes ``grpo/``,
``gmpo/`` and ``compare.png``. A bad argument gets one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

USAGE = "usage: gmpo {train,compare} [--help] [--config FILE.yaml] [--model ...] [options]"


@dataclass
class ScriptArguments:
    """What to train on (the rest is GMPOConfig)."""

    model: str | None = field(
        default=None,
        metadata={"help": "Model path or hub id. Default: the built-in tiny Qwen2-style model."},
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "Dataset hub id, local directory, or .json/.jsonl/.csv/.parquet file with a "
            "'prompt' column. Default: the built-in toy task."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "Dataset split."})
    reward: list[str] = field(
        default_factory=list,
        metadata={"help": "Reward function(s) as module:function. Default: the toy task's."},
    )
    grpo_epsilon: float = field(
        default=0.2, metadata={"help": "compare: GRPO's (ratio-space) clip epsilon."}
    )


class CLIError(Exception):
    """A user error: reported as one line, no traceback."""


def _parser(command: str, config_cls: type) -> Any:
    """A TrlParser whose errors are CLIError (one line) instead of usage + exit."""
    from trl import TrlParser

    class Parser(TrlParser):  # type: ignore[misc]
        def error(self, message: str) -> NoReturn:
            raise CLIError(message)

    return Parser((ScriptArguments, config_cls), prog=f"gmpo {command}")


def _toy_defaults(output_dir: str) -> dict[str, Any]:
    from gmpo_trl import toy

    return toy.toy_args(
        output_dir,
        disable_tqdm=False,
        gmpo_impl="eager",  # compiling the fused path does not pay off at this size on a CPU
        # two optimizer steps per generation, two passes over each batch: updates are off-policy,
        # so the trust region acts and the log-ratio plot shows something (on-policy, r = 0)
        num_iterations=2,
        steps_per_generation=2,
    )


def _parse(
    command: str,
    argv: Sequence[str],
    config_cls: type,
    defaults: dict[str, Any] | None = None,
    forced: dict[str, Any] | None = None,
) -> tuple[ScriptArguments, Any]:
    """(ScriptArguments, config) from argv. Precedence: ``forced`` > command line > YAML
    (--config) > ``defaults`` > the toy defaults (when no --model is given) > the dataclass."""
    forced = forced or {}
    parser = _parser(command, config_cls)
    argv = list(argv)
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--model")
    probe.add_argument("--output_dir")
    known, _ = probe.parse_known_args(argv)
    output_dir = known.output_dir or f"gmpo_{command}_output"
    base: dict[str, Any] = {"output_dir": output_dir, "report_to": []}
    if known.model is None:
        base.update(_toy_defaults(output_dir))
    names = {f.name for f in dataclasses.fields(config_cls)}
    base = {k: v for k, v in {**base, **(defaults or {}), **forced}.items() if k in names}
    parser.set_defaults_with_config(**base)
    try:
        script, config, rest = parser.parse_args_and_config(argv, return_remaining_strings=True)
    except (ValueError, TypeError) as err:
        raise CLIError(str(err).splitlines()[0]) from err
    if rest:
        raise CLIError(f"unrecognized arguments: {' '.join(rest)}")
    for key, value in forced.items():  # compare's GRPO side
        setattr(config, key, value)
    return script, config


def _resolve_reward(spec: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"--reward {spec!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CLIError(f"--reward {spec!r}: cannot import {module_name!r} ({err})") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CLIError(f"--reward {spec!r}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def _load_dataset(spec: str, split: str) -> Any:
    from datasets import load_dataset

    path = Path(spec)
    kinds = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
    try:
        if path.is_file():
            if path.suffix not in kinds:
                raise CLIError(f"--dataset {spec!r}: use a .json, .jsonl, .csv or .parquet file")
            data = load_dataset(kinds[path.suffix], data_files=str(path), split=split)
        else:
            data = load_dataset(spec, split=split)
    except CLIError:
        raise
    except Exception as err:  # datasets raises many types; the user needs the one line
        raise CLIError(f"--dataset {spec!r}: {str(err).splitlines()[0]}") from err
    if "prompt" not in data.column_names:
        raise CLIError(f"--dataset {spec!r}: no 'prompt' column (columns: {data.column_names})")
    return data


def _trainer(script: ScriptArguments, config: Any, trainer_cls: type) -> Any:
    """The trainer for the parsed arguments: the toy set-up unless --model is given."""
    from gmpo_trl import toy

    out = Path(config.output_dir)
    # check what the user named before any work is done
    rewards = [_resolve_reward(r) for r in script.reward] or [toy.successor_reward]
    dataset = (
        toy.successor_dataset(seed=config.seed)
        if script.dataset is None
        else _load_dataset(script.dataset, script.dataset_split)
    )
    if script.model is None:
        import torch

        torch.set_num_threads(1)  # a tiny model: more threads only add synchronization
        tokenizer = toy.char_tokenizer()
        model = toy.tiny_model(tokenizer, seed=config.seed)
        init = out / "init-model"  # a path, so that beta's reference model can be loaded
        model.save_pretrained(init)
        model.config._name_or_path = str(init)
        model_arg: Any = model
        kwargs: dict[str, Any] = {"processing_class": tokenizer}
    else:
        model_arg, kwargs = script.model, {}
    try:
        trainer = trainer_cls(
            model=model_arg,
            reward_funcs=rewards if len(rewards) > 1 else rewards[0],
            args=config,
            train_dataset=dataset,
            callbacks=[_json_lines(out / "metrics.jsonl")],
            **kwargs,
        )
    except (ValueError, TypeError, OSError, ImportError) as err:  # refused settings, missing model
        raise CLIError(str(err).splitlines()[0]) from err
    _quiet_progress_bar(trainer)
    return trainer


def _quiet_progress_bar(trainer: Any) -> None:
    """The Trainer's progress bar, with reward and log-ratio range as its postfix instead of a
    printed dict per logged step (they are in metrics.jsonl)."""
    from transformers.trainer_callback import ProgressCallback

    class Progress(ProgressCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if self.training_bar is None or not logs:
                return
            keys = {"reward": "reward", "log_ratio/min": "r_min", "log_ratio/max": "r_max"}
            post = {v: f"{logs[k]:.3g}" for k, v in keys.items() if isinstance(logs.get(k), float)}
            if post:
                self.training_bar.set_postfix(post, refresh=False)

    if any(isinstance(cb, ProgressCallback) for cb in trainer.callback_handler.callbacks):
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(Progress)


def _json_lines(path: Path) -> Any:
    """A callback that appends every log (one per logged step) to a JSON-lines file."""
    from transformers import TrainerCallback

    class JsonLines(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.is_world_process_zero:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if state.is_world_process_zero and logs:
                with path.open("a") as f:
                    f.write(json.dumps({"step": state.global_step, **logs}) + "\n")

    return JsonLines()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step records of a metrics.jsonl (the final summary record excluded)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "reward" in r or "log_ratio/min" in r]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    pts = [(s, v) for s, v in pts if math.isfinite(v)]
    return [s for s, _ in pts], [v for _, v in pts]


def plot_training(rows: list[dict[str, Any]], path: Path, title: str = "GMPO") -> None:
    """Reward, token log-ratio range, clip fractions and entropy per step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.4))
    panels = [
        ("reward", ["reward"]),
        ("token log-ratio range", ["log_ratio/min", "log_ratio/max"]),
        (
            "clip fraction",
            ["clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"],
        ),
        ("entropy", ["entropy"]),
    ]
    for ax, (name, keys) in zip(axes, panels, strict=True):
        for key in keys:
            steps, values = _series(rows, key)
            if steps:
                ax.plot(steps, values, label=key)
        ax.set_title(name)
        ax.set_xlabel("step")
        if len(keys) > 1:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_compare(runs: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """The paper's Fig. 1 view: the token log-ratio range per step, one panel per method, on a
    shared y axis; the reward underneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(6 * len(runs), 6), sharey="row", sharex=True)
    for col, (name, rows) in enumerate(runs.items()):
        ax = axes[0, col]
        s_lo, lo = _series(rows, "log_ratio/min")
        s_hi, hi = _series(rows, "log_ratio/max")
        ax.plot(s_lo, lo, color="tab:blue", label="min")
        ax.plot(s_hi, hi, color="tab:red", label="max")
        ax.set_title(f"{name}: token log-ratio range")
        ax.legend(fontsize=8)
        steps, reward = _series(rows, "reward")
        axes[1, col].plot(steps, reward, color="tab:green")
        axes[1, col].set_title(f"{name}: reward")
        axes[1, col].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _quiet() -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # file-writing bars; the training bar is the Trainer's
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*trl.experimental.*")


def train(argv: Sequence[str]) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig, GMPOTrainer

    script, config = _parse("train", argv, GMPOConfig)
    _quiet()
    trainer = _trainer(script, config, GMPOTrainer)
    trainer.train()
    out = Path(config.output_dir)
    trainer.save_model(str(out / "final"))
    rows = read_metrics(out / "metrics.jsonl")
    plot_training(rows, out / "metrics.png")
    _summary("gmpo train", rows, out)
    return out


def compare(argv: Sequence[str]) -> Path:
    """``gmpo compare``: GRPO, then GMPO, same seed and task; returns the output directory."""
    from trl import GRPOConfig

    from gmpo_trl import GMPOConfig, GMPOTrainer
    from gmpo_trl.compare import RangeLoggingGRPOTrainer

    argv = list(argv)
    # off-policy passes (num_iterations > 1): on-policy, every log-ratio is 0
    defaults = {"num_iterations": 2}
    script, gmpo_config = _parse("compare", argv, GMPOConfig, defaults)
    base = Path(gmpo_config.output_dir)
    gmpo_config.output_dir = str(base / "gmpo")
    grpo_argv = list(argv)  # the GRPO side drops GMPO-only options
    for name in ("--gmpo_impl",):
        if name in grpo_argv:
            i = grpo_argv.index(name)
            del grpo_argv[i : i + 2]
    forced = {"loss_type": "grpo", "epsilon": script.grpo_epsilon, "epsilon_high": None}
    _, grpo_config = _parse("compare", grpo_argv, GRPOConfig, defaults, forced)
    grpo_config.output_dir = str(base / "grpo")
    _quiet()
    runs = {}
    for name, config, cls in (
        ("GRPO", grpo_config, RangeLoggingGRPOTrainer),
        ("GMPO", gmpo_config, GMPOTrainer),
    ):
        trainer = _trainer(script, config, cls)
        trainer.train()
        runs[name] = read_metrics(Path(config.output_dir) / "metrics.jsonl")
        plot_training(runs[name], Path(config.output_dir) / "metrics.png", title=name)
        _summary(f"gmpo compare ({name})", runs[name], Path(config.output_dir))
    plot_compare(runs, base / "compare.png")
    print(f"gmpo compare: plot in {base / 'compare.png'}")
    return base


def _summary(what: str, rows: list[dict[str, Any]], out: Path) -> None:
    _, reward = _series(rows, "reward")
    _, lo = _series(rows, "log_ratio/min")
    _, hi = _series(rows, "log_ratio/max")
    k = max(1, min(10, len(reward) // 2))
    parts = [f"{what}: {len(rows)} steps"]
    if reward:
        first, last = sum(reward[:k]) / k, sum(reward[-k:]) / k
        parts.append(f"reward {first:.2f} -> {last:.2f} (mean of first/last {k})")
    if lo and hi:
        parts.append(f"log-ratio range [{min(lo):.3f}, {max(hi):.3f}]")
    print("; ".join(parts) + f"; outputs in {out}")


COMMANDS = {"train": train, "compare": compare}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gmpo`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"gmpo: error: unknown command {command!r} (choose from train, compare)",
            file=sys.stderr,
        )
        return 2
    try:
        COMMANDS[command](rest)
    except CLIError as err:
        print(f"gmpo {command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
