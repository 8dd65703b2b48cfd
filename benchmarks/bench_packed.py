"""Packed against padded GMPO: tokens processed, time and peak extra memory of log-probs + loss.

Run from the repository root::

    python benchmarks/bench_packed.py            # 256 sequences, log-normal lengths up to 4096
    python benchmarks/bench_packed.py --quick    # tiny sizes: proves the script runs

A batch of ``--sequences`` completions with log-normal lengths (median ``--median``, log-space
standard deviation ``--sigma``, clipped to [1, ``--max-len``]: a typical RL length
distribution, where a few long completions set the padded width) goes through one step of
``token_logprobs`` (hidden states and LM-head weight -> the sampled tokens' log-probs) and
``gmpo_loss``, forward and backward, two ways:

* ``padded``: hidden states (B, T, H) with T the longest completion, as trainers that pad back
  before the loss run it: every padded position goes through the LM head and the loss.
* ``packed``: the N real tokens only, (N, H), with ``cu_seqlens``.

The LM head is small (``--hidden``, ``--vocab``) so that a CPU run takes seconds; the head's work
per token is the same either way, so the ratio is that of the tokens processed. Each measurement
runs in a fresh subprocess (glibc's mmap threshold at 128 KiB so that the resident set follows
live memory): it builds the inputs, runs a warmup step, resets the high-water mark, runs one
step and reads it (peak extra memory: everything the step allocated beyond its inputs), then
times ``--repeats`` more steps; the table gives the minimum time. The two layouts' losses and
weight gradients are compared (they must agree to float32 rounding).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import (
    MALLOC_ENV,
    RESULTS,
    command_line,
    cpu_model,
    loadavg,
    proc_status_kib,
    reset_peak_rss,
)

#: where this benchmark writes (``make figures-bench``)
RESULTS_DIR = RESULTS / "figures-bench"


def lengths_of(args: argparse.Namespace) -> Any:
    import numpy as np

    rng = np.random.default_rng(args.seed)
    raw = rng.lognormal(np.log(args.median), args.sigma, args.sequences)
    return np.clip(np.round(raw), 1, args.max_len).astype(np.int64)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One layout: inputs, a warmup step, a measured step (memory), timed steps."""
    import torch

    from gmpo_core import gmpo_loss, token_logprobs

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    lengths = torch.from_numpy(lengths_of(args))
    b, t, n = len(lengths), int(lengths.max()), int(lengths.sum())
    keep = torch.arange(t)[None, :] < lengths[:, None]  # (B, T)
    hidden = torch.randn(b, t, args.hidden)
    targets = torch.randint(0, args.vocab, (b, t))
    weight = (torch.randn(args.vocab, args.hidden) / args.hidden**0.5).requires_grad_()
    old = -torch.rand(b, t) * 3
    adv = torch.randn(b)
    packed = args.layout == "packed"
    if packed:
        hidden, targets, old, mask = hidden[keep], targets[keep], old[keep], keep[keep]
        cu = torch.zeros(b + 1, dtype=torch.int32)
        cu[1:] = lengths.cumsum(0)
        kw: dict[str, Any] = {"cu_seqlens": cu}
    else:
        hidden, targets, mask, kw = hidden.reshape(b * t, -1), targets.reshape(-1), keep, {}
    hidden.requires_grad_()

    def step() -> tuple[Any, Any]:
        logps, _ = token_logprobs(hidden, weight, targets, compute_entropy=False)
        lp = logps if packed else logps.reshape(b, t)
        out = gmpo_loss(lp, old, adv, mask, epsilon_high=0.28, impl=args.impl, **kw)
        out.loss.backward()
        grad = weight.grad
        weight.grad = hidden.grad = None
        return out.loss.detach(), grad

    step()  # warmup (and the compiled path's compilation)
    base = reset_peak_rss()
    t0 = time.perf_counter()
    loss, grad = step()
    first = time.perf_counter() - t0
    peak_mib = (proc_status_kib("VmHWM") - base) / 1024
    times = [first]
    for _ in range(args.repeats - 1):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {
        "layout": args.layout,
        "tokens_processed": n if packed else b * t,
        "real_tokens": n,
        "padded_shape": [b, t],
        "time_s": times,
        "peak_extra_mib": peak_mib,
        "loss": float(loss),
        "weight_grad_sample": grad[:: max(1, args.vocab // 64)].flatten()[:4096].tolist(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--median", type=float, default=400.0)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--impl", default="plain", choices=["plain", "compiled"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny sizes, nothing written")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--layout", help=argparse.SUPPRESS)  # internal: one measurement
    args = p.parse_args(argv)
    if args.quick:
        args.sequences, args.max_len, args.median, args.repeats = 8, 64, 16.0, 1
        args.no_write = True
    if args.layout:
        print(json.dumps(child(args)))
        return

    rows = {}
    for layout in ("padded", "packed"):
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--layout", layout]
        if argv is not None:
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--layout", layout]
        env = {**os.environ, **MALLOC_ENV}
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            sys.exit(f"{layout} failed:\n{res.stderr}")
        rows[layout] = json.loads(res.stdout.strip().splitlines()[-1])
    pad, pk = rows["padded"], rows["packed"]
    import numpy as np

    ga, gb = np.array(pad.pop("weight_grad_sample")), np.array(pk.pop("weight_grad_sample"))
    grad_diff = float(np.abs(ga - gb).max() / max(np.abs(ga).max(), 1e-30))
    loss_diff = abs(pad["loss"] - pk["loss"]) / max(abs(pad["loss"]), 1e-30)
    assert grad_diff < 1e-4 and loss_diff < 1e-4, (grad_diff, loss_diff)

    lines = [
        f"| layout | tokens processed | time (min of {args.repeats}) | peak extra memory |",
        "|---|---|---|---|",
    ]
    for name, r in (("padded (B, T)", pad), ("packed (N,)", pk)):
        lines.append(
            f"| {name} | {r['tokens_processed']:,} | {min(r['time_s']) * 1e3:.0f} ms | "
            f"{r['peak_extra_mib']:.0f} MiB |"
        )
    lines.append(
        f"| padded / packed | {pad['tokens_processed'] / pk['tokens_processed']:.2f}x | "
        f"{min(pad['time_s']) / min(pk['time_s']):.2f}x | "
        f"{pad['peak_extra_mib'] / max(pk['peak_extra_mib'], 1e-9):.2f}x |"
    )
    b, t = pad["padded_shape"]
    setup = (
        f"{b} sequences, lengths log-normal (median {args.median:g}, sigma {args.sigma:g}, "
        f"clipped to [1, {args.max_len}]): N = {pk['real_tokens']:,} real tokens, padded "
        f"({b}, {t}); LM head H = {args.hidden}, V = {args.vocab}; impl={args.impl}; "
        f"{args.threads} threads, {cpu_model()}, load average {loadavg()}. Loss and weight "
        f"gradient agree (relative differences {loss_diff:.1e}, {grad_diff:.1e})."
    )
    table = "\n".join(lines)
    print(setup + "\n\n" + table)
    if not args.no_write:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        cmd_line = command_line(__file__, argv if argv is not None else sys.argv[1:])
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "packed_cpu.json").write_text(
            json.dumps({"date": stamp, "command": cmd_line, "setup": setup, **rows}, indent=1)
        )
        (RESULTS_DIR / "packed_cpu.md").write_text(f"`{cmd_line}`, {stamp}\n\n{setup}\n\n{table}\n")


if __name__ == "__main__":
    main()
