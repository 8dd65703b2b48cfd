"""The ``gmpo`` command's error type."""

from __future__ import annotations


class CLIError(Exception):
    """A user error: reported as one line, no traceback."""
