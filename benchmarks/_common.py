"""What the benchmark scripts share: the peak-memory method, and the facts their reports record.

The scripts run as ``python benchmarks/<name>.py``, so this directory is on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.metadata
import os
import platform
import shlex
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
IMG_DIR = REPO / "docs" / "img"
# Memory-measuring children allocate every buffer above 128 KiB with mmap and give it back on
# free, so that their resident set follows live memory (glibc's default threshold grows up to
# 32 MiB, after which freed tensors stay resident and hide the next call's allocations from the
# high-water mark).
MEMORY_RESOLUTION_BYTES = 128 * 1024
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MEMORY_RESOLUTION_BYTES)}


def proc_status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss(trim: bool = True) -> int:
    """Reset VmHWM to the current VmRSS (``echo 5 > /proc/self/clear_refs``) and return VmRSS in
    KiB. ``trim`` first gives freed heap pages back to the OS (``malloc_trim(0)``), so that a
    step's allocations cannot hide in memory that is resident but free."""
    if trim:
        libc = ctypes.util.find_library("c")
        if libc:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(libc).malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return proc_status_kib("VmRSS")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def loadavg() -> str:
    with contextlib.suppress(OSError, IndexError):
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    return "unknown"


def dist_version(name: str) -> str | None:
    """An installed distribution's version (without importing it), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command that reruns ``script`` with ``argv`` from the repository root."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(script)))
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(script, repo), *argv])
