"""GMPOTrainer's rollout and training step with vLLM generation against transformers' ``generate``,
on the CPU, and how closely vLLM's sampling log-probs follow the trainer's (docs/vllm.md).

Run in the vLLM environment (``make vllm`` builds one and removes it; to keep it:
``make vllm COMPAT_KEEP=1``, then ``.compat/vllm/bin/python``), from the repository root
(``make figures-vllm`` runs it with ``bench_vllm_runs.py``)::

    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm.py   # ~20 minutes
    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm.py --seeds 2 \
        --control-seeds 1 --sizes tests   # a smaller run (~8 minutes), written like the full one
    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm.py --quick  # writes nothing

**Time** (each model and backend in a fresh subprocess, ``torch.set_num_threads(--threads)``):
``GMPOTrainer`` on the successor toy task (``gmpo_tasks.successor``: 8 prompts x 8 completions a
step, completions of up to ``--completion`` tokens, one generation per optimizer step), with
``use_vllm=True, vllm_mode="colocate"`` or without vLLM (transformers' ``generate``); the same
seed, weights and data; each ``--repeats`` times, the backends alternating, and the table
gives each one's least disturbed repeat (the smallest median step; the JSON holds every
repeat's, and each row the machine's load average as it started). Timed: importing
``GMPOTrainer`` (which imports vLLM where installed, for both backends: TRL does), building the
trainer (the vLLM engine, for vLLM), and for each of
``--steps`` optimizer steps after ``--warmup`` untimed ones, the step (a callback, from
``on_step_begin`` to ``on_step_end``: generation, rewards, the scoring passes, the loss step and
the AdamW step) and the rollout in it (``_generate_single_turn``; for vLLM it includes TRL's
weight sync into the engine). The table gives medians. Models: the tests' (the toy's Qwen2 at
hidden 32, one head of 32, 2 layers) and one several times larger (hidden 256, 8 heads of 32,
4 layers); both random, so completions run long (an EOS is one token in 20).

**Agreement** (``--seeds``, in this process): the tests' run (``tests/vllm/test_sync.py``: 150
steps of 64 one-token completions, learning rate 5e-3) per seed, with vLLM: the largest and the
mean |trainer - vLLM| log-prob of a sampled token over every generation, TRL's
importance-sampling ratio range, and the mean reward of the first and last ten steps; then
``--control-seeds`` runs of 20 steps with TRL's weight sync made a no-op (vLLM keeps the initial
weights): the same gap, largest over the run and at the last generation.

**A real model's generation** (``--real``; ``results/figures-bench/vllm_real_cpu.*``): a real
pretrained model (``--model``, else ``$GMPO_REAL_MODEL``, else SmolLM2-135M-Instruct converted in
gmpo's cache: ``gmpo_tasks.pretrained``; ``make figures-vllm`` passes it), generating with vLLM
against transformers' ``generate``, each backend in a fresh subprocess: ``--real-prompts`` chat
prompts (``_vllm_real.REAL_QUESTIONS``, rendered by the model's chat template) x ``--real-group``
completions of up to ``--completion`` tokens at temperature 1, one batch, as a ``GMPOTrainer``
generates a step's rollouts (``_generate_single_turn``: vLLM through TRL's colocate mode, which
samples the float32 model in bf16; transformers' ``generate`` on the float32 model, through the
trainer without vLLM). One untimed batch (vLLM's first weight sync and, in its eager mode,
dynamo's trace), then ``--real-batches`` timed ones: seconds per batch, generated tokens
(completion tokens up to and with the end-of-sequence token) per second, and each child's thread
count and load average (``--threads``: torch's for transformers; for vLLM the CPUs its worker
binds its OpenMP threads to, ``VLLM_CPU_OMP_THREADS_BIND=0-{threads - 1}``, which also sets
torch's). Backends: ``vllm`` (vLLM as TRL builds it: Inductor-compiled, with its
warm-up pass), ``vllm-eager`` (``VLLM_CPU_CI_ENV=1``, as ``tests/vllm/test_real_model.py`` runs
it: dynamo with eager kernels, no warm-up) and ``transformers``::

    VLLM_CPU_KVCACHE_SPACE=1 .compat/vllm/bin/python benchmarks/bench_vllm.py --real
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from _common import (
    RESULTS,
    child_or_args,
    cpu_flags,
    dist_version,
    environment,
    loadavg,
    publish,
)
from _vllm_real import REAL_BACKENDS, real_child, real_model, real_report, real_timing

#: where this benchmark writes (with the other benchmarks' results; run by hand in the vLLM
#: environment, not by ``make figures-bench``)
RESULTS_DIR = RESULTS / "figures-bench"

#: name -> (hidden size, heads, layers); head_dim 32 in both (vLLM's CPU attention takes >= 32)
SIZES = {"tests": (32, 1, 2), "larger": (256, 8, 4)}


def _model(hidden: int, heads: int, layers: int, seed: int) -> Any:
    from gmpo_tasks.chars import char_tokenizer
    from gmpo_tasks.models import qwen2_model

    return qwen2_model(char_tokenizer(), seed=seed, hidden_size=hidden, heads=heads,
                       layers=layers)  # fmt: skip


def _trainer(out: Path, model: Any, vllm: bool, **overrides: Any) -> Any:
    """As tests/vllm/_support.py builds its trainers: the model saved with its tokenizer."""
    from gmpo_tasks import successor as toy
    from gmpo_tasks.chars import char_tokenizer
    from gmpo_trl import GMPOConfig, GMPOTrainer

    tokenizer, path = char_tokenizer(), out / "init"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    model.config._name_or_path = model.name_or_path = str(path)
    extra = {"use_vllm": True, "vllm_mode": "colocate"} if vllm else {}
    args = GMPOConfig(**toy.toy_args(str(out), gmpo_impl="plain", **extra, **overrides))
    return GMPOTrainer(model=model, reward_funcs=toy.successor_reward, args=args,
                       train_dataset=toy.successor_dataset(seed=args.seed),
                       processing_class=tokenizer)  # fmt: skip


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One (model, backend) timing run; its numbers as a dict (printed as JSON)."""
    if args.real:
        return real_child(args)
    start = time.perf_counter()
    import torch
    from transformers import TrainerCallback

    from gmpo_trl import GMPOTrainer  # noqa: F401  (TRL's trainer, and vLLM with it)

    import_s = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    hidden, heads, layers = SIZES[args.size]
    load = loadavg().split()[0]  # the machine's 1-minute load average as the child starts
    model = _model(hidden, heads, layers, seed=0)
    params = sum(p.numel() for p in model.parameters())
    out = Path(args.out) / f"{args.size}-{args.backend}"
    start = time.perf_counter()
    trainer = _trainer(out, model, args.backend == "vllm", max_steps=args.warmup + args.steps,
                       max_completion_length=args.completion, logging_steps=1)  # fmt: skip
    build_s = time.perf_counter() - start
    rollouts: list[float] = []
    inner = trainer._generate_single_turn

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        result = inner(*a, **k)
        rollouts.append(time.perf_counter() - t0)
        return result

    trainer._generate_single_turn = timed
    steps: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            steps.append(time.perf_counter() - self.t0)

    trainer.add_callback(Clock())
    trainer.train()
    lengths = [r["completions/mean_length"] for r in trainer.state.log_history
               if "completions/mean_length" in r]  # fmt: skip
    w = args.warmup
    return {
        "size": args.size, "backend": args.backend, "params": params, "import_s": import_s,
        "build_s": build_s,
        "step_s": statistics.median(steps[w:]), "rollout_s": statistics.median(rollouts[w:]),
        "steps": len(steps[w:]), "mean_completion_tokens": statistics.mean(lengths[w:]),
        "load_at_start": load,
    }  # fmt: skip


def timing(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each (model, backend) ``--repeats`` times, the backends alternating; the row of each is
    its repeat with the smallest median step (the machine is shared: the least disturbed)."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for size in args.sizes.split(","):
        for backend in ("vllm", "transformers") * args.repeats:
            cmd = [sys.executable, __file__, "--child", "--size", size, "--backend", backend,
                   "--threads", str(args.threads), "--steps", str(args.steps), "--warmup",
                   str(args.warmup), "--completion", str(args.completion), "--out", args.out]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"size"')]
            if proc.returncode != 0 or not lines:
                sys.exit(f"bench_vllm: {size}/{backend} failed:\n{proc.stderr[-3000:]}")
            runs.setdefault((size, backend), []).append(json.loads(lines[-1]))
            print(lines[-1], flush=True)
    rows = []
    for repeats in runs.values():
        best = min(repeats, key=lambda r: r["step_s"])
        rows.append({**best, "repeat_step_s": [r["step_s"] for r in repeats]})
    return rows


def agreement(args: argparse.Namespace) -> dict[str, Any]:
    """The tests' learning run per seed, and the no-sync control."""
    import torch

    torch.set_num_threads(args.threads)
    run = dict(max_completion_length=1, per_device_train_batch_size=64)

    def go(seed: int, steps: int, sync: bool) -> tuple[Any, list[float], list[float]]:
        trainer = _trainer(Path(args.out) / f"agree-{seed}-{sync}", _model(32, 1, 2, seed), True,
                           seed=seed, max_steps=steps, **run)  # fmt: skip
        if not sync:
            trainer.vllm_generation.sync_weights = lambda: None
        gaps, means = [], []
        inner = trainer._generate_and_score_completions

        def wrapped(inputs: Any) -> Any:
            out = inner(inputs)
            mask = out["completion_mask"].bool()
            d = (out["old_per_token_logps"] - out["sampling_per_token_logps"]).abs()[mask]
            gaps.append(float(d.max()))
            means.append(float(d.mean()))
            return out

        trainer._generate_and_score_completions = wrapped
        trainer.train()
        return trainer, gaps, means

    seeds = []
    for seed in range(args.seeds):
        trainer, gaps, means = go(seed, 150, True)
        log = trainer.state.log_history
        reward = [r["reward"] for r in log if "reward" in r]
        seeds.append({
            "seed": seed, "max_gap": max(gaps), "mean_gap": statistics.mean(means),
            "is_ratio_min": min(r["sampling/importance_sampling_ratio/min"] for r in log if "reward" in r),
            "is_ratio_max": max(r["sampling/importance_sampling_ratio/max"] for r in log if "reward" in r),
            "reward_first10": statistics.mean(reward[:10]), "reward_last10": statistics.mean(reward[-10:]),
        })  # fmt: skip
        print(json.dumps(seeds[-1]), flush=True)
    control = []
    for seed in range(args.control_seeds):
        _, gaps, _ = go(seed, 20, False)
        control.append({"seed": seed, "max_gap": max(gaps), "last_gap": gaps[-1]})
        print(json.dumps(control[-1]), flush=True)
    return {"seeds": seeds, "control": control}


def report(rows: list[dict[str, Any]], agree: dict[str, Any] | None, result: dict[str, Any]) -> str:
    lines = ["# vLLM generation against transformers' generate, on the CPU", "",
             *environment(result), f"- vLLM: vllm-cpu {result['vllm']}", "",
             "| model | parameters | backend | import s | build s | step s | rollout s | "
             "rollout share | completion tokens | step speedup | load at start |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    by = {(r["size"], r["backend"]): r for r in rows}
    for (size, backend), r in by.items():
        other = by.get((size, "transformers"))
        speed = f"{other['step_s'] / r['step_s']:.2f}x" if other and backend == "vllm" else "-"
        lines.append(
            f"| {size} | {r['params']:,} | {backend} | {r.get('import_s', 0):.1f} | "
            f"{r['build_s']:.1f} | {r['step_s']:.3f} | "
            f"{r['rollout_s']:.3f} | {r['rollout_s'] / r['step_s']:.0%} | "
            f"{r['mean_completion_tokens']:.1f} | {speed} | {r.get('load_at_start', '-')} |"
        )
    if agree:
        lines += ["", "## Agreement: vLLM's sampling log-probs against the trainer's", "",
                  "| seed | largest gap | mean gap | IS ratio min | IS ratio max | reward first 10 | reward last 10 |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for s in agree["seeds"]:
            lines.append(
                f"| {s['seed']} | {s['max_gap']:.4f} | {s['mean_gap']:.5f} | "
                f"{s['is_ratio_min']:.4f} | {s['is_ratio_max']:.4f} | "
                f"{s['reward_first10']:.3f} | {s['reward_last10']:.3f} |"
            )
        lines += ["", "Without the weight sync (20 steps):", "",
                  "| seed | largest gap | gap at the last generation |", "|---:|---:|---:|"]  # fmt: skip
        for c in agree["control"]:
            lines.append(f"| {c['seed']} | {c['max_gap']:.4f} | {c['last_gap']:.4f} |")
    if "total_s" in result:
        lines += ["", f"The whole benchmark: {result['total_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tests,larger")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each model and backend")
    parser.add_argument("--completion", type=int, default=32, help="max_completion_length")
    parser.add_argument("--seeds", type=int, default=5, help="agreement runs (0: none)")
    parser.add_argument("--control-seeds", type=int, default=2, help="no-sync control runs")
    parser.add_argument("--out", default="runs/bench_vllm")
    parser.add_argument("--quick", action="store_true", help="tiny run, writes nothing")
    parser.add_argument("--real", action="store_true", help="a real model's generation instead")
    parser.add_argument("--model", default=None, help="--real's model directory")
    parser.add_argument("--real-prompts", type=int, default=16)
    parser.add_argument("--real-group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--real-batches", type=int, default=2, help="timed generation batches")
    parser.add_argument("--real-backends", default=",".join(REAL_BACKENDS))
    args = child_or_args(parser, argv, child, size="tests", backend="vllm")
    if args is None:
        return 0
    if args.real:
        return real_main(args, argv)
    if args.quick:
        args.sizes, args.steps, args.warmup, args.seeds, args.control_seeds = "tests", 2, 1, 0, 0
        args.repeats = 1
    start = time.perf_counter()
    rows = timing(args)
    agree = agreement(args) if args.seeds else None
    fields = {"vllm": dist_version("vllm-cpu"), "timing": rows, "agreement": agree}
    return publish(RESULTS_DIR / "vllm_cpu", __file__, argv, fields,
                   lambda result: report(rows, agree, result), start=start, write=not args.quick)  # fmt: skip


def real_main(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``--real``: results/figures-bench/vllm_real_cpu.*"""
    if args.quick:
        args.real_prompts, args.real_group, args.real_batches, args.completion = 2, 2, 1, 4
        args.real_backends = "vllm-eager,transformers"  # no Inductor build (minutes)
    args.model = real_model(args.model)
    import torch

    torch.set_num_threads(args.threads)  # the report's environment line: the children's count
    start = time.perf_counter()
    rows = real_timing(args, __file__)
    fields = {"vllm": dist_version("vllm-cpu"), "model": Path(args.model).name, "cpu_flags": cpu_flags(),
              "prompts": args.real_prompts, "group": args.real_group,
              "completion": args.completion, "batches": args.real_batches, "threads": args.threads,
              "timing": rows}  # fmt: skip
    return publish(RESULTS_DIR / "vllm_real_cpu", __file__, argv, fields,
                   lambda result: real_report(rows, result), start=start, write=not args.quick)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
