"""Every option of ``gmpo train`` and ``gmpo compare``, known without importing TRL: the parser
of the up-front checks (:mod:`gmpo_trl.cli.upfront`), so that a typo, a value of the wrong type
or an unknown choice gets its one line in well under a second, not after the five seconds of
CPU that importing TRL's ``GRPOConfig`` (transformers' ``TrainingArguments``) costs.

The options are TRL's parser's (``TrlParser`` of the command's arguments and ``GMPOConfig``),
written down in :mod:`gmpo_trl.cli.option_table` with the TRL and transformers versions they
were read from. ``tests/trl/test_cli_upfront.py`` fails when the installed versions' parser
differs from the table; ``python -m gmpo_trl.cli.trl_options`` writes it again. Where the installed
versions are not the table's (a user's other TRL release), an option the table does not know is
left to TRL's parser, which still has the last word on every value.
"""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path
from typing import Any

from gmpo_tasks.catalog import TASKS
from gmpo_trl.cli.errors import CLIError

#: the packages whose versions decide the table
PACKAGES = ("trl", "transformers")


def _to_bool(value: Any) -> bool:
    """transformers' ``string_to_bool``: yes/true/t/y/1 and no/false/f/n/0, any case."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("yes", "true", "t", "y", "1"):
        return True
    if text in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(
        f"Truthy value expected: got {value} but expected one of yes/no, true/false, t/f, y/n, "
        "1/0 (case insensitive)."
    )


def _type(kind: str) -> Any:
    """The converter of an option's values (argparse names it in its error: ``invalid int
    value``, as TRL's parser does)."""
    if kind == "bool":
        return _to_bool
    return {"int": int, "float": float}.get(kind, str)


def installed_versions() -> dict[str, str | None]:
    """The installed versions of :data:`PACKAGES` (None: not installed), read from their
    metadata, without importing them."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def table_is_current() -> bool:
    """Whether the table was read from the installed TRL and transformers."""
    from gmpo_trl.cli.option_table import VERSIONS

    return installed_versions() == VERSIONS


#: options whose choices are gmpo's own lists, read when parsing (a task added to the catalog
#: needs no new table)
_OURS = {"task": lambda: tuple(TASKS)}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise CLIError(message)


def parser(command: str, unset: object) -> argparse.ArgumentParser:
    """An argparse parser of ``command``'s options as the table writes them: the same option
    strings, value counts, conversions and choices as TRL's, and every default ``unset``."""
    from gmpo_trl.cli.option_table import ACTIONS, OWN

    out = _Parser(prog=f"gmpo {command}", add_help=False, allow_abbrev=True)
    for strings, dest, nargs, kind, choices in (*ACTIONS, *OWN.get(command, ())):
        if kind == "false":
            out.add_argument(*strings, dest=dest, action="store_false", default=unset)
            continue
        kwargs: dict[str, Any] = {"dest": dest, "default": unset, "type": _type(kind)}
        if nargs is not None:
            kwargs["nargs"] = nargs
        if nargs == "?":
            kwargs["const"] = True
        if dest in _OURS:
            choices = _OURS[dest]()
        if choices is not None:
            kwargs["choices"] = choices
        out.add_argument(*strings, **kwargs)
    return out


def read_actions(trl_parser: Any) -> list[tuple[tuple[str, ...], str, Any, str, Any]]:
    """The table's rows of a ``TrlParser``: (option strings, dest, nargs, kind, choices)."""
    rows = []
    for action in trl_parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._StoreFalseAction):
            kind = "false"
        else:
            name = getattr(action.type, "__name__", "")
            kind = {"int": "int", "float": "float", "string_to_bool": "bool"}.get(name, "str")
        choices = None if action.choices is None else tuple(str(c) for c in action.choices)
        if action.dest in _OURS:
            choices = None
        rows.append((tuple(action.option_strings), action.dest, action.nargs, kind, choices))
    return rows


def table_text() -> str:
    """The text of :mod:`gmpo_trl.cli.option_table`, read from the installed TRL (imports it):
    the actions of the parser :func:`gmpo_trl.cli.parsing.trl_parser` builds."""
    from trl import TrlParser

    from gmpo_trl import GMPOConfig
    from gmpo_trl.cli.commands import COMMANDS

    def actions(command: str) -> list[tuple[tuple[str, ...], str, Any, str, Any]]:
        return read_actions(TrlParser((COMMANDS[command].arguments, GMPOConfig)))

    train = actions("train")
    own = {"compare": [r for r in actions("compare") if r not in train]}
    lines = [
        '"""The options of TRL\'s parser for ``gmpo train`` and ``gmpo compare``: written by',
        '``python -m gmpo_trl.cli.trl_options`` (:mod:`gmpo_trl.cli.trl_options`); do not edit."""',
        "",
        "# fmt: off",
        "from typing import Any",
        "",
        f"VERSIONS: dict[str, str | None] = {installed_versions()!r}",
        "",
        "#: (option strings, dest, nargs, kind, choices): kind is str, int, float, bool, or false",
        "#: (a --no_ flag); the rows of gmpo train's parser",
        "ACTIONS: tuple[tuple[Any, ...], ...] = (",
        *(f"    {row!r}," for row in train),
        ")",
        "#: each other command's rows beyond train's",
        "OWN: dict[str, tuple[tuple[Any, ...], ...]] = {",
    ]
    for command, rows in own.items():
        lines += [f"    {command!r}: (", *(f"        {row!r}," for row in rows), "    ),"]
    lines += ["}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    path = Path(__file__).with_name("option_table.py")
    path.write_text(table_text())
    print(f"wrote {path}")
