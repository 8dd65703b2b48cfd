"""The ``gmpo`` command: ``gmpo train`` and ``gmpo compare``.

    gmpo train                                  # tiny model + toy task on CPU, about a minute
    gmpo train --model path/to/model --max_steps 20 --output_dir runs/mine
    gmpo train --model Qwen/Qwen2.5-Math-1.5B --dataset path/or/hub-id \\
               --reward mypkg.rewards:accuracy --use_vllm true --output_dir runs/qwen
    gmpo train --config run.yaml --max_steps 50  # YAML values, overridden by the command line
    gmpo compare --seeds 5                      # GRPO vs GMPO on 5 seeds each, same task

``gmpo train --help`` lists the options most runs set; ``--help-all`` lists every
``GMPOConfig`` (TRL ``GRPOConfig``) field, each of which is an option. Without a GPU the run is
on the CPU (no flag needed). Under the output directory: ``metrics.jsonl`` (one JSON object per
logged step), ``metrics.png`` (reward, token log-ratio range, clip fractions and entropy per
step), ``summary.json``/``summary.md``; ``compare`` writes ``grpo/seed<k>/``, ``gmpo/seed<k>/``,
``compare.png`` and ``summary.md``. A bad argument gets one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import json
import math
import os
import re
import statistics
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

USAGE = "usage: gmpo {train,compare} [-h] [--help-all] [--model PATH_OR_HUB_ID] [options]"


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
    reward: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward function(s) as module:function (the module in the current directory "
            "or on PYTHONPATH). Default: the toy task's."
        },
    )


@dataclass
class CompareArguments(ScriptArguments):
    """``gmpo compare``'s own options."""

    grpo_epsilon: float = field(
        default=0.2, metadata={"help": "GRPO's clip epsilon (ratio space: 1 ± epsilon)."}
    )
    seeds: int = field(
        default=1,
        metadata={"help": "Train each method on this many seeds (seed, seed + 1, ...)."},
    )


SCRIPT_ARGS = {"train": ScriptArguments, "compare": CompareArguments}


class CLIError(Exception):
    """A user error: reported as one line, no traceback."""


# ----------------------------------------------------------------------------------------------
# help without importing TRL
# ----------------------------------------------------------------------------------------------

#: The TRL (GRPOConfig / TrainingArguments) options most runs set, with the default a run with
#: --model gets. Listed here so that ``--help`` needs no TRL import (seconds);
#: tests/trl/test_cli.py checks each default against GMPOConfig.
COMMON_TRL_OPTIONS: dict[str, tuple[str, Any, str]] = {
    "output_dir": ("DIR", None, "Where metrics, plots and the model go."),
    "learning_rate": ("LR", 1e-06, "AdamW learning rate."),
    "max_steps": ("N", -1, "Optimizer steps (-1: num_train_epochs passes over the dataset)."),
    "num_train_epochs": ("N", 3.0, "Passes over the dataset when max_steps is -1."),
    "per_device_train_batch_size": ("N", 8, "Completions per device per micro-batch."),
    "gradient_accumulation_steps": ("N", 1, "Micro-batches per optimizer step."),
    "num_generations": ("N", 8, "Completions per prompt (the group of GRPO's advantages)."),
    "max_completion_length": ("N", 512, "Longest completion, in tokens."),
    "num_iterations": ("N", 1, "Passes over each generated batch (> 1: off-policy updates)."),
    "beta": ("B", 0.0, "KL coefficient to the reference model (0: no reference model)."),
    "seed": ("N", 42, "Random seed."),
    "bf16": ("BOOL", None, "bfloat16 mixed precision. Default: true on a GPU, false on CPU."),
    "use_cpu": ("BOOL", None, "Train on the CPU. Default: false; true when no GPU is found."),
    "use_vllm": ("BOOL", False, "Generate with vLLM (GPU; pip install vllm)."),
    "logging_steps": ("N", 10, "Log (metrics.jsonl, progress bar) every N optimizer steps."),
}

#: GMPOConfig's own fields shown by --help (help text and default read from config.py).
GMPO_OPTIONS = ("epsilon", "epsilon_high", "delta", "gmpo_impl", "gmpo_lm_head")


def gmpo_field_help() -> dict[str, tuple[Any, str]]:
    """``{field: (default, help)}`` of GMPOConfig's own fields, read from config.py's source
    (importing it imports TRL's trainer stack, which takes seconds)."""
    tree = ast.parse(Path(__file__).with_name("config.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GMPOConfig")
    out: dict[str, tuple[Any, str]] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if not isinstance(node.value, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.value.keywords}
        default = ast.literal_eval(kw["default"]) if "default" in kw else None
        meta = ast.literal_eval(kw["metadata"]) if "metadata" in kw else {}
        out[node.target.id] = (default, meta.get("help", ""))
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != 0 and abs(value) < 1e-3:
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


def toy_settings(command: str) -> dict[str, Any]:
    """The GMPOConfig values of the built-in toy run (no --model), beyond output_dir."""
    args = _toy_defaults(f"gmpo_{command}_output")
    args.update(_COMMAND_DEFAULTS.get(command, {}))
    skip = {"output_dir", "report_to", "disable_tqdm", "save_strategy"}
    return {k: v for k, v in args.items() if k not in skip}


def short_help(command: str) -> str:
    """``gmpo <command> --help``: gmpo's options and the TRL options most runs set."""
    toy = toy_settings(command)
    parser = argparse.ArgumentParser(
        prog=f"gmpo {command}",
        usage=f"gmpo {command} [--help-all] [--config FILE.yaml] [--model PATH_OR_HUB_ID] "
        "[--OPTION VALUE ...]",
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Train with GMPO (TRL's GRPOTrainer, gmpo_core's loss)."
            if command == "train"
            else "Train GRPO (TRL, ratio clip 1 ± grpo_epsilon) and GMPO on the same task and "
            "seeds; plot and summarize the token log-ratio range and the reward."
        )
        + " Defaults are those of a run with --model; [toy: X] is the value used instead "
        "when no --model is given (the built-in toy run).",
    )

    def add(group: Any, name: str, metavar: str, default: Any, text: str) -> None:
        parts = [text.rstrip(".") + "."]
        if default is not None:
            parts.append(f"Default: {_fmt(default)}.")
        if name in toy and toy[name] != default:
            parts.append(f"[toy: {_fmt(toy[name])}]")
        group.add_argument(f"--{name}", metavar=metavar, help=" ".join(parts))

    script = parser.add_argument_group("what to train on")
    for f in dataclasses.fields(ScriptArguments):
        add(script, f.name, f.name.upper(), None, f.metadata["help"])
    script.add_argument("--config", metavar="FILE.yaml", help="Option values from a YAML file; "
                        "the command line wins.")  # fmt: skip
    if command == "compare":
        group = parser.add_argument_group("compare")
        for f in dataclasses.fields(CompareArguments):
            if f.name not in {g.name for g in dataclasses.fields(ScriptArguments)}:
                add(group, f.name, "X", f.default, f.metadata["help"])
    gmpo = parser.add_argument_group("GMPO (gmpo_trl.GMPOConfig)")
    fields = gmpo_field_help()
    for name in GMPO_OPTIONS:
        default, text = fields[name]
        add(gmpo, name, "X", default, text)
    trl = parser.add_argument_group("training (TRL GRPOConfig, the options most runs set)")
    for name, (metavar, default, text) in COMMON_TRL_OPTIONS.items():
        if name == "output_dir":
            default = f"gmpo_{command}_output"
        default = _COMMAND_DEFAULTS.get(command, {}).get(name, default)
        add(trl, name, metavar, default, text)
    help_group = parser.add_argument_group("help")
    help_group.add_argument("-h", "--help", action="store_true", help="This message.")
    help_group.add_argument(
        "--help-all",
        action="store_true",
        help="Every GMPOConfig / GRPOConfig option (imports TRL: several seconds).",
    )
    toy_text = ", ".join(f"{k}={_fmt(v)}" for k, v in toy.items())
    parser.epilog = "\n\n".join(
        textwrap.fill(t)
        for t in (
            "Every GMPOConfig field is an option (--help-all). Without a GPU the run is on the "
            "CPU (use_cpu=true, bf16=false) unless you set them.",
            "Without --model, the built-in toy run: a 2-layer Qwen2-style model with random "
            "weights and a character tokenizer on the successor task (prompt 'd=', reward 1 "
            f"when the completion starts with (d + 1) % 10), with {toy_text}. None of these "
            "applies when --model is given.",
        )
    )
    return parser.format_help()


# ----------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------


def _parser(command: str, config_cls: type) -> Any:
    """A TrlParser whose errors are CLIError (one line) instead of usage + exit."""
    from trl import TrlParser

    class Parser(TrlParser):  # type: ignore[misc]
        def error(self, message: str) -> NoReturn:
            raise CLIError(message)

        def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
            namespace, rest = super().parse_known_args(*args, **kwargs)
            check_counts(vars(namespace))  # before GRPOConfig divides by them
            return namespace, rest

    return Parser((SCRIPT_ARGS[command], config_cls), prog=f"gmpo {command}")


def _toy_defaults(output_dir: str) -> dict[str, Any]:
    from gmpo_trl import toy

    return toy.toy_args(
        output_dir,
        disable_tqdm=False,
        # two optimizer steps per generation, two passes over each batch: updates are off-policy,
        # so the trust region acts and the log-ratio plot shows something (on-policy, r = 0)
        num_iterations=2,
        steps_per_generation=2,
    )


# compare: off-policy passes (num_iterations > 1) also with --model; on-policy every r is 0
_COMMAND_DEFAULTS: dict[str, dict[str, Any]] = {"compare": {"num_iterations": 2}}


def has_accelerator() -> bool:
    """Whether torch sees a GPU (CUDA/ROCm), an Apple GPU (MPS) or an Intel GPU (XPU)."""
    import torch

    if torch.cuda.is_available():
        return True
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def _parse(
    command: str,
    argv: Sequence[str],
    config_cls: type,
    forced: dict[str, Any] | None = None,
) -> tuple[Any, Any]:
    """(script arguments, config) from argv. Precedence: ``forced`` > command line > YAML
    (--config) > the command's defaults > the toy defaults (when no --model is given) > the
    CPU defaults (no accelerator: use_cpu, no bf16) > the dataclass."""
    import yaml

    forced = forced or {}
    parser = _parser(command, config_cls)
    argv = list(argv)
    probe = argparse.ArgumentParser(add_help=False)
    probe.add_argument("--model")
    probe.add_argument("--output_dir")
    probe.add_argument("--config")
    known, _ = probe.parse_known_args(argv)
    output_dir = known.output_dir or f"gmpo_{command}_output"
    base: dict[str, Any] = {"output_dir": output_dir, "report_to": []}
    if not has_accelerator():
        base.update(use_cpu=True, bf16=False)
    if known.model is None:
        base.update(_toy_defaults(output_dir))
    names = {f.name for f in dataclasses.fields(config_cls)}
    defaults = _COMMAND_DEFAULTS.get(command, {})
    base = {k: v for k, v in {**base, **defaults, **forced}.items() if k in names}
    parser.set_defaults_with_config(**base)
    try:
        script, config, rest = parser.parse_args_and_config(argv, return_remaining_strings=True)
    except (ValueError, TypeError) as err:
        raise CLIError(str(err).splitlines()[0]) from err
    except FileNotFoundError as err:  # --config
        raise CLIError(f"--config: no such file {err.filename!r}") from err
    except OSError as err:  # --config names a directory, an unreadable file...
        raise CLIError(f"--config {known.config!r}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise CLIError(f"--config {known.config!r}: not valid YAML: {_yaml_problem(err)}") from err
    if rest:
        raise CLIError(f"unrecognized arguments: {' '.join(rest)}")
    for key, value in forced.items():  # compare's GRPO side
        setattr(config, key, value)
    check_config_values(config)
    return script, config


def _yaml_problem(err: Exception) -> str:
    """A YAML error in one line: the problem and where (YAML's own message spans four)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return (
        problem if mark is None else f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    )


#: TrainingArguments / GRPOConfig counts that TRL takes as given (0 ends in a ZeroDivisionError
#: or a sampler's ValueError, deep in the run); None: the option's own rule decides.
COUNT_OPTIONS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "num_iterations",
    "steps_per_generation",
)


def check_counts(values: dict[str, Any]) -> None:
    """The counts of :data:`COUNT_OPTIONS` are integers >= 1 (or None)."""
    for name in COUNT_OPTIONS:
        value = values.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise CLIError(f"--{name} must be an integer >= 1, got {value!r}")


def check_config_values(config: Any) -> None:
    """What TRL checks only once the run is under way (or never): the learning rate, and an
    output directory that cannot be one."""
    lr = config.learning_rate
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr >= 0):
        raise CLIError(f"--learning_rate must be a finite number >= 0, got {lr!r}")
    check_output_dir(config.output_dir)


def check_output_dir(spec: str) -> None:
    """The output directory, or its nearest existing parent, is a directory (it is made later)."""
    path = Path(spec).expanduser()
    for existing in (path, *path.parents):
        if existing.exists():
            if not existing.is_dir():
                raise CLIError(
                    f"--output_dir {spec!r}: {str(existing)!r} is a file, not a directory"
                )
            return


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _is_path_like(spec: str) -> bool:
    """A spec that can only be a local path (not ``name`` or ``owner/name``)."""
    return (
        spec.startswith(("/", ".", "~"))
        or os.sep in spec.replace("/", "", 1)
        or (_HUB_ID.fullmatch(spec) is None)
    )


def check_model(spec: str) -> None:
    """A local model directory must exist and hold config.json; anything else is a hub id."""
    accepted = (
        "give a local model directory (with config.json, as save_pretrained writes it) or a "
        "hub id such as Qwen/Qwen2.5-Math-1.5B"
    )
    path = Path(spec).expanduser()
    if path.exists():
        if not (path.is_dir() and (path / "config.json").is_file()):
            raise CLIError(f"--model {spec!r}: not a model directory (no config.json); {accepted}")
    elif _is_path_like(spec):
        raise CLIError(f"--model {spec!r}: no such directory; {accepted}")


_DATA_KINDS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
_DATA_ACCEPTED = (
    "give a hub id, a local directory, or a .json/.jsonl/.csv/.parquet file with a 'prompt' column"
)


def check_dataset(spec: str) -> None:
    path = Path(spec).expanduser()
    if path.is_file():
        if path.suffix not in _DATA_KINDS:
            raise CLIError(f"--dataset {spec!r}: not a .json/.jsonl/.csv/.parquet file; "
                           f"{_DATA_ACCEPTED}")  # fmt: skip
    elif not path.is_dir() and (_is_path_like(spec) or path.suffix in _DATA_KINDS):
        raise CLIError(f"--dataset {spec!r}: no such file or directory; {_DATA_ACCEPTED}")


def resolve_reward(spec: str) -> Callable[..., Any]:
    """``module:function`` to the function; the current directory is searched too (a console
    script's sys.path does not hold it)."""
    accepted = "give module:function, the module in the current directory or on PYTHONPATH"
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(f"--reward {spec!r}: not module:function; {accepted}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name is not None and module_name.startswith(err.name):
            raise CLIError(f"--reward {spec!r}: no module {err.name!r} found; {accepted}") from err
        raise CLIError(f"--reward {spec!r}: importing {module_name!r} failed: {err}") from err
    except Exception as err:  # the user's module raised while importing
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CLIError(f"--reward {spec!r}: importing {module_name!r} failed: {line}") from err
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise CLIError(f"--reward {spec!r}: module {module_name} has no function {attr!r}; "
                       f"{accepted}")  # fmt: skip
    return fn  # type: ignore[no-any-return]


def _load_dataset(spec: str, split: str) -> Any:
    from datasets import load_dataset

    check_dataset(spec)
    path = Path(spec).expanduser()
    try:
        if path.is_file():
            data = load_dataset(_DATA_KINDS[path.suffix], data_files=str(path), split=split)
        else:
            data = load_dataset(str(path) if path.is_dir() else spec, split=split)
    except Exception as err:  # datasets raises many types; the user needs the one line
        raise CLIError(f"--dataset {spec!r}: {str(err).splitlines()[0]}") from err
    if "prompt" not in data.column_names:
        raise CLIError(f"--dataset {spec!r}: no 'prompt' column (columns: {data.column_names})")
    return data


def check_inputs(script: ScriptArguments) -> None:
    """What the user named (model, dataset, rewards) before any work is done."""
    if script.model is not None:
        check_model(script.model)
    if script.dataset is not None:
        check_dataset(script.dataset)
    for spec in script.reward:
        resolve_reward(spec)


def _trainer(script: ScriptArguments, config: Any, trainer_cls: type) -> Any:
    """The trainer for the parsed arguments: the toy set-up unless --model is given."""
    from gmpo_trl import toy

    out = Path(config.output_dir)
    rewards = [resolve_reward(r) for r in script.reward] or [toy.successor_reward]
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
        check_model(script.model)
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


# ----------------------------------------------------------------------------------------------
# progress, metrics, plots
# ----------------------------------------------------------------------------------------------


def has_range(row: dict[str, Any]) -> bool:
    """Whether a logged row's token log-ratio range means something: an on-policy step
    (the first pass over a fresh generation) has r = logp - old_logp = 0 on every token."""
    lo, hi = row.get("log_ratio/min"), row.get("log_ratio/max")
    if not (isinstance(lo, int | float) and isinstance(hi, int | float)):
        return False
    return math.isfinite(lo) and math.isfinite(hi) and (lo != 0.0 or hi != 0.0)


def _quiet_progress_bar(trainer: Any) -> None:
    """The Trainer's progress bar, with the reward and the last off-policy log-ratio range as its
    postfix instead of a printed dict per logged step (they are in metrics.jsonl)."""
    from transformers.trainer_callback import ProgressCallback

    class Progress(ProgressCallback):  # type: ignore[misc]
        post: dict[str, str]

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **_: Any) -> None:
            if self.training_bar is None or not logs:
                return
            post = getattr(self, "post", {})
            if isinstance(logs.get("reward"), int | float):
                post["reward"] = f"{logs['reward']:.3g}"
            if has_range(logs):  # on-policy steps keep the last off-policy range
                post["log_r"] = f"[{logs['log_ratio/min']:.3g}, {logs['log_ratio/max']:.3g}]"
            self.post = post
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
    if key.startswith("log_ratio/"):
        rows = [r for r in rows if has_range(r)]
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float)]
    pts = [(s, v) for s, v in pts if math.isfinite(v)]
    return [s for s, _ in pts], [v for _, v in pts]


def clip_bounds(config: Any) -> tuple[float, float]:
    """The clip range of a run in log space: GMPO's (-epsilon, epsilon_high); GRPO's ratio
    range (1 - epsilon, 1 + epsilon_high) as log(1 - epsilon), log(1 + epsilon_high)."""
    eps = float(config.epsilon)
    high = float(config.epsilon_high if config.epsilon_high is not None else eps)
    if getattr(config, "loss_type", "gmpo") == "gmpo":
        return -eps, high
    return math.log(1 - eps) if eps < 1 else -math.inf, math.log1p(high)


def _clip_lines(ax: Any, bounds: tuple[float, float] | None) -> None:
    """The clip range as two dashed lines, one legend entry."""
    if bounds is None:
        return
    label = f"clip range [{bounds[0]:+.2f}, {bounds[1]:+.2f}]"
    for b in bounds:
        if math.isfinite(b):
            ax.axhline(b, color="gray", linestyle="--", linewidth=1, label=label)
            label = "_nolegend_"


def _marker(n: int) -> dict[str, Any]:
    return {"marker": "o", "markersize": 3 if n <= 60 else 1.5}


def plot_training(
    rows: list[dict[str, Any]],
    path: Path,
    title: str = "GMPO",
    bounds: tuple[float, float] | None = None,
) -> None:
    """Reward, token log-ratio range (off-policy steps; the clip range as dashed lines), clip
    fractions and entropy per step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    ax = axes[0]
    steps, values = _series(rows, "reward")
    ax.plot(steps, values, color="tab:green", **_marker(len(steps)))
    ax.set_title("reward")

    ax = axes[1]
    for key, color in (("log_ratio/min", "tab:blue"), ("log_ratio/max", "tab:red")):
        steps, values = _series(rows, key)
        ax.plot(steps, values, color=color, label=key.split("/")[1], **_marker(len(steps)))
    _clip_lines(ax, bounds)
    ax.set_title("token log-ratio range (off-policy steps)")
    ax.legend(fontsize=7)

    ax = axes[2]
    steps, values = _series(rows, "clip_ratio/region_mean")
    if steps:  # the sum, drawn wide and pale under its two parts
        ax.plot(steps, values, color="0.6", linewidth=5, alpha=0.45, label="region (low + high)")
    for key, color, marker in (
        ("clip_ratio/low_mean", "tab:blue", "v"),
        ("clip_ratio/high_mean", "tab:red", "^"),
    ):
        steps, values = _series(rows, key)
        if steps:
            style = {**_marker(len(steps)), "marker": marker}
            ax.plot(steps, values, color=color, label=key.split("/")[1], **style)
    ax.set_title("fraction of tokens clipped")
    ax.legend(fontsize=7)

    ax = axes[3]
    steps, values = _series(rows, "entropy")
    ax.plot(steps, values, color="tab:purple", **_marker(len(steps)))
    ax.set_title("entropy")
    for ax in axes:
        ax.set_xlabel("optimizer step")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _band(runs: list[list[dict[str, Any]]], key: str) -> tuple[list[int], list[float], list[float]]:
    """Per step: the mean over runs and the standard deviation (0 for one run), at the steps
    every run logged."""
    per_run = [dict(zip(*_series(rows, key), strict=True)) for rows in runs]
    steps = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    mean = [statistics.fmean(d[s] for d in per_run) for s in steps]
    std = [statistics.stdev([d[s] for d in per_run]) if len(per_run) > 1 else 0.0 for s in steps]
    return steps, mean, std


def plot_compare(
    runs: dict[str, list[list[dict[str, Any]]]],
    path: Path,
    bounds: dict[str, tuple[float, float]] | None = None,
) -> None:
    """The reward of each method (mean over seeds, ± one standard deviation shaded), and per
    method the token log-ratio range at off-policy steps (the per-step min and max, mean over
    seeds ± one standard deviation) with its clip range dashed, on a shared y axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_seeds = max(len(v) for v in runs.values())
    fig, axes = plt.subplots(1, 1 + len(runs), figsize=(5.5 * (1 + len(runs)), 4))
    colors = {"GRPO": "tab:orange", "GMPO": "tab:green"}
    ax = axes[0]
    for name, seed_rows in runs.items():
        steps, mean, std = _band(seed_rows, "reward")
        c = colors.get(name)
        ax.plot(steps, mean, color=c, label=name, **_marker(len(steps)))
        ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                        [m + s for m, s in zip(mean, std, strict=True)], color=c, alpha=0.2)  # fmt: skip
    ax.set_title(f"reward (mean of {n_seeds} seed{'s' * (n_seeds > 1)} ± std)")
    ax.set_xlabel("optimizer step")
    ax.legend(fontsize=8)
    range_axes = axes[1:]
    for ax, (name, seed_rows) in zip(range_axes, runs.items(), strict=True):
        for key, c in (("log_ratio/min", "tab:blue"), ("log_ratio/max", "tab:red")):
            steps, mean, std = _band(seed_rows, key)
            ax.plot(steps, mean, color=c, label=key.split("/")[1], **_marker(len(steps)))
            ax.fill_between(steps, [m - s for m, s in zip(mean, std, strict=True)],
                            [m + s for m, s in zip(mean, std, strict=True)], color=c, alpha=0.2)  # fmt: skip
        _clip_lines(ax, (bounds or {}).get(name))
        ax.set_title(f"{name}: token log-ratio range")
        ax.set_xlabel("optimizer step (off-policy steps)")
        ax.legend(fontsize=8)
    lo = min(a.get_ylim()[0] for a in range_axes)
    hi = max(a.get_ylim()[1] for a in range_axes)
    for a in range_axes:
        a.set_ylim(lo, hi)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# summaries
# ----------------------------------------------------------------------------------------------

FINAL_STEPS = 10  # "final reward": the mean of the last ten logged rewards


def run_summary(rows: list[dict[str, Any]], global_step: int) -> dict[str, Any]:
    """The numbers a run is summarized by (``summary.json``)."""
    _, reward = _series(rows, "reward")
    ranged = [r for r in rows if has_range(r)]
    k = max(1, min(FINAL_STEPS, len(reward) // 2))
    out: dict[str, Any] = {
        "optimizer_steps": global_step,
        "logged_rows": len(rows),
        "off_policy_rows": len(ranged),
    }
    if reward:
        out.update(reward_first=statistics.fmean(reward[:k]),
                   reward_final=statistics.fmean(reward[-k:]), reward_window=k)  # fmt: skip
    if ranged:
        lo = [r["log_ratio/min"] for r in ranged]
        hi = [r["log_ratio/max"] for r in ranged]
        out.update(
            log_ratio_min=min(lo),
            log_ratio_max=max(hi),
            log_ratio_width_mean=statistics.fmean(h - m for m, h in zip(lo, hi, strict=True)),
        )
    for key in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        _, v = _series(rows, key)
        if v:
            out[key.replace("/", "_") + "_max"] = max(v)
    return out


def summary_line(what: str, s: dict[str, Any]) -> str:
    parts = [f"{what}: {s['optimizer_steps']} optimizer steps ({s['logged_rows']} logged)"]
    if "reward_first" in s:
        parts.append(f"reward {s['reward_first']:.2f} -> {s['reward_final']:.2f} "
                     f"(mean of first/last {s['reward_window']} logged)")  # fmt: skip
    if "log_ratio_min" in s:
        parts.append(f"token log-ratio range [{s['log_ratio_min']:.2f}, {s['log_ratio_max']:.2f}]"
                     f" over {s['off_policy_rows']} off-policy logged steps")  # fmt: skip
    return "; ".join(parts)


def _write_summary(out: Path, s: dict[str, Any], line: str) -> None:
    (out / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    rows = [
        f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in s.items()
    ]
    table = "\n".join(["| quantity | value |", "|---|---:|", *rows])
    (out / "summary.md").write_text(f"{line}\n\n{table}\n")


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


COMPARE_COLUMNS = (
    ("reward_first", "first rewards"),
    ("reward_final", "final reward"),
    ("log_ratio_min", "log-ratio min"),
    ("log_ratio_max", "log-ratio max"),
    ("log_ratio_width_mean", "mean step width"),
    ("clip_ratio_region_mean_max", "max clipped fraction"),
)


def compare_table(per_seed: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """Markdown: per method, mean ± std over seeds of each summary number; then every seed."""
    agg: dict[str, Any] = {}
    head = "| method | seeds | " + " | ".join(t for _, t in COMPARE_COLUMNS) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(COMPARE_COLUMNS)]
    for name, summaries in per_seed.items():
        agg[name] = {}
        cells = []
        for key, _ in COMPARE_COLUMNS:
            vals = [s[key] for s in summaries if key in s]
            if len(vals) == len(summaries) and vals:
                m, sd = _mean_std(vals)
                agg[name][key] = {"mean": m, "std": sd, "values": vals}
                cells.append(f"{m:.2f} ± {sd:.2f}")
            else:
                cells.append("—")
        lines.append(f"| {name} | {len(summaries)} | " + " | ".join(cells) + " |")
    lines += ["", "| method | seed | " + " | ".join(t for _, t in COMPARE_COLUMNS) + " |",
              "|---|---:|" + "---:|" * len(COMPARE_COLUMNS)]  # fmt: skip
    for name, summaries in per_seed.items():
        for s in summaries:
            cells = [f"{s[k]:.2f}" if k in s else "—" for k, _ in COMPARE_COLUMNS]
            lines.append(f"| {name} | {s['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines), agg


# ----------------------------------------------------------------------------------------------
# commands
# ----------------------------------------------------------------------------------------------


def _quiet() -> None:
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # file-writing bars; the training bar is the Trainer's
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*trl.experimental.*")


def _run(script: Any, config: Any, cls: type, title: str) -> dict[str, Any]:
    """Train one run; metrics.png, summary.json/.md in its output directory."""
    trainer = _trainer(script, config, cls)
    trainer.train()
    out = Path(config.output_dir)
    rows = read_metrics(out / "metrics.jsonl")
    plot_training(rows, out / "metrics.png", title=title, bounds=clip_bounds(config))
    s = {"seed": config.seed, **run_summary(rows, trainer.state.global_step)}
    line = summary_line(title, s)
    _write_summary(out, s, line)
    print(f"{line}; outputs in {out}")
    return {"trainer": trainer, "rows": rows, "summary": s}


def train(argv: Sequence[str]) -> Path:
    """``gmpo train``: returns the output directory."""
    from gmpo_trl import GMPOConfig, GMPOTrainer

    script, config = _parse("train", argv, GMPOConfig)
    check_inputs(script)
    _quiet()
    run = _run(script, config, GMPOTrainer, "gmpo train")
    run["trainer"].save_model(str(Path(config.output_dir) / "final"))
    return Path(config.output_dir)


def gmpo_only_options() -> dict[str, bool]:
    """GMPOConfig fields that GRPOConfig does not have: ``{name: is_bool}``."""
    from trl import GRPOConfig

    from gmpo_trl import GMPOConfig

    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    return {
        f.name: f.type in (bool, "bool")
        for f in dataclasses.fields(GMPOConfig)
        if f.name not in grpo
    }


_BOOL_WORDS = {"true", "false", "yes", "no", "1", "0", "t", "f", "y", "n"}


def strip_options(argv: Sequence[str], options: dict[str, bool]) -> list[str]:
    """argv without ``--name value``, ``--name=value`` and (booleans) a bare ``--name``."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in options:
            i += 1
            bare = "=" not in arg
            nxt = argv[i] if i < len(argv) else None
            if bare and nxt is not None and (not options[name] or nxt.lower() in _BOOL_WORDS):
                i += 1
            continue
        out.append(arg)
        i += 1
    return out


def compare(argv: Sequence[str]) -> Path:
    """``gmpo compare``: GRPO, then GMPO, on each seed; returns the output directory."""
    from trl import GRPOConfig

    from gmpo_trl import GMPOConfig, GMPOTrainer
    from gmpo_trl.compare import RangeLoggingGRPOTrainer

    argv = list(argv)
    script, gmpo_config = _parse("compare", argv, GMPOConfig)
    if script.seeds < 1:
        raise CLIError(f"--seeds must be at least 1, got {script.seeds}")
    check_inputs(script)
    # the GRPO side: every option but GMPOConfig's own; GRPO's loss and clip
    grpo_argv = strip_options(argv, gmpo_only_options())
    forced = {"loss_type": "grpo", "epsilon": script.grpo_epsilon, "epsilon_high": None}
    _, grpo_config = _parse("compare", grpo_argv, GRPOConfig, forced)
    base = Path(gmpo_config.output_dir)
    _quiet()
    first_seed = gmpo_config.seed
    runs: dict[str, list[list[dict[str, Any]]]] = {"GRPO": [], "GMPO": []}
    summaries: dict[str, list[dict[str, Any]]] = {"GRPO": [], "GMPO": []}
    bounds = {"GRPO": clip_bounds(grpo_config), "GMPO": clip_bounds(gmpo_config)}
    for k in range(script.seeds):
        seed = first_seed + k
        for name, config, cls in (
            ("GRPO", grpo_config, RangeLoggingGRPOTrainer),
            ("GMPO", gmpo_config, GMPOTrainer),
        ):
            config.seed = seed
            config.output_dir = str(base / name.lower() / f"seed{seed}")
            run = _run(script, config, cls, f"gmpo compare ({name}, seed {seed})")
            runs[name].append(run["rows"])
            summaries[name].append(run["summary"])
    plot_compare(runs, base / "compare.png", bounds)
    table, agg = compare_table(summaries)
    settings = (
        f"GRPO: loss_type='grpo', ratio clip [1 - {grpo_config.epsilon}, 1 + "
        f"{grpo_config.epsilon}]; GMPO: log-space clip [-{gmpo_config.epsilon}, "
        f"{gmpo_config.epsilon_high or gmpo_config.epsilon}]; "
        f"num_iterations={gmpo_config.num_iterations}, "
        f"steps_per_generation={gmpo_config.steps_per_generation}, "
        f"max_steps={gmpo_config.max_steps}, seeds {first_seed}..{first_seed + script.seeds - 1}"
    )
    note = (
        f"First rewards / final reward: mean of the first / last {FINAL_STEPS} logged rewards of a "
        "run (a reward is logged per generation, every num_iterations x steps_per_generation "
        "optimizer steps); log-ratio "
        "min/max: the extremes of r = logp - old_logp over the run's off-policy steps; mean "
        "step width: the mean over those steps of (max - min); mean ± sample std over seeds."
    )
    (base / "summary.md").write_text(f"{settings}\n\n{table}\n\n{note}\n")
    (base / "summary.json").write_text(
        json.dumps({"settings": settings, "aggregate": agg, "runs": summaries}, indent=1) + "\n"
    )
    print(f"\n{settings}\n\n{table}\n\n{note}\n")
    print(f"gmpo compare: plot in {base / 'compare.png'}, table in {base / 'summary.md'}")
    return base


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
    if "--help-all" in rest:
        from gmpo_trl import GMPOConfig

        _parser(command, GMPOConfig).print_help()
        return 0
    if "-h" in rest or "--help" in rest:
        print(short_help(command))
        return 0
    try:
        COMMANDS[command](rest)
    except CLIError as err:
        print(f"gmpo {command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
