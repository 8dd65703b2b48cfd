"""``gmpo <command> --help``: gmpo's options and the TRL options most runs set, from tables that
need no TRL import (``gmpo_trl.fields.GMPO_FIELDS`` and :data:`~gmpo_trl.cli.defaults.COMMON_TRL_OPTIONS`),
so it prints in well under a second. ``--help-all`` is TRL's parser (:mod:`gmpo_trl.cli.parsing`)."""

from __future__ import annotations

import argparse
import dataclasses
import textwrap
from typing import Any

from gmpo_trl.cli.arguments import ScriptArguments
from gmpo_trl.cli.commands import COMMANDS
from gmpo_trl.cli.defaults import (
    COMMAND_DEFAULTS,
    COMMON_TRL_OPTIONS,
    default_task,
    settings,
    toy_settings,
)
from gmpo_trl.fields import GMPO_FIELDS


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != 0 and abs(value) < 1e-3:
        return f"{value:g}"
    return repr(value) if isinstance(value, str) else str(value)


#: a model's name for the defaults of a run with --model (any name gives the same)
_MODEL = "MODEL"


def model_run_defaults(command: str, dataset: str | None = None) -> dict[str, Any]:
    """The values of :data:`COMMON_TRL_OPTIONS` (and the task's own settings) that a run with
    ``--model`` gets, with ``--dataset`` where ``dataset`` is given: what ``--help`` says is the
    default (the CPU's aside: ``--bf16``, ``--use_cpu``)."""
    run = settings(command, model=_MODEL, output_dir=None, dataset=dataset)
    listed = {name: default for name, (_, default, _) in COMMON_TRL_OPTIONS.items()}
    listed = {**listed, **COMMAND_DEFAULTS.get(command, {})}
    return {**listed, **{k: v for k, v in run.items() if k not in ("report_to", "disable_tqdm")}}


def short_help(command: str) -> str:
    """``gmpo <command> --help``: gmpo's options and the TRL options most runs set."""
    toy = toy_settings(command)
    chat = default_task(_MODEL)
    model_run, with_data = model_run_defaults(command), model_run_defaults(command, "DATA")
    parser = argparse.ArgumentParser(
        prog=f"gmpo {command}",
        usage=f"gmpo {command} [--help-all] [--config FILE.yaml] [--model PATH_OR_HUB_ID] "
        "[--OPTION VALUE ...]",
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(COMMANDS[command].description)
        + f" Defaults: a run with --model (no --dataset: the {chat} task's settings); "
        "[--dataset: X] with --dataset too; [toy: X] without --model (the toy run).",
    )

    listed: set[str] = set()  # options shown here, with their [toy: X] where it differs

    def add(group: Any, name: str, metavar: str, default: Any, text: str) -> None:
        listed.add(name)
        parts = [text.rstrip(".") + "."]
        if default is not None:
            parts.append(f"Default: {_fmt(default)}.")
        if name in with_data and with_data[name] != default:
            parts.append(f"[--dataset: {_fmt(with_data[name])}]")
        if name in toy and toy[name] != default:
            parts.append(f"[toy: {_fmt(toy[name])}]")
        group.add_argument(f"--{name}", metavar=metavar, help=" ".join(parts))

    script_cls = COMMANDS[command].arguments
    base_names = {f.name for f in dataclasses.fields(ScriptArguments)}
    script = parser.add_argument_group("what to train on")
    for f in dataclasses.fields(script_cls):
        if f.name in base_names:  # --held_out: a number; the others' help says their default
            default = f.default if f.name == "held_out" else None
            add(script, f.name, f.name.upper(), default, f.metadata["help"])
    script.add_argument("--config", metavar="FILE.yaml", help="Option values from a YAML file; "
                        "the command line wins.")  # fmt: skip
    own = [f for f in dataclasses.fields(script_cls) if f.name not in base_names]
    if own:
        group = parser.add_argument_group(command)
        for f in own:
            add(group, f.name, "X", f.default, f.metadata["help"])
    gmpo = parser.add_argument_group("GMPO (gmpo_trl.GMPOConfig)")
    for name, option in GMPO_FIELDS.items():
        if option.brief and not option.fixed:
            add(gmpo, name, "X", option.default, option.help)
    trl = parser.add_argument_group("training (TRL GRPOConfig, the options most runs set)")
    for name, (metavar, _, text) in COMMON_TRL_OPTIONS.items():
        add(trl, name, metavar, model_run[name], text)
    help_group = parser.add_argument_group("help")
    help_group.add_argument("-h", "--help", action="store_true", help="This message.")
    help_group.add_argument(
        "--help-all",
        action="store_true",
        help="Every GMPOConfig / GRPOConfig option (imports TRL: several seconds).",
    )
    toy_text = ", ".join(f"{k}={_fmt(v)}" for k, v in toy.items() if k not in listed)
    chat_text = ", ".join(f"{k}={_fmt(v)}" for k, v in model_run.items()
                          if k not in listed and k not in with_data)  # fmt: skip
    parser.epilog = "\n\n".join(
        textwrap.fill(t)
        for t in (
            "Every GMPOConfig field is an option (--help-all).",
            f"--model alone trains the {chat} task (docs/real_model.md), also with {chat_text}.",
            "Without --model (and --task), the toy run: a tiny Qwen2-style model on the "
            f"successor task ('d=' -> (d + 1) % 10), with {toy_text} and the [toy: X] values.",
        )
    )
    return parser.format_help()
