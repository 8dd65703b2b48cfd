"""What the benchmark scripts share: the peak-memory method, the facts their reports record, and
how a script that measures in child processes runs them and publishes what they measured.

The scripts run as ``python benchmarks/<name>.py``, so this directory is on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
#: every measured output: one folder per ``make`` target that writes it
RESULTS = REPO / "results"
IMG_DIR = REPO / "docs" / "img"
# Memory-measuring children allocate every buffer above 128 KiB with mmap and give it back on
# free, so that their resident set follows live memory (glibc's default threshold grows up to
# 32 MiB, after which freed tensors stay resident and hide the next call's allocations from the
# high-water mark).
MEMORY_RESOLUTION_BYTES = 128 * 1024
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MEMORY_RESOLUTION_BYTES)}


# Timing processes keep freed memory for reuse: glibc's mmap threshold fixed at its 32 MiB
# maximum and no trimming. By default whether a freed tensor of a few MiB comes back as resident
# heap or as fresh pages (one page fault per 4 KiB on first touch) depends on the allocation
# history (the threshold adapts, and a 64-byte-aligned request never fits the chunk it adapted
# to): measured, 180 to 950 page faults per call of one implementation, and its time bimodal by
# up to 2.5x from run to run. Every implementation runs under the same setting.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
STEADY_MALLOC = {"M_MMAP_THRESHOLD": 32 * 2**20, "M_TRIM_THRESHOLD": 2**30}


def steady_malloc() -> dict[str, int] | None:
    """Apply :data:`STEADY_MALLOC` to this process (glibc); returns it, or None where it could
    not be applied (the report says which)."""
    libc = ctypes.util.find_library("c")
    if not libc:
        return None
    try:
        mallopt = ctypes.CDLL(libc).mallopt
        ok = mallopt(_M_MMAP_THRESHOLD, STEADY_MALLOC["M_MMAP_THRESHOLD"]) == 1
        ok = mallopt(_M_TRIM_THRESHOLD, STEADY_MALLOC["M_TRIM_THRESHOLD"]) == 1 and ok
    except (OSError, AttributeError):
        return None
    return dict(STEADY_MALLOC) if ok else None


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


#: the CPU flags that decide how fast bf16 runs (vLLM samples a float32 model in bf16)
BF16_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")


def cpu_flags(names: Sequence[str] = BF16_FLAGS) -> list[str]:
    """Which of ``names`` the CPU has (``/proc/cpuinfo``; none where it cannot be read)."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [n for n in names if n in have]
    return []


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


def run_meta(script: str, argv: Sequence[str] | None, trl: str | None) -> dict[str, object]:
    """The facts every report's ``meta`` opens with: the command that reruns ``script`` (``argv``
    None: this process's), the UTC date, the torch and trl versions."""
    import datetime
    import sys

    import torch

    return {
        "command": command_line(script, sys.argv[1:] if argv is None else argv),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "trl": trl,
    }


def environment(result: dict[str, object]) -> list[str]:
    """The facts a report records, as Markdown list items (and into ``result``)."""
    import datetime

    import torch

    facts = {
        "command": f"`{result['command']}`" if result.get("command") else "",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": f"{cpu_model()}, {torch.get_num_threads()} torch threads ({os.cpu_count()} CPUs visible)",
        "load average": loadavg(),
        "gpu": f"{torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"
        if torch.cuda.is_available()
        else "",
        "versions": f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"gmpo {dist_version('gmpo')}, trl {dist_version('trl')}, verl {dist_version('verl')}",
        "allocator": str(result.get("allocator")),
    }
    result.setdefault("environment", facts)
    return [f"- {k}: {v}" for k, v in facts.items() if v]


def write_results(
    stem: Path, result: dict[str, object], text: str, script: str, argv: Sequence[str]
) -> None:
    """``stem``.json (the numbers) and ``stem``.md (the report), with the command that made them."""
    import json

    result["command"] = command_line(script, argv)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(
        text.replace("- command: \n", f"- command: `{result['command']}`\n")
    )
    print(f"wrote {stem}.json and {stem}.md")


def child_or_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    child: Callable[[argparse.Namespace], dict[str, Any]],
    **hidden: str | int,
) -> argparse.Namespace | None:
    """``parser``'s options, a hidden ``--child`` and the hidden options ``hidden`` (name:
    default; what the parent tells a child to measure): a script that measures in child
    processes runs itself with them. Given ``--child``, this process is one measurement: it
    prints ``child(args)`` as one JSON line (which the parent reads) and the options are None."""
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name, default in hidden.items():
        parser.add_argument(
            f"--{name}", type=type(default), default=default, help=argparse.SUPPRESS
        )
    args = parser.parse_args(argv)
    if not args.child:
        return args
    print(json.dumps(child(args)), flush=True)
    return None


def publish(
    stem: Path,
    script: str,
    argv: Sequence[str] | None,
    fields: dict[str, Any],
    report: Callable[[dict[str, Any]], str],
    *,
    start: float,
    write: bool,
) -> int:
    """A measurement's result (:func:`run_meta`'s facts, ``fields``, and ``total_s``, the time
    since ``start``): its ``report`` printed and, where ``write``, both written under ``stem``
    (:func:`write_results`). Returns 0, the script's exit status."""
    result = {**run_meta(script, argv, dist_version("trl")), **fields,
              "total_s": time.perf_counter() - start}  # fmt: skip
    text = report(result)
    print(text)
    if write:
        write_results(stem, result, text, script, sys.argv[1:] if argv is None else argv)
    return 0
