"""The sweep's files, each written whole or not at all, and read back or computed again.

A run's file, a warm start, the invocation log and the summary are written to a temporary file
beside their path, then renamed over it (:func:`write_atomic`): a write cut short (a kill, a
full disk) leaves the previous file, or none, never part of one. A file that cannot be read all
the same (one cut short by an earlier version of the study) reads as None (:func:`read_json`),
with a line that names it, and the sweep computes it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_atomic(path: Path, data: bytes | str) -> None:
    """``data`` (a str as UTF-8) as the whole content of ``path``: written and synced to a
    temporary file in the same folder, then renamed over ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_json(path: Path) -> Any | None:
    """The JSON value in ``path``; None where there is no such file, or where it cannot be read
    (then one line names it: the caller computes it again)."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError included
        print(f"{path}: cannot be read ({type(err).__name__}): computing it again", flush=True)
        return None
