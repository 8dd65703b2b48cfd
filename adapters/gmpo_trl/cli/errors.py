"""The ``gmpo`` command's error type."""

from __future__ import annotations


class CLIError(Exception):
    """A user error: reported as one line, no traceback."""


class Interrupted(Exception):
    """Ctrl-C during training: the run's outputs for the steps done are written; its message is
    the one line, and the exit status 130 (128 + SIGINT)."""
