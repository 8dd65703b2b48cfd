"""The regime study's fixed settings (docs/regime_plan.md): its regimes, losses, tasks, ladder
and seeds; the pilot's rule; and how a step runs one sweep of ``python -m studies.stability``
(its command, the shared warm starts, the summaries it copies). The steps are
:mod:`studies.stability.updates`'."""

from __future__ import annotations

import gzip
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

#: updates per generation batch -> (minibatches, epochs) of the run's Setup; 16 is the first two
#: studies' 8 x 2
REGIMES: dict[int, tuple[int, int]] = {1: (1, 1), 2: (2, 1), 4: (4, 1), 16: (8, 2)}
#: the regimes users run: TRL's default (1), verl's default and TRL's GSPO recipe (4), between
USERS = (1, 2, 4)
#: GMPO first; the other four at their host's documented defaults, as a TRL user gets them
LOSSES = ("gmpo", "grpo", "dapo_trl", "gspo", "cispo_trl")
#: the primary tasks, and the one run after them if the budget allows
TASKS = ("reverse", "spell_backward")
EXTRA_TASK = "chain_sum"
#: the learning rates of the pilot, each twice the one before
LADDER = (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
#: where a loss's pick is the lowest (highest) rate it ran, the pilot runs it at half (twice)
#: that rate too, at most this many times each way
EXTEND = 2
#: the whole study's budget: hours of wall-clock on the two-core machine (docs/regime_plan.md)
BUDGET_H = 8.0
PILOT_SEEDS = (5900, 5901, 5902)
GRID_SEEDS = tuple(range(6000, 6016))
#: the seeds reserved for the real-model cross-check after the grid (descriptive)
CROSS_CHECK_SEEDS = (6100, 6101, 6102)
#: the timing runs' seed (used by the first study; no seed of this study) and learning rate
TIMING: dict[str, Any] = {"seed": 0, "lr": 2e-3, "loss": "gmpo"}

RUNS, RESULTS = Path("runs/updates"), Path("results/updates")


def regime_name(updates: int) -> str:
    return f"u{updates}"


def setup_of(updates: int) -> str:
    m, e = REGIMES[updates]
    return f"minibatches={m},epochs={e}"


def sweep_argv(
    task: str, updates: int, cells: list[tuple[str, float]], seeds: tuple[int, ...], out: Path,
    workers: int = 2, curves_lr: float | None = None,
) -> list[str]:  # fmt: skip
    """One invocation of the study's sweep: ``cells`` (loss, rate) on ``seeds`` of ``task`` at
    ``updates`` updates per batch, no gradient clipping."""
    text = ",".join(f"{v}={lr!r}" for v, lr in cells)
    argv = ["--task", task, "--cells", text, "--grad-clip", "none",
            "--seeds", ",".join(map(str, seeds)), "--setup", setup_of(updates),
            "--workers", str(workers), "--out", str(out)]  # fmt: skip
    lr = curves_lr if curves_lr is not None else cells[0][1]
    return [*argv, "--curves-lr", repr(lr)]


# ---- the pilot's rule ----


def medians(records: list[dict[str, Any]]) -> dict[str, dict[float, float]]:
    """Per loss, per rate: the median over seeds of the final reward."""
    by: dict[tuple[str, float], list[float]] = {}
    for r in records:
        by.setdefault((r["variant"], r["lr"]), []).append(r["final_reward"])
    out: dict[str, dict[float, float]] = {}
    for (v, lr), xs in sorted(by.items()):
        out.setdefault(v, {})[lr] = statistics.median(xs)
    return out


def pick(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The rule on one task's and regime's pilot records: per loss, the rate with the highest
    median final reward over the pilot seeds (on a tie, the lower rate), over every rate it ran
    (the ladder and its extension). ``{"rates": {loss: rate}, "edge": {loss: "low"/"high"}}``:
    ``edge`` names a loss whose pick is the lowest or highest rate it ran."""
    rates: dict[str, float] = {}
    edge: dict[str, str] = {}
    for v, by_lr in medians(records).items():
        best = max(by_lr.values())
        rates[v] = min(lr for lr, m in by_lr.items() if m == best)
        if len(by_lr) > 1 and rates[v] in (min(by_lr), max(by_lr)):
            edge[v] = "low" if rates[v] == min(by_lr) else "high"
    return {"rates": rates, "edge": edge, "medians": {v: {repr(lr): m for lr, m in d.items()}
                                                      for v, d in medians(records).items()}}  # fmt: skip


def extension(records: list[dict[str, Any]], ladder: tuple[float, ...] = LADDER) -> list[Any]:
    """The pilot's next extension: for each loss whose pick is the lowest (highest) rate it ran,
    the (loss, rate) of half (twice) that rate, while that stays within :data:`EXTEND` halvings
    (doublings) of the ladder's end."""
    out = []
    for v, by_lr in medians(records).items():
        rate = pick([r for r in records if r["variant"] == v])["rates"][v]
        if rate == min(by_lr) and rate / 2 >= min(ladder) / 2**EXTEND * (1 - 1e-9):
            out.append((v, rate / 2))
        elif rate == max(by_lr) and rate * 2 <= max(ladder) * 2**EXTEND * (1 + 1e-9):
            out.append((v, rate * 2))
    return out


# ---- the steps ----


def run_sweep(argv: list[str], dry: bool) -> None:
    """Print one sweep's command, then run it (``dry``: print only)."""
    print("python -m studies.stability " + shlex.join(argv), flush=True)
    if not dry:
        subprocess.run([sys.executable, "-m", "studies.stability", *argv], check=True)


def share_warm(out: Path) -> None:
    """Point ``out``'s warm-start cache at its parent's ``warm``: the regimes of a task share
    each seed's warm start (its cache key has no minibatches or epochs), computed once."""
    (out.parent / "warm").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "warm").exists():
        (out / "warm").symlink_to(Path("..") / "warm", target_is_directory=True)


def copy_summaries(src: Path, dst: Path) -> None:
    """A sweep's summary.md and invocations.jsonl into ``dst``, and its summary.json there as
    ``summary.json.gz`` (the committed copy: a sixth of the bytes, the same records)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("summary.md", "invocations.jsonl"):
        shutil.copy(src / name, dst / name)
    data = (src / "summary.json").read_bytes()
    (dst / "summary.json.gz").write_bytes(gzip.compress(data, mtime=0))  # the same bytes each time
    (dst / "summary.json").unlink(missing_ok=True)


def has_records(d: Path) -> bool:
    """Whether ``d`` holds a sweep's records (summary.json, or the committed summary.json.gz)."""
    return (d / "summary.json").exists() or (d / "summary.json.gz").exists()


def records_of(d: Path) -> list[dict[str, Any]]:
    """A sweep's summary.json records (from ``summary.json.gz`` where that is what ``d`` has)."""
    plain = d / "summary.json"
    text = plain.read_text() if plain.exists() else gzip.decompress(
        (d / "summary.json.gz").read_bytes()).decode()  # fmt: skip
    records: list[dict[str, Any]] = json.loads(text)
    return records
