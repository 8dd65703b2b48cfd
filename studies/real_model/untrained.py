"""The untrained model's reward on each chat task, on the calibration seeds only.

    python -m studies.real_model.untrained --out results/real-model

A chat task's reward must start where a run can move it: the untrained model's mean reward on
the task's prompts between 0.05 and 0.6 (:data:`BAND`). Measured on held-out questions (which
no training draw holds: ``ChatTask.held_out``) of the calibration seeds 900, 901 and 902
(``held_out(n, seed="calibration:<s>")``, draws of their own, not the evaluation's), sampled as
a run samples (the task's temperature and completion length: ``ChatTask.settings``) by the
held-out evaluation's code (``gmpo_trl.cli.held_out``). Writes ``calibration.json`` and ``calibration.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from studies.real_model.provenance import header, provenance

SEEDS = (900, 901, 902)
BAND = (0.05, 0.6)
PROMPTS = 32
SAMPLES = 4


def calibrate(task_name: str, model_name: str, prompts: int, samples: int) -> dict[str, Any]:
    """Per calibration seed, the untrained model's mean reward and share right on ``prompts``
    prompts x ``samples`` completions; their mean; and whether every seed is in the band."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmpo_tasks import pretrained
    from gmpo_tasks.catalog import get_task
    from gmpo_trl.cli.held_out import held_out_reward

    task = get_task(task_name)
    path = pretrained.resolve(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    cell = task.settings  # type: ignore[attr-defined]
    per_seed = {}
    start = time.monotonic()
    for seed in SEEDS:
        entries = task.held_out(prompts, seed=f"calibration:{seed}")  # type: ignore[attr-defined]
        per_seed[seed] = held_out_reward(
            model, tokenizer, task, entries=entries, samples=samples,
            max_tokens=cell.completion_length, temperature=cell.temperature,
        )  # fmt: skip
    rewards = [r["reward"] for r in per_seed.values()]
    return {
        "task": task_name,
        "model": model_name,
        "prompts": prompts,
        "samples": samples,
        "temperature": cell.temperature,
        "max_completion_length": cell.completion_length,
        "per_seed": {str(s): r for s, r in per_seed.items()},
        "mean_reward": statistics.fmean(rewards),
        "in_band": all(BAND[0] <= r <= BAND[1] for r in rewards),
        "seconds": time.monotonic() - start,
    }


def report(rows: list[dict[str, Any]], about: dict[str, Any]) -> str:
    lines = [
        "# The chat tasks' calibration: the untrained model's reward",
        "",
        f"`python -m studies.real_model.untrained`. {header(about)} Band: every calibration "
        f"seed's mean reward in [{BAND[0]}, {BAND[1]}].",
        "",
        "| task | model | seed 900 | seed 901 | seed 902 | mean | right (mean) | in band | "
        "completions per seed | temperature | max tokens | seconds |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        seeds = [r["per_seed"][str(s)] for s in SEEDS]
        right = statistics.fmean(s["right"] for s in seeds)
        lines.append(
            f"| {r['task']} | {r['model']} | "
            + " | ".join(f"{s['reward']:.3f}" for s in seeds)
            + f" | {r['mean_reward']:.3f} | {right:.3f} | {'yes' if r['in_band'] else 'no'} | "
            f"{r['prompts']} x {r['samples']} | {r['temperature']:g} | "
            f"{r['max_completion_length']} | {r['seconds']:.0f} |"
        )
    lines += ["", "Reward: the task's (the gym's score_answer of the answer in the reply); right: "
              "the share of completions whose reward is 1."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from gmpo_tasks.catalog import TASKS

    chat = [name for name, t in TASKS.items() if t.model_name is not None]
    p = argparse.ArgumentParser(prog="python -m studies.real_model.untrained")
    p.add_argument("--tasks", default=",".join(chat), help="comma-separated chat tasks")
    p.add_argument("--prompts", type=int, default=PROMPTS)
    p.add_argument("--samples", type=int, default=SAMPLES)
    p.add_argument("--out", default="results/real-model")
    args = p.parse_args(argv)
    about = provenance()
    rows = [calibrate(name, TASKS[name].model_name or "", args.prompts, args.samples)
            for name in args.tasks.split(",")]  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps({**about, "rows": rows}, indent=1) + "\n")
    (out / "calibration.md").write_text(report(rows, about))
    print(report(rows, about))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
