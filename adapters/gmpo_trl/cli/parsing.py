"""The command line, parsed once: ``--config``'s YAML, then argv, by TRL's parser for the
command's arguments and ``GMPOConfig`` (a superset of ``GRPOConfig``'s fields), into a
:class:`~gmpo_trl.cli.runs.Parsed`.

What the user set (the YAML and the command line) is kept apart from the run's defaults
(:func:`gmpo_trl.cli.defaults.run_defaults`), so that each config a command needs is built from
the same values (:meth:`~gmpo_trl.cli.runs.Parsed.config`), and the names of the options set are
known: every option's default is :data:`_UNSET` while parsing.

The command line is parsed twice, from the same code: first against the table of options
(:mod:`gmpo_trl.cli.trl_options`), which imports no TRL, for the up-front checks
(:mod:`gmpo_trl.cli.upfront`: a typo, a path, a reward, a sampling setting: one line in well
under a second); then by TRL's own parser, which has the last word on every value.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Any, NoReturn

from gmpo_trl.cli import trl_options
from gmpo_trl.cli.commands import COMMANDS
from gmpo_trl.cli.defaults import default_task, run_defaults, settings
from gmpo_trl.cli.errors import CLIError
from gmpo_trl.cli.runs import Parsed
from gmpo_trl.cli.upfront import check_command_line

_UNSET = object()  # the default of every option while parsing: what is not _UNSET, the user set


def trl_parser(command: str) -> Any:
    """A TrlParser whose errors are CLIError (one line) instead of usage + exit (imports TRL:
    seconds)."""
    from trl import TrlParser

    from gmpo_trl import GMPOConfig

    class Parser(TrlParser):  # type: ignore[misc]
        def error(self, message: str) -> NoReturn:
            raise CLIError(message)

    return Parser((COMMANDS[command].arguments, GMPOConfig), prog=f"gmpo {command}")


def full_help(command: str) -> str:
    """``--help-all``: every option, from TRL's parser (imports TRL: seconds)."""
    return str(trl_parser(command).format_help())


def _yaml_problem(err: Exception) -> str:
    """A YAML error in one line: the problem and where (YAML's own message spans four)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return (
        problem if mark is None else f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    )


def read_config_file(path: str) -> dict[str, Any]:
    """``--config``'s option values (a YAML mapping); its ``env`` mapping is put in the
    environment, as TRL's parser does."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError as err:
        raise CLIError(f"--config: no such file {err.filename!r}") from err
    except OSError as err:  # a directory, an unreadable file...
        raise CLIError(f"--config {path!r}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise CLIError(f"--config {path!r}: not valid YAML: {_yaml_problem(err)}") from err
    if not isinstance(data, dict):
        raise CLIError(f"Config file {path} must contain a YAML mapping.")
    env = data.pop("env", {})
    if not isinstance(env, dict):
        raise CLIError("`env` field should be a dict in the YAML file.")
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return data


def _typed(parser: Any, data: dict[str, Any], path: str) -> dict[str, Any]:
    """``--config``'s values as the command line would give them: argparse converts a string
    default only, so a YAML number, list or boolean reached the config as it was (``max_steps:
    [1, 2]`` failed deep in TRL, ``reward: mod:fn`` was split into characters). A list option
    (``nargs='+'``) given one value gets a list of it; an int or float option gets one number
    of its type."""
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    out = dict(data)
    for key, value in data.items():
        action = actions.get(key)
        if action is None or value is None:
            continue
        if action.nargs in ("+", "*"):
            if action.type in (str, float) and not isinstance(value, list | tuple):
                value = [value]
            if action.type is float and isinstance(value, list | tuple):
                value = [_number(float, v, f"--config {path!r}: --{key}") for v in value]
            out[key] = value
        elif action.type in (int, float):
            out[key] = _number(action.type, value, f"--config {path!r}: --{key}")
    return out


def _number(kind: type, value: Any, where: str) -> Any:
    """``value`` (a YAML scalar) as ``kind`` (int or float), as argparse converts the string."""
    problem = f"{where} must be one {kind.__name__}, got {value!r}"
    if isinstance(value, str):
        return value  # argparse converts (and refuses) a string default itself
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CLIError(problem)
    if kind is int and not isinstance(value, int):
        raise CLIError(problem)
    return kind(value)


def _pop_config(argv: list[str]) -> str | None:
    """Remove ``--config FILE`` (or ``--config=FILE``) from argv; return FILE."""
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            return argv.pop(i).split("=", 1)[1]
        if arg == "--config":
            if i + 1 == len(argv):
                raise CLIError("argument --config: expected one argument")
            del argv[i]
            return argv.pop(i)
    return None


def _values(
    parser: Any,
    argv: list[str],
    from_file: dict[str, Any],
    path: str | None,
    *,
    strict: bool = True,
) -> dict[str, Any]:
    """The option values the user set (``--config``'s, then argv's) by ``parser``, whose every
    default is :data:`_UNSET`; an option it does not know is an error, unless not ``strict``."""
    actions = {a.dest for a in parser._actions}
    from_file = _typed(parser, from_file, path) if path is not None else from_file
    for action in parser._actions:  # as TrlParser.set_defaults_with_config: a YAML value is
        if action.dest in from_file:  # the option's default, converted as argparse converts
            action.default = from_file[action.dest]  # a string default
    file_rest = [item for key, value in from_file.items() if key not in actions
                 for item in (f"--{key}", str(value))]  # fmt: skip
    namespace, rest = parser.parse_known_args(argv)
    if (file_rest or rest) and strict:
        raise CLIError(f"unrecognized arguments: {' '.join([*file_rest, *rest])}")
    return {k: v for k, v in vars(namespace).items() if v is not _UNSET}


def _script(command: str, values: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The command's own arguments of ``values``, with the task a run that names none trains
    (:func:`~gmpo_trl.cli.defaults.default_task`), and the config values, the rest."""
    script_cls = COMMANDS[command].arguments
    own = {f.name for f in dataclasses.fields(script_cls)}
    try:
        script = script_cls(**{k: v for k, v in values.items() if k in own})
    except (ValueError, TypeError) as err:
        raise CLIError(str(err).splitlines()[0]) from err
    if "task" not in values:  # with --model and no --dataset, a chat task (default_task)
        script = dataclasses.replace(script, task=default_task(script.model, script.dataset))
    return script, {k: v for k, v in values.items() if k not in own}


def check_values(command: str, values: dict[str, Any]) -> None:
    """The up-front checks (:mod:`gmpo_trl.cli.upfront`) of the option values the user set."""
    script, config_values = _script(command, values)

    def defaults() -> dict[str, Any]:
        return settings(command, model=script.model, output_dir=values.get("output_dir"),
                        task=script.task, dataset=script.dataset)  # fmt: skip

    check_command_line(script, config_values, defaults, task_given="task" in values)


def check_early(command: str, argv: list[str], from_file: dict[str, Any], path: str | None) -> bool:
    """The up-front checks of the command line parsed against the table of options, before TRL
    is imported; whether they ran. Where the installed TRL or transformers is not the table's,
    an option the table does not know is left to TRL's parser, and a command line the table
    cannot parse is checked once TRL's parser has read it (:func:`parse`)."""
    strict = trl_options.table_is_current()
    try:
        values = _values(trl_options.parser(command, _UNSET), argv, dict(from_file), path,
                         strict=strict)  # fmt: skip
    except CLIError:
        if strict:
            raise
        return False
    check_values(command, values)
    return True


def parse(command: str, argv: list[str]) -> Parsed:
    """The command line of ``gmpo <command>``, parsed once (``--config``'s values below it),
    after the up-front checks (:func:`check_early`)."""
    argv = list(argv)
    path = _pop_config(argv)
    from_file = read_config_file(path) if path is not None else {}
    checked = check_early(command, argv, from_file, path)
    parser = trl_parser(command)
    for action in parser._actions:
        if action.default is not argparse.SUPPRESS:
            action.default, action.required = _UNSET, False
    values = _values(parser, argv, from_file, path)
    if not checked:
        check_values(command, values)
    script, config_values = _script(command, values)
    defaults = run_defaults(
        command,
        model=script.model,
        output_dir=values.get("output_dir"),
        task=script.task,
        dataset=script.dataset,
    )
    return Parsed(command, script, config_values, defaults, frozenset(values))
