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
``compare.png`` and ``summary.md``. A bad argument gets one line on stderr and exit status 2;
Ctrl-C stops a run with its metrics, plot and summary of the steps done, and exit status 130.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gmpo_trl.cli.commands import COMMANDS, USAGE
from gmpo_trl.cli.errors import CLIError, Interrupted

# The package: ``commands`` (the command list), ``base`` (what a command is: an object with its
# arguments and its ``run(parsed)``), one module per command (``train``, ``compare``),
# ``arguments`` (each command's own arguments), ``defaults`` (the defaults of a run; no TRL
# import), ``help`` (``--help`` from those tables), ``trl_options`` (TRL's options, read without
# TRL: ``option_table``), ``upfront`` (the checks before TRL is imported), ``parsing`` (argv
# and --config to a ``runs.Parsed``, once), ``runs`` (a run's plan, built and checked once, its
# trainer and its outputs), ``checks`` (model, dataset, rewards, counts, output directory: before any work),
# ``callbacks``, ``reports`` and ``plots`` (pure functions of the logged rows). The built-in
# tasks are ``gmpo_tasks.catalog.TASKS``.


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gmpo`` console script. Ctrl-C ends it with one line and status 130
    (during training, after the summary and plot of the steps done); a reader that closed the
    pipe (``gmpo train --help | head``) ends it quietly, with status 141 (128 + SIGPIPE)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = f"gmpo {argv[0]}" if argv and argv[0] in COMMANDS else "gmpo"
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
    except BrokenPipeError:
        # Python's recipe: no further writes (nor the flush at exit) to the closed pipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Interrupted as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return status


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "\n\n" + (__doc__ or "").strip())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"gmpo: error: unknown command {command!r} (choose from {', '.join(COMMANDS)})",
            file=sys.stderr,
        )
        return 2
    if "--help-all" in rest:
        from gmpo_trl.cli.parsing import full_help

        print(full_help(command), end="")
        return 0
    if "-h" in rest or "--help" in rest:
        from gmpo_trl.cli.help import short_help

        print(short_help(command))
        return 0
    from gmpo_trl.cli.parsing import parse

    try:
        COMMANDS[command].run(parse(command, rest))
    except CLIError as err:
        print(f"gmpo {command}: error: {err}", file=sys.stderr)
        return 2
    return 0
