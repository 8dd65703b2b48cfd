"""verl's console logger, read back: the trainer's ``step:N - key:value - ...`` lines and their
numeric metrics (the tests and ``python -m verl_cpu.e2e summary`` read a run's log with them)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^(?:\(\w+ pid=\d+\) )?(step:(\d+) - .*)$")
_NUMPY = re.compile(r"^np\.\w+\((.*)\)$")  # the v0 trainer logs np.float64(0.1)


def plain(log: str) -> str:
    """The log without its terminal colour codes (Ray colours each worker's prefix)."""
    return _ANSI.sub("", log)


def _lines(log: str) -> list[re.Match[str]]:
    return [m for line in plain(log).splitlines() if (m := _STEP.match(line.strip()))]


def step_lines(log: str) -> list[str]:
    """The console logger's ``step:N - key:value - ...`` lines, without Ray's prefix."""
    return [m.group(1) for m in _lines(log)]


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """Step number -> its numeric metrics, from the console lines."""
    steps: dict[int, dict[str, float]] = {}
    for match in _lines(log):
        metrics: dict[str, float] = {}
        for item in match.group(1).split(" - ")[1:]:
            key, _, value = item.partition(":")
            value = _NUMPY.sub(r"\1", value.strip())
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                continue
        steps[int(match.group(2))] = metrics
    return steps
