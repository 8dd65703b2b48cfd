"""GMPO loss forward+backward: gmpo's plain and compiled paths against TRL's and verl's GMPO.

Run from the repository root (``benchmarks/README.md`` explains the method)::

    python benchmarks/bench_loss.py            # the full run; writes results/figures-bench/loss_cpu.*
    python benchmarks/bench_loss.py --quick    # tiny shapes, no compile study: proves it runs (CI)

Four things, in one run:

* **time per call**: the median of repeated forward+backward calls on the same inputs, after
  warm-up calls (compilation excluded), the implementations taking turns call by call so that
  drift hits them alike; at (2, 16) it is each implementation's per-call overhead. With one
  torch thread (``--threads 1``, the default) the clock is the thread's CPU time, which other
  processes on the same cores do not inflate; with more threads it is wall time.
* **peak extra memory** of one call, in a fresh subprocess per (implementation, shape): its
  resident high-water mark over the inputs (the gradient of ``logp`` counts).
* **compile time**: the first call of ``impl="compiled"`` in a fresh process with an empty
  Inductor cache, for float32, bf16 and with the KL term.
* **break-even**: a new user's loop, sequence lengths changing every step (200 calls, B in
  8..32, T in 50..2000, one thread), in a fresh process per path with an empty Inductor cache:
  the first call's wall time (compilation), the CPU time of the other calls, and after how many
  calls compiling pays for itself.

Rows: ``gmpo plain`` / ``gmpo compiled`` (``gmpo_loss(impl=...)``, its metrics built), ``TRL``
(TRL 1.16.0's loss and metric lines, transcribed in ``_hosts.py``), ``verl`` (verl 0.9.1's
``compute_policy_loss_geo_mean``, with its ``.item()`` calls, transcribed in ``_hosts.py``: no
host needs to be installed). Every timing process uses the
same allocator setting (``_common.steady_malloc``).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import (
    MALLOC_ENV,
    RESULTS,
    command_line,
    environment,
    proc_status_kib,
    reset_peak_rss,
    steady_malloc,
    write_results,
)
from _hosts import EPSILON, trl_gmpo_loss, verl_config, verl_geo_mean_loss
from torch import Tensor

from gmpo_core import gmpo_loss

#: where this benchmark writes (``make figures-bench``)
RESULTS_DIR = RESULTS / "figures-bench"

SHAPES = ((2, 16), (8, 256), (64, 2048), (256, 4096))
QUICK_SHAPES = ((2, 16), (8, 256))
IMPLS = ("gmpo plain", "gmpo compiled", "TRL", "verl")
Step = Callable[[], Tensor]


DEVICE = torch.device("cpu")  # --device


def make_inputs(
    batch: int, seq: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """GRPO-like inputs: log-probs <= 0, old_logp within N(0, 0.2) of them (a few % of tokens
    beyond each clip bound), right-padded rows of random length, ~20 % truncated at T."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.empty(batch, seq).exponential_(generator=g)
    lengths = torch.randint(1, seq + seq // 4 + 1, (batch,), generator=g).clamp(max=seq)
    x = {
        "logp": logp,
        "old_logp": logp + 0.2 * torch.randn(batch, seq, generator=g),
        "advantages": torch.randn(batch, generator=g),
        "mask": torch.arange(seq) < lengths[:, None],
    }
    x = {
        k: v.to(DEVICE, dtype if v.is_floating_point() and k != "advantages" else v.dtype)
        for k, v in x.items()
    }
    x["logp"].requires_grad_()
    return x


def make_step(impl: str, x: dict[str, Tensor], backward_too: bool = True) -> Step:
    """One forward+backward of ``impl`` on ``x`` (the forward alone without ``backward_too``);
    returns the loss."""
    logp, old, adv, mask = x["logp"], x["old_logp"], x["advantages"], x["mask"]

    def backward(loss: Tensor) -> Tensor:
        if backward_too:
            loss.backward()
            logp.grad = None
        return loss

    if impl.startswith("gmpo"):
        path = impl.split()[1]

        def gmpo() -> Tensor:
            out = gmpo_loss(logp, old, adv, mask, epsilon=EPSILON, impl=path)  # type: ignore[arg-type]
            _ = out.metrics  # the metric tensors, as the hosts build them
            return backward(out.loss)

        return gmpo
    if impl == "TRL":
        int_mask = mask.long()  # TRL's completion_mask is int64
        return lambda: backward(trl_gmpo_loss(logp, old, adv, int_mask)[0])
    geo_mean = verl_geo_mean_loss
    response_mask = mask.float()  # verl's response_mask is float, its advantages per token
    per_token_adv = adv.unsqueeze(-1) * response_mask
    config = verl_config(mask.shape[0], int(mask.sum()))
    kw = {"loss_agg_mode": "seq-mean-token-mean", "config": config}
    return lambda: backward(
        geo_mean(
            old_log_prob=old,
            log_prob=logp,
            advantages=per_token_adv,
            response_mask=response_mask,
            **kw,
        )[0]
    )


def time_shape(shape: tuple[int, int], impls: list[str], repeats: int) -> dict[str, float]:
    """Median milliseconds per call of each implementation, taking turns call by call."""
    x = make_inputs(*shape)
    steps = {impl: make_step(impl, x) for impl in impls}
    for step in steps.values():
        for _ in range(3):  # warm-up (the compiled path compiles here)
            step()
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else (lambda: None)
    cpu_clock = DEVICE.type == "cpu" and torch.get_num_threads() == 1
    clock = time.thread_time if cpu_clock else time.perf_counter
    for _ in range(repeats):
        for impl, step in steps.items():
            sync()
            t0 = clock()
            step()
            sync()
            times[impl].append((clock() - t0) * 1e3)
    return {impl: statistics.median(t) for impl, t in times.items()}


def peak_memory_mib(impl: str, shape: tuple[int, int]) -> float:
    """Peak resident memory of one call over the inputs, in a fresh process (MiB)."""
    code = f"import bench_loss as b; print(b.child_peak({impl!r}, {tuple(shape)!r}))"
    env = {**_with_benchmarks_on_path(), **MALLOC_ENV}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def child_peak(impl: str, shape: tuple[int, int]) -> float:
    step = make_step(impl, make_inputs(*shape))
    step()  # warm-up: imports, compilation
    base = reset_peak_rss()
    step()
    return (proc_status_kib("VmHWM") - base) / 1024


def _with_benchmarks_on_path() -> dict[str, str]:
    """This process's environment with this directory first on a child's PYTHONPATH (where
    ``import bench_loss`` finds this script)."""
    here = str(Path(__file__).resolve().parent)
    rest = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here if not rest else os.pathsep.join((here, rest))}


_LOOP = """
import random, sys, time, torch
import bench_loss as b
from gmpo_core import gmpo_loss

torch.set_num_threads(1)
rng = random.Random(0)
dtype = getattr(torch, sys.argv[2]); kl = sys.argv[3] == "kl"
first, rest = None, 0.0
for i in range(int(sys.argv[4])):
    x = b.make_inputs(rng.randint(8, 32), rng.randint(50, 2000), seed=i, dtype=dtype)
    kw = {"beta": 0.04, "ref_logp": x["old_logp"] - 0.1} if kl else {}
    t0, c0 = time.perf_counter(), time.thread_time()
    gmpo_loss(**x, impl=sys.argv[1], **kw).loss.backward()
    if first is None:
        first = time.perf_counter() - t0
    else:
        rest += time.thread_time() - c0
print(first, rest)
"""


def cold_loop(impl: str, dtype: str, kl: bool, calls: int) -> tuple[float, float]:
    """A new user's loop in a fresh process with an empty Inductor cache: the first call's wall
    time (compilation included) and the CPU time of the other calls (one thread)."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**_with_benchmarks_on_path(), "TORCHINDUCTOR_CACHE_DIR": cache}
        argv = [sys.executable, "-c", _LOOP, impl, dtype, "kl" if kl else "-", str(calls)]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    first, rest = (float(v) for v in out.stdout.split()[-2:])
    return first, rest


def break_even(calls: int) -> list[dict[str, Any]]:
    rows = []
    for dtype, kl in (("float32", False), ("bfloat16", False), ("float32", True)):
        plain_first, plain_rest = cold_loop("plain", dtype, kl, calls)
        comp_first, comp_rest = cold_loop("compiled", dtype, kl, calls)
        plain_call, comp_call = plain_rest / (calls - 1), comp_rest / (calls - 1)
        plain_total, comp_total = plain_first + plain_rest, comp_first + comp_rest
        saving = plain_call - comp_call  # compiling pays after (extra first call) / saving calls
        rows.append({
            "dtype": dtype, "kl": kl, "calls": calls,
            "plain_total_s": plain_total, "compiled_total_s": comp_total,
            "compile_s": comp_first, "plain_ms_per_call": plain_call * 1e3,
            "compiled_ms_per_call": comp_call * 1e3,
            "break_even_calls": (comp_first - plain_first) / saving if saving > 0 else None,
        })  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def report(result: dict[str, Any]) -> str:
    clock = "thread CPU time" if result.get("clock") == "cpu" else "wall time"
    lines = ["# GMPO loss: forward+backward", "", *environment(result), f"- clock: {clock}", ""]
    shapes = [tuple(s) for s in result["shapes"]]
    lines += ["| median ms per call | " + " | ".join(f"{b}×{t}" for b, t in shapes) + " |"]
    lines += ["|---" * (len(shapes) + 1) + "|"]
    for impl in result["impls"]:
        cells = [f"{result['time_ms'][f'{b}x{t}'][impl]:.3g}" for b, t in shapes]
        lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    lines += ["", "| ratio at each shape | " + " | ".join(f"{b}×{t}" for b, t in shapes) + " |"]
    lines += ["|---" * (len(shapes) + 1) + "|"]
    ours = [i for i in ("gmpo plain", "gmpo compiled") if i in result["impls"]]
    for impl in ours:
        for host in [h for h in ("TRL", "verl") if h in result["impls"]]:
            cells = [
                f"{result['time_ms'][f'{b}x{t}'][host] / result['time_ms'][f'{b}x{t}'][impl]:.3g}x"
                for b, t in shapes
            ]
            lines.append(f"| {impl} faster than {host} | " + " | ".join(cells) + " |")
    if result.get("memory_mib"):
        lines += ["", "| peak extra MiB per call | " + " | ".join(result["memory_mib"]) + " |"]
        lines += ["|---" * (len(result["memory_mib"]) + 1) + "|"]
        for impl in result["impls"]:
            cells = [f"{result['memory_mib'][s][impl]:.3g}" for s in result["memory_mib"]]
            lines.append(f"| {impl} | " + " | ".join(cells) + " |")
    if result.get("break_even"):
        lines += [
            "",
            "| new user's loop, cold cache | plain total s | compiled total s | compile s | plain ms/call | compiled ms/call | break-even calls |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in result["break_even"]:
            be = "never" if r["break_even_calls"] is None else f"{r['break_even_calls']:.0f}"
            lines.append(
                f"| {r['dtype']}{' + KL' if r['kl'] else ''}, {r['calls']} calls | {r['plain_total_s']:.3g} | {r['compiled_total_s']:.3g} "
                f"| {r['compile_s']:.3g} | {r['plain_ms_per_call']:.3g} | {r['compiled_ms_per_call']:.3g} | {be} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny shapes, no memory or compile study")
    p.add_argument("--repeats", type=int, default=200, help="timed calls per shape and row")
    p.add_argument("--calls", type=int, default=200, help="calls of the break-even loop")
    p.add_argument("--no-write", action="store_true", help="print the report only")
    p.add_argument("--device", default="cpu", help="cuda: times only (no memory or compile study)")
    p.add_argument("--shapes", help="comma-separated BxT, e.g. 64x2048,256x4096")
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated rows to run")
    p.add_argument("--tag", default="cpu", help="results file: results/figures-bench/loss_<tag>.*")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: CPU-time clock)")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    allocator = steady_malloc()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in args.shapes.split(","))  # type: ignore[misc]
    impls = args.impls.split(",")
    result: dict[str, Any] = {
        "command": command_line(__file__, argv),
        "allocator": allocator,
    }
    result["impls"], result["shapes"] = impls, [list(s) for s in shapes]
    result["clock"] = "cpu" if DEVICE.type == "cpu" and args.threads == 1 else "wall"
    result["time_ms"] = {}
    for shape in shapes:
        result["time_ms"][f"{shape[0]}x{shape[1]}"] = time_shape(
            shape, impls, 5 if args.quick else args.repeats
        )
        print(shape, result["time_ms"][f"{shape[0]}x{shape[1]}"], flush=True)
    if not args.quick and DEVICE.type == "cpu":
        big = shapes[-1]
        result["memory_mib"] = {
            f"{big[0]}x{big[1]}": {impl: peak_memory_mib(impl, big) for impl in impls}
        }
        result["break_even"] = break_even(args.calls)
    text = report(result)
    print(text)
    if not args.no_write:
        write_results(RESULTS_DIR / f"loss_{args.tag}", result, text, __file__, argv)


if __name__ == "__main__":
    random.seed(0)
    main()
