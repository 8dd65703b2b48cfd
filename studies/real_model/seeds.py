"""``gmpo train`` on the real model, several seeds: each run's wall-clock time, peak memory, disk
and held-out reward before and after, and the reward curves over seeds.

    python -m studies.real_model.seeds --task chat_chain_sum --seeds 0,1,2 --out results/real-model

Each seed is one ``gmpo train --task TASK --seed S`` in a subprocess of its own (the command a
user types, with its defaults), so that its peak resident memory (``ru_maxrss`` of the child) and
wall-clock time are the run's alone; its outputs go to ``--runs`` (default ``runs/real-model``).
Writes ``train_TASK.json`` (per seed: the summary ``gmpo train`` writes, time, memory, disk, and
the logged rewards) and ``train_TASK.md``, and the figure ``--figure`` (the reward per
optimizer step of each seed, and their mean). Extra arguments after ``--`` go to every
``gmpo train``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from studies.real_model.provenance import header, provenance


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_seed(task: str, seed: int, out: Path, extra: list[str]) -> dict[str, Any]:
    """One ``gmpo train`` run; its summary with ``seconds``, ``peak_rss_mb`` and ``disk_mb``."""
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "gmpo_trl.cli", "train", "--task", task, "--seed", str(seed),
            "--output_dir", str(out), *extra]  # fmt: skip
    print(" ".join(argv[2:]), flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(argv)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(
            f"gmpo train (seed {seed}) failed: exit {os.waitstatus_to_exitcode(status)}"
        )
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line]
    rewards = [(r["step"], r["reward"]) for r in rows if isinstance(r.get("reward"), int | float)]
    return {
        **summary,
        "seconds": seconds,
        "peak_rss_mb": usage.ru_maxrss / 1024,  # KiB on Linux
        "disk_mb": disk_bytes(out) / 2**20,
        "rewards": rewards,
    }


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    for r in runs:
        steps, values = zip(*r["rewards"], strict=True)
        ax.plot(steps, values, linewidth=0.8, alpha=0.5, label=f"seed {r['seed']}")
    common = sorted(set.intersection(*(set(s for s, _ in r["rewards"]) for r in runs)))
    by_seed = [dict(r["rewards"]) for r in runs]
    mean = [statistics.fmean(d[s] for d in by_seed) for s in common]
    ax.plot(common, mean, color="black", linewidth=2, label="mean over seeds")
    before = statistics.fmean(r["held_out_reward_before"] for r in runs)
    after = statistics.fmean(r["held_out_reward_after"] for r in runs)
    ax.axhline(before, color="tab:red", linestyle="--", linewidth=1,
               label=f"held-out, untrained ({before:.2f})")  # fmt: skip
    ax.axhline(after, color="tab:green", linestyle="--", linewidth=1,
               label=f"held-out, trained (mean {after:.2f})")  # fmt: skip
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward (training batch)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(task: str, runs: list[dict[str, Any]], about: dict[str, Any], command: str) -> str:
    gain = [r["held_out_reward_after"] - r["held_out_reward_before"] for r in runs]
    lines = [
        f"# gmpo train on the real model: {task}, {len(runs)} seeds",
        "",
        f"`{command}`. {header(about)}",
        "",
        "| seed | held-out reward before | after | gain | right before | right after | "
        "training reward first / last 10 | off-policy rows | log-ratio range | wall clock (s) | "
        "peak RSS (MB) | disk (MB) |",
        "|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for r, g in zip(runs, gain, strict=True):
        rewards = [v for _, v in r["rewards"]]
        first, last = statistics.fmean(rewards[:10]), statistics.fmean(rewards[-10:])
        span = (f"[{r['log_ratio_min']:.2f}, {r['log_ratio_max']:.2f}]"
                if "log_ratio_min" in r else "—")  # fmt: skip
        lines.append(
            f"| {r['seed']} | {r['held_out_reward_before']:.3f} | {r['held_out_reward_after']:.3f} "
            f"| {g:+.3f} | {r['held_out_right_before']:.3f} | {r['held_out_right_after']:.3f} | "
            f"{first:.3f} / {last:.3f} | {r['off_policy_rows']} | {span} | {r['seconds']:.0f} | "
            f"{r['peak_rss_mb']:.0f} | {r['disk_mb']:.0f} |"
        )
    mean_gain = statistics.fmean(gain)
    lines += [
        "",
        f"Mean held-out gain over seeds: {mean_gain:+.3f} (held-out reward "
        f"{statistics.fmean(r['held_out_reward_before'] for r in runs):.3f} -> "
        f"{statistics.fmean(r['held_out_reward_after'] for r in runs):.3f}); wall clock "
        f"{min(r['seconds'] for r in runs):.0f}-{max(r['seconds'] for r in runs):.0f} s a run; "
        f"peak RSS {max(r['peak_rss_mb'] for r in runs):.0f} MB.",
        "",
        f"Held-out: {runs[0]['held_out_completions']} completions ({runs[0]['held_out_completions'] // 4} "
        "held-out prompts, questions no training draw holds, 4 samples each, at the run's temperature and "
        "completion length), scored by the task's reward; right: the share whose reward is 1. "
        "Training reward: the mean reward of each logged step's batch. Wall clock: the whole "
        "command, model loading and both held-out evaluations included.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m studies.real_model.seeds")
    p.add_argument("--task", default="chat_chain_sum")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="results/real-model")
    p.add_argument("--runs", default="runs/real-model")
    p.add_argument("--figure", default="docs/img/real_model_reward.png")
    args = p.parse_args(argv)
    about = provenance()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = [run_seed(args.task, s, Path(args.runs) / args.task / f"seed{s}", extra) for s in seeds]
    command = f"python -m studies.real_model.seeds {' '.join(argv)}"
    if extra:
        command += f" -- {' '.join(extra)}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = {**about, "task": args.task, "command": command, "runs": runs}
    (out / f"train_{args.task}.json").write_text(json.dumps(data, indent=1) + "\n")
    text = report(args.task, runs, about, command)
    (out / f"train_{args.task}.md").write_text(text)
    plot(runs, Path(args.figure), f"gmpo train --task {args.task} (SmolLM2-135M-Instruct, CPU)")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
