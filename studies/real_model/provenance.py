"""What ran, where and when: a results file's header (the commit, a changed tree, the date, the
machine's cores)."""

from __future__ import annotations

import datetime
import os
import subprocess
from typing import Any


def provenance() -> dict[str, Any]:
    """The commit (``git rev-parse HEAD``; ``dirty`` when the tracked files differ from it), the
    UTC time and the CPUs this process may use."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD").strip() or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no").strip()),
        "utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpus": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
    }


def header(p: dict[str, Any]) -> str:
    dirty = " (with uncommitted changes)" if p["dirty"] else ""
    return f"Ran at commit {p['commit']}{dirty}, {p['utc']} UTC, on {p['cpus']} CPUs."
