"""Forward+backward time and peak extra memory of ``gmpo_loss`` against TRL's and verl's GMPO.

Run from the repository root (see ``benchmarks/README.md`` for the columns)::

    python benchmarks/bench_loss.py            # all shapes, (8, 256) .. (512, 8192)
    python benchmarks/bench_loss.py --quick    # tiny shapes only: proves the script runs (CI)
    python benchmarks/bench_loss.py --shapes 64x2048,128x4096 --device cpu

Rows, on the same inputs in the same process:

* ``gmpo compiled`` / ``gmpo eager``: ``gmpo_loss(..., impl="compiled" | "eager")``, with the
  lazy ``out.metrics`` dict built (no ``.item()``).
* ``TRL <v> GMPO (transcribed)``: :func:`trl_gmpo_loss`, the loss and metric-tensor lines of
  TRL's ``GMPOTrainer._compute_loss``, transcribed (TRL is not imported).
* ``verl <v> geo_mean``: verl's own ``compute_policy_loss_geo_mean``, with its ``.item()`` calls,
  when verl is importable; otherwise the row reads "not installed".

Time is the median of repeated forward+backward calls, after warmup calls (so compilation is
excluded; the first call's time is recorded separately). By default (``--timing rotating``) each
implementation cycles through several input sets, 128 MiB together from 2^20 tokens up, so that
its inputs come from memory, as the bound assumes, while its own code and Python objects stay
warm; ``--timing interleaved`` times every call on one input set right after another
implementation's call, which leaves the caches cold for code and data alike. The bandwidth
bound is
``13 * B * T bytes / copy bandwidth``: a forward+backward must read ``logp`` and ``old_logp``
(4 + 4 bytes), the mask (1 byte) and write the gradient (4 bytes) per token; the copy bandwidth
is measured in the same run with a 256 MiB copy, read + write bytes counted, at the start, before
each shape and at the end; the bound uses the highest of these (the machine's bandwidth drifts).

Peak extra memory: on CPU the VmHWM of a fresh subprocess per (implementation, shape), its
high-water mark reset (``echo 5 > /proc/self/clear_refs``) after the inputs are built and one
warmup call ran, minus VmRSS right after the reset. On CUDA, ``torch.cuda.max_memory_allocated``
minus the allocated bytes before the call, in-process. The gradient of ``logp`` is counted, so one
(B, T) float32 tensor is the floor.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _common import (
    IMG_DIR,
    MALLOC_ENV,
    MEMORY_RESOLUTION_BYTES,
    RESULTS_DIR,
    command_line,
    cpu_model,
    dist_version,
    loadavg,
    proc_status_kib,
    reset_peak_rss,
    steady_malloc,
)
from torch import Tensor

from gmpo_core import gmpo_loss

EPSILON = 0.4  # log-space clip, both sides: the paper's exp(+-0.4), TRL's and verl's setting here
BYTES_PER_TOKEN = 13  # logp 4 + old_logp 4 + mask 1 (bool) read, gradient 4 written
COPY_MIB = 256  # large enough not to run from the last-level cache
# (2, 16): 32 tokens, nothing to compute: its time is each implementation's per-call overhead
DEFAULT_SHAPES = ((2, 16), (8, 256), (32, 1024), (64, 2048), (128, 4096), (256, 4096), (512, 8192))
QUICK_SHAPES = ((8, 256), (32, 1024))
LARGE_TOKENS = 1 << 21  # shapes with more tokens than this get --repeats-large repeats
# --timing rotating: input sets cycled through, together this many bytes (4x a 32 MiB last-level
# cache), at most this many sets (small shapes stay in the caches whatever one does)
ROTATE_BYTES = 128 * 2**20
ROTATE_SETS_MAX = 8
CHILD_ENV = MALLOC_ENV  # see _common.MEMORY_RESOLUTION_BYTES

IMPLS = ("gmpo-compiled", "gmpo-eager", "trl", "verl")
Step = Callable[[], Tensor]


# --------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Inputs:
    """One batch, shared by every implementation.

    Shape:
        logp, old_logp, mask: (B, T); advantages: (B,).
    """

    logp: Tensor  # float32 leaf, requires grad
    old_logp: Tensor  # logp + N(0, 0.2) noise: about 2.3 % of tokens beyond each clip bound
    advantages: Tensor  # N(0, 1) per row
    mask: Tensor  # bool, right-padded: row i has lengths[i] valid tokens


def make_inputs(
    batch: int, seq: int, device: torch.device, seed: int = 0, dtype: torch.dtype = torch.float32
) -> Inputs:
    """Realistic GRPO-like inputs: log-probs <= 0, random lengths, ~20 % of rows truncated at T.
    ``dtype`` is the dtype of the log-probs (bf16 on GPU, say)."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.empty(batch, seq).exponential_(generator=g)  # (B, T) log-probs <= 0
    old_logp = logp + 0.2 * torch.randn(batch, seq, generator=g)
    advantages = torch.randn(batch, generator=g)  # (B,)
    lengths = torch.randint(1, seq + seq // 4 + 1, (batch,), generator=g).clamp(max=seq)
    mask = torch.arange(seq) < lengths[:, None]  # (B, T)
    return Inputs(
        logp.to(device, dtype).requires_grad_(),
        old_logp.to(device, dtype),
        advantages.to(device),
        mask.to(device),
    )


# --------------------------------------------------------------------------------------------
# TRL's GMPO loss, transcribed


def trl_gmpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    epsilon_low: float = EPSILON,
    epsilon_high: float = EPSILON,
    beta: float = 0.0,
    ref_per_token_logps: Tensor | None = None,
    entropy_mask: Tensor | None = None,
    current_gradient_accumulation_steps: int = 1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """TRL 1.16.0's GMPO loss and metric tensors (TRL's defaults: ``beta = 0``, no entropy mask).

    Between the markers: a transcription of lines 80-153 of
    ``trl/experimental/gmpo/gmpo_trainer.py`` (``GMPOTrainer._compute_loss``) in trl 1.16.0,
    Copyright 2020-2026 The HuggingFace Team, licensed under the Apache License, Version 2.0.
    Changes: the ``self.`` attributes and ``inputs[...]`` entries are arguments; the model is in
    training mode; the accelerator ``reduce``/``gather`` calls and the host calls (``.item()``,
    ``nanmin``, ``nanmax``) are left out, keeping the metric tensors; the entropy metric is left out
    (its input comes from the model). ``mask`` is what TRL passes: ``completion_mask``, an int64
    tensor in trl 1.16.

    Shape:
        per_token_logps, old_per_token_logps, mask, ref_per_token_logps, entropy_mask: (B, T).
        advantages: (B,).
    """
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("trl_gmpo_loss: beta != 0 needs ref_per_token_logps")
    # Verbatim but for the changes above, so the lines are as long as TRL's (up to 120).
    # fmt: off
    # ---- begin transcription: trl 1.16.0, trl/experimental/gmpo/gmpo_trainer.py, L80-153 ----
    # GMPO Objective
    # Per-token log importance ratio
    log_ratio = per_token_logps - old_per_token_logps

    # Token-level clipping, performed in *log space* for numerical stability. The clip range in
    # ratio space is (exp(-epsilon_low), exp(epsilon_high)); the paper recommends exp(±0.4), markedly wider than
    # GRPO/DAPO, to encourage exploration.
    clamped_log_ratio = torch.clamp(log_ratio, min=-epsilon_low, max=epsilon_high)

    # sign-aware, one-sided clipping = PPO's trust-region "min" trick written in log-spaces:
    advantages_col = advantages.unsqueeze(1)
    clipped_log_ratio = torch.where(
        advantages_col > 0,
        torch.minimum(log_ratio, clamped_log_ratio),
        torch.maximum(log_ratio, clamped_log_ratio),
    )

    # Optionally drop low-entropy tokens from the geometric mean
    seq_mask = mask * entropy_mask if entropy_mask is not None else mask

    # Geometric mean of the clipped token ratios = exp(mean of clipped log-ratios over valid tokens). The 1/|o_i|
    # exponent is the geometric-mean normalization; the paper's ablation shows it is essential.
    log_importance_weights = (clipped_log_ratio * seq_mask).sum(-1) / seq_mask.sum(-1).clamp(min=1.0)  # (B,)
    coef = torch.exp(log_importance_weights)  # (B,) sequence-level (geometric-mean) importance weight

    per_sequence_loss = -coef * advantages  # (B,)

    # KL regularization toward the reference model (optional; sequence-averaged to match GMPO's sequence-level
    # objective). Disabled by default (beta == 0)
    if beta != 0.0:
        per_token_kl = (
            torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        )
        seq_kl = (per_token_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        per_sequence_loss = per_sequence_loss + beta * seq_kl

    # GMPO aggregates with a plain mean over sequences, per token-norm
    # already lives inside the geometric mean.
    loss = per_sequence_loss.mean()
    normalizer = current_gradient_accumulation_steps  # mode == "train"
    loss = loss / normalizer

    # Log the metrics
    def masked_seq_mean(x):
        if x.shape[1] == 1:  # when importance_sampling_level == "sequence": already one value per sequence
            return x.squeeze(1)
        return (x * mask).sum(-1) / mask.sum(-1)

    def global_masked_mean(x):
        if x.shape[1] == 1:  # when importance_sampling_level == "sequence": one value per sequence
            local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
        else:
            local_sum, local_count = (x * mask).sum(), mask.sum().float()
        totals = torch.stack([local_sum, local_count])  # accelerator.reduce(..., reduction="sum") left out
        return totals[0] / totals[1].clamp(min=1.0)  # .item() left out

    metrics = {}
    if beta != 0.0:
        metrics["kl"] = global_masked_mean(per_token_kl)

    # (the entropy metric, global_masked_mean(entropies), is left out: entropies come from the model)

    # Fraction of the tokens pushed into the clipped region, in log-space.
    is_low_clipped = (log_ratio < -epsilon_low) & (advantages_col < 0)
    is_high_clipped = (log_ratio > epsilon_high) & (advantages_col > 0)
    is_region_clipped = is_low_clipped | is_high_clipped
    metrics["clip_ratio/low_mean"] = global_masked_mean(is_low_clipped.float())
    metrics["clip_ratio/high_mean"] = global_masked_mean(is_high_clipped.float())
    metrics["clip_ratio/region_mean"] = global_masked_mean(is_region_clipped.float())
    gathered_low_clip = masked_seq_mean(is_low_clipped.float())  # accelerator.gather left out
    metrics["clip_ratio/low_min"] = gathered_low_clip  # nanmin(...).item() left out
    gathered_high_clip = masked_seq_mean(is_high_clipped.float())  # accelerator.gather left out
    metrics["clip_ratio/high_max"] = gathered_high_clip  # nanmax(...).item() left out
    # ---- end transcription ----
    # fmt: on
    return loss, metrics


# --------------------------------------------------------------------------------------------
# Implementations


@dataclass
class Impl:
    """One row of the table: ``make(inputs)`` returns the step to time (it returns the loss)."""

    key: str
    label: str
    make: Callable[[Inputs], Step] | None  # None: not available (see ``status``)
    status: str = "ok"


def _gmpo_impl(impl: str) -> Impl:
    def make(x: Inputs) -> Step:
        def step() -> Tensor:
            out = gmpo_loss(x.logp, x.old_logp, x.advantages, x.mask, epsilon=EPSILON, impl=impl)
            _ = out.metrics  # lazy: build the metric tensors, as the hosts do
            return out.loss

        return step

    return Impl(f"gmpo-{impl}", f"gmpo {impl}", make)


def _trl_impl() -> Impl:
    version = dist_version("trl") or "1.16.0"

    def make(x: Inputs) -> Step:
        mask = x.mask.long()  # TRL's completion_mask is int64

        def step() -> Tensor:
            loss, _ = trl_gmpo_loss(x.logp, x.old_logp, x.advantages, mask)
            return loss

        return step

    label = "TRL 1.16.0 GMPO (transcribed)"
    if version != "1.16.0":
        label += f" [trl {version} installed, not used]"
    return Impl("trl", label, make)


def _verl_impl() -> Impl:
    """verl's real ``compute_policy_loss_geo_mean``, or a row that says why it is missing."""
    try:
        t0 = time.perf_counter()
        from verl.trainer.ppo.core_algos import compute_policy_loss_geo_mean
    except ModuleNotFoundError as e:
        status = (
            "not installed" if (e.name or "").split(".")[0] == "verl" else f"import failed: {e}"
        )
        return Impl("verl", "verl geo_mean", None, status)
    except Exception as e:  # a broken install must not stop the benchmark
        return Impl("verl", "verl geo_mean", None, f"import failed: {type(e).__name__}: {e}")
    print(f"imported verl in {time.perf_counter() - t0:.1f} s", flush=True)
    config = SimpleNamespace(clip_ratio=EPSILON, clip_ratio_low=EPSILON, clip_ratio_high=EPSILON)

    def make(x: Inputs) -> Step:
        response_mask = x.mask.float()  # verl's response_mask is float
        # verl's GRPO advantage is materialized per token: score.unsqueeze(-1) * response_mask
        advantages = x.advantages.unsqueeze(-1) * response_mask  # (B, T)

        def step() -> Tensor:
            loss, _metrics = compute_policy_loss_geo_mean(
                old_log_prob=x.old_logp,
                log_prob=x.logp,
                advantages=advantages,
                response_mask=response_mask,
                loss_agg_mode="token-mean",
                config=config,
                rollout_is_weights=None,
            )  # its metrics are floats already: .item() is part of its cost
            return loss

        return step

    return Impl("verl", f"verl {dist_version('verl')} geo_mean", make)


def load_impls(keys: Sequence[str]) -> list[Impl]:
    factories: dict[str, Callable[[], Impl]] = {
        "gmpo-compiled": lambda: _gmpo_impl("compiled"),
        "gmpo-eager": lambda: _gmpo_impl("eager"),
        "trl": _trl_impl,
        "verl": _verl_impl,
    }
    return [factories[k]() for k in keys]


# --------------------------------------------------------------------------------------------
# Measurement


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(step: Step, x: Inputs) -> Tensor:
    """One forward+backward; the gradient of ``logp`` is written afresh (not accumulated)."""
    x.logp.grad = None
    loss = step()
    loss.backward()
    return loss


def copy_bandwidth(device: torch.device, mib: int = COPY_MIB, repeats: int = 10) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``mib`` MiB, read + write bytes counted."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page once
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * 4 / statistics.median(times)


@dataclass
class Timing:
    samples_s: list[float]
    first_call_s: float

    @property
    def median_s(self) -> float:
        return statistics.median(self.samples_s)

    def quartiles_s(self) -> tuple[float, float]:
        if len(self.samples_s) < 2:
            return self.median_s, self.median_s
        q = statistics.quantiles(self.samples_s, n=4)
        return q[0], q[2]


def check_against(
    steps: Mapping[str, Step], x: Inputs, ref_key: str
) -> dict[str, dict[str, float]]:
    """Loss and gradient of each implementation against ``ref_key``'s, on this batch."""
    values = {}
    for key, step in steps.items():
        loss = run_once(step, x)
        if x.logp.grad is None:
            raise RuntimeError(f"{key}: no gradient reached logp")
        values[key] = (loss.detach().double().cpu(), x.logp.grad.detach().double().cpu())
    if ref_key not in values:
        return {}
    ref_loss, ref_grad = values[ref_key]
    scale = ref_grad.abs().max().clamp(min=1e-30)
    return {
        key: {
            "loss_rel_diff": float((loss - ref_loss).abs() / ref_loss.abs().clamp(min=1e-30)),
            "grad_max_diff_rel": float((grad - ref_grad).abs().max() / scale),
        }
        for key, (loss, grad) in values.items()
        if key != ref_key
    }


def timed_call(step: Step, x: Inputs) -> float:
    """Seconds of one forward+backward, the device synchronized around it."""
    device = x.logp.device
    x.logp.grad = None
    _sync(device)
    t0 = time.perf_counter()
    step().backward()
    _sync(device)
    return time.perf_counter() - t0


def time_steps(
    steps: Sequence[Mapping[str, Step]], xs: Sequence[Inputs], repeats: int, warmup: int
) -> dict[str, list[float]]:
    """``warmup`` untimed calls per implementation and input set, then timed rounds until each
    implementation has ``repeats`` samples, the implementations in a rotating order so that
    drift in the machine's load hits them alike. ``steps[k]`` runs on ``xs[k]``.

    One input set (``--timing interleaved``): each timed call follows another implementation's
    call. Several (``--timing rotating``): in each round an implementation runs once on every
    set, in turn, so its inputs were last touched a whole round ago (out of the caches, see
    :func:`input_sets`) while its own code and Python objects stay warm. Returns the samples in
    seconds."""
    for step_set, x in zip(steps, xs, strict=True):
        for step in step_set.values():
            for _ in range(warmup):
                run_once(step, x)
    samples: dict[str, list[float]] = {key: [] for key in steps[0]}
    keys = list(steps[0])
    for r in range(-(-repeats // len(xs))):
        for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
            for step_set, x in zip(steps, xs, strict=True):
                samples[key].append(timed_call(step_set[key], x))
    return samples


def input_sets(
    shape: tuple[int, int], device: torch.device, seed: int, dtype: torch.dtype, timing: str
) -> list[Inputs]:
    """The inputs a shape is timed on: one set, or (``rotating``) as many as it takes for their
    bytes (13 per token) to reach :data:`ROTATE_BYTES`, at most :data:`ROTATE_SETS_MAX`."""
    count = 1
    if timing == "rotating":
        per_set = BYTES_PER_TOKEN * shape[0] * shape[1]
        count = max(2, min(ROTATE_SETS_MAX, -(-ROTATE_BYTES // per_set)))
    return [make_inputs(*shape, device, seed + k, dtype) for k in range(count)]


def peak_extra_bytes(step: Step, x: Inputs, warmup: int = 1) -> int:
    """Peak memory of one forward+backward beyond what was live before it (see module doc)."""
    for _ in range(warmup):
        run_once(step, x)
    x.logp.grad = None
    gc.collect()
    device = x.logp.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        loss = run_once(step, x)
        torch.cuda.synchronize(device)
        extra = torch.cuda.max_memory_allocated(device) - before
        del loss
        return extra
    rss = reset_peak_rss()
    loss = run_once(step, x)
    hwm = proc_status_kib("VmHWM")
    del loss
    return max(hwm - rss, 0) * 1024


def _child_memory(impl_key: str, shape: tuple[int, int], seed: int) -> None:
    """Entry point of the fresh subprocess that measures one (implementation, shape) on CPU."""
    (impl,) = load_impls([impl_key])
    if impl.make is None:
        print(json.dumps({"status": impl.status}))
        return
    x = make_inputs(*shape, torch.device("cpu"), seed)
    extra = peak_extra_bytes(impl.make(x), x)
    print(json.dumps({"status": "ok", "peak_extra_bytes": extra}))


def measure_memory_subprocess(
    impl_key: str,
    shape: tuple[int, int],
    seed: int,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Run :func:`_child_memory` in a fresh interpreter; ``env`` (default: this process's) gets
    :data:`CHILD_ENV` on top."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child-memory", impl_key]
    cmd += ["--shapes", f"{shape[0]}x{shape[1]}", "--seed", str(seed)]
    env = {**(os.environ if env is None else env), **CHILD_ENV}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": f"failed: timed out after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"status": f"failed: exit {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --------------------------------------------------------------------------------------------
# Report


@dataclass
class Row:
    impl: Impl
    shape: tuple[int, int]
    status: str
    timing: Timing | None = None
    check: dict[str, float] | None = None
    peak_extra_bytes: int | None = None
    memory_status: str = "not measured"

    @property
    def tokens(self) -> int:
        return self.shape[0] * self.shape[1]


def _ratio(row: Row, ref: Row | None) -> float | None:
    if row.timing is None or ref is None or ref.timing is None:
        return None
    return row.timing.median_s / ref.timing.median_s


def to_records(rows: Sequence[Row], bandwidth: float) -> list[dict[str, Any]]:
    by_shape: dict[tuple[tuple[int, int], str], Row] = {(r.shape, r.impl.key): r for r in rows}
    records = []
    for r in rows:
        bound_s = BYTES_PER_TOKEN * r.tokens / bandwidth
        rec: dict[str, Any] = {
            "impl": r.impl.key,
            "label": r.impl.label,
            "batch": r.shape[0],
            "seq": r.shape[1],
            "tokens": r.tokens,
            "status": r.status,
            "bound_ms": bound_s * 1e3,
        }
        if r.timing is not None:
            q25, q75 = r.timing.quartiles_s()
            rec |= {
                "time_ms": r.timing.median_s * 1e3,
                "q25_ms": q25 * 1e3,
                "q75_ms": q75 * 1e3,
                "ns_per_token": r.timing.median_s * 1e9 / r.tokens,
                "first_call_ms": r.timing.first_call_s * 1e3,
                "samples_ms": [s * 1e3 for s in r.timing.samples_s],
                "ratio_vs_trl": _ratio(r, by_shape.get((r.shape, "trl"))),
                "ratio_vs_verl": _ratio(r, by_shape.get((r.shape, "verl"))),
                "ratio_vs_bound": r.timing.median_s / bound_s,
            }
        if r.check is not None:
            rec["check_vs_trl"] = r.check
        rec["memory_status"] = r.memory_status
        if r.peak_extra_bytes is not None:
            rec["peak_extra_bytes"] = r.peak_extra_bytes
            rec["peak_extra_mib"] = r.peak_extra_bytes / 2**20
            rec["peak_extra_bt_f32"] = r.peak_extra_bytes / (4 * r.tokens)
        records.append(rec)
    return records


def _fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def _fmt_ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def _short(status: str) -> str:
    """A status for a table cell: the full message is in the JSON."""
    if len(status) > 24:
        status = status.split(":")[0] + " (see JSON)"
    return status.replace("|", "\\|")


def render_tables(records: Sequence[dict[str, Any]], bandwidth: float) -> str:
    """Markdown: a time summary (implementations x shapes), then every column per shape."""
    shapes = list(dict.fromkeys((r["batch"], r["seq"]) for r in records))
    labels = list(dict.fromkeys(r["label"] for r in records))
    cell = {(r["label"], (r["batch"], r["seq"])): r for r in records}
    head = ["forward+backward, median ms", *(f"{b}×{t}" for b, t in shapes)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels:
        vals = []
        for shape in shapes:
            r = cell.get((label, shape))
            vals.append(
                "–"
                if r is None
                else _short(r["status"])
                if "time_ms" not in r
                else f"{r['time_ms']:.3g}"
            )
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    bounds = [_fmt(BYTES_PER_TOKEN * b * t / bandwidth * 1e3, ".3g") for b, t in shapes]
    lines.append(f"| bandwidth bound ({bandwidth / 1e9:.1f} GB/s) | " + " | ".join(bounds) + " |")

    cols = [
        "shape (B×T)", "implementation", "time ms", "IQR ms", "ns/token", "÷ TRL", "÷ verl",
        "÷ bound", "peak extra MiB", "peak extra ×(B,T) f32",
    ]  # fmt: skip
    lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in records:
        shape = f"{r['batch']}×{r['seq']}"
        if "time_ms" in r:
            timing = [
                _fmt(r["time_ms"], ".3g"),
                f"{r['q25_ms']:.3g}–{r['q75_ms']:.3g}",
                _fmt(r["ns_per_token"], ".3g"),
                _fmt_ratio(r["ratio_vs_trl"]),
                _fmt_ratio(r["ratio_vs_verl"]),
                _fmt_ratio(r["ratio_vs_bound"]),
            ]
        else:
            timing = [_short(r["status"]), *["–"] * 5]
        if "peak_extra_bytes" in r:
            mark = "†" if 4 * r["tokens"] < MEMORY_RESOLUTION_BYTES else ""
            mem = [_fmt(r["peak_extra_mib"], ".3g") + mark, _fmt(r["peak_extra_bt_f32"], ".2f")]
        else:
            mem = [_short(r["memory_status"]), "–"]
        lines.append(f"| {shape} | {r['label']} | " + " | ".join(timing + mem) + " |")
    return "\n".join(lines) + "\n"


def _overhead_line(records: Sequence[Mapping[str, Any]]) -> str:
    """Per-call overhead: each implementation's forward+backward time at the smallest shape, if
    that shape has at most 64 tokens (no work to speak of)."""
    timed = [r for r in records if "time_ms" in r]
    if not timed:
        return ""
    smallest = min(r["tokens"] for r in timed)
    if smallest > 64:
        return ""
    parts = [f"{r['label']} {r['time_ms'] * 1e3:.0f} µs" for r in timed if r["tokens"] == smallest]
    shape = next(f"{r['batch']}×{r['seq']}" for r in timed if r["tokens"] == smallest)
    return f"- per-call overhead (forward+backward at {shape}, {smallest} tokens): " + ", ".join(
        parts
    )


def render_markdown(
    meta: Mapping[str, Any], tables: str, records: Sequence[Mapping[str, Any]] = ()
) -> str:
    bw = meta["copy_bandwidth_gbps"]
    info = [
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}",
        f"- device: {meta['device']} ({meta['device_name']})",
        f"- CPU: {meta['cpu_model']}, {meta['torch_threads']} torch threads "
        f"({meta['cpu_count']} CPUs visible), load average {meta['loadavg_start']} at start, "
        f"{meta['loadavg_end']} at end",
        f"- torch {meta['torch']}, Python {meta['python']}, gmpo {meta['gmpo']}, "
        f"trl {meta['trl'] or 'not installed'} (not imported), verl {meta['verl_status']}",
        f"- copy bandwidth ({COPY_MIB} MiB copy, read + write bytes): {bw['start']:.1f} GB/s "
        f"at start, {', '.join(f'{b:.1f}' for b in bw.get('before_each_shape', []))} before "
        f"each shape, {bw['end']:.1f} GB/s at end; the bound uses the highest, "
        f"{bw['used']:.1f} GB/s",
        f"- repeats: {meta['repeats']} ({meta['repeats_large']} above {LARGE_TOKENS} tokens), "
        f"after {meta['warmup']} warmup calls each (compilation excluded)",
        f"- allocator (timing process): {meta.get('malloc', 'glibc defaults')}",
        f"- timing: {meta.get('timing', 'interleaved')} ("
        + (
            "each implementation cycles through input sets that together exceed the caches: "
            "inputs come from memory, its code stays warm"
            if meta.get("timing") == "rotating"
            else "one input set, each call after another implementation's: everything cold"
        )
        + ")",
    ]
    if overhead := _overhead_line(records):
        info.append(overhead)
    return (
        "# GMPO loss: forward+backward time and peak extra memory\n\n"
        + "\n".join(info)
        + "\n\n"
        + tables
        + "\n÷ columns: this row's median time divided by the reference's (below 1 is faster); "
        "the bound is 13·B·T bytes / copy bandwidth. Peak extra memory includes the gradient of "
        "logp (one (B, T) float32 tensor). †: a (B, T) float32 tensor smaller than "
        f"{MEMORY_RESOLUTION_BYTES // 1024} KiB, below the resolution of the CPU memory method "
        "(small buffers come from the malloc heap; page granularity). Made by "
        "`benchmarks/bench_loss.py`; see `benchmarks/README.md`.\n"
    )


def plot(records: Sequence[dict[str, Any]], bandwidth: float, title: str, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not importable: plot skipped", flush=True)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(r["label"] for r in records):
        pts = sorted(
            (r["tokens"], r["ns_per_token"])
            for r in records
            if r["label"] == label and "ns_per_token" in r
        )
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    tokens = sorted({r["tokens"] for r in records})
    bound_ns = BYTES_PER_TOKEN / bandwidth * 1e9
    ax.plot(
        tokens,
        [bound_ns] * len(tokens),
        "k--",
        label=f"bandwidth bound ({bandwidth / 1e9:.1f} GB/s)",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens (B·T)")
    ax.set_ylabel("forward+backward time per token (ns)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}", flush=True)


# --------------------------------------------------------------------------------------------
# Main


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        try:
            b, t = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape {item!r} is not BxT, e.g. 64x2048") from None
        if b < 2 or t < 2:
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: B and T must be >= 2 (gmpo runs size-1 dimensions eagerly)"
            )
        shapes.append((b, t))
    return shapes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Forward+backward time and peak extra memory of gmpo_loss against TRL's and "
        "verl's GMPO losses. See benchmarks/README.md."
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny shapes only (CI): " + ",".join(f"{b}x{t}" for b, t in QUICK_SHAPES),
    )
    p.add_argument("--shapes", type=parse_shapes, help="comma-separated BxT, e.g. 64x2048,128x4096")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="dtype of the log-probs (timing; CPU memory is measured in float32)",
    )
    p.add_argument(
        "--impls", default=",".join(IMPLS), help=f"comma-separated subset of {','.join(IMPLS)}"
    )
    p.add_argument(
        "--repeats", type=int, default=20, help="timed calls per implementation and shape"
    )
    p.add_argument(
        "--repeats-large", type=int, default=10, help=f"repeats above {LARGE_TOKENS} tokens"
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed calls first (compilation happens here)"
    )
    p.add_argument(
        "--timing",
        default="rotating",
        choices=("rotating", "interleaved"),
        help="rotating: each implementation cycles through input sets that together exceed the "
        "caches (inputs come from memory, code stays warm); interleaved: one input set, each "
        "call after another implementation's (everything cold)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    p.add_argument(
        "--memory-jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="CPU memory subprocesses run at once (each measures only itself)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--tag", help="suffix of the output names (default: 'quick' with --quick, else none)"
    )
    p.add_argument("--no-write", action="store_true", help="print the table only; write no files")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    p.add_argument(
        "--plot",
        type=Path,
        help="PNG path (default: docs/img/loss_time_per_token_<device>.png; tagged runs: the "
        "results dir)",
    )
    p.add_argument("--_child-memory", dest="child_memory", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.impls = [k.strip() for k in args.impls.split(",") if k.strip()]
    unknown = sorted(set(args.impls) - set(IMPLS))
    if unknown:
        p.error(f"--impls: unknown {unknown}; choose from {list(IMPLS)}")
    if min(args.repeats, args.repeats_large, args.warmup, args.memory_jobs) < 1:
        p.error("--repeats, --repeats-large, --warmup and --memory-jobs must be >= 1")
    if args.shapes is None:
        args.shapes = list(QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    if args.tag is None and args.quick:
        args.tag = "quick"
    return args


def collect_meta(args: argparse.Namespace, device: torch.device, command: str) -> dict[str, Any]:
    """Everything needed to judge and reproduce the numbers."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "command": command,
        "python_executable": sys.executable,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "device_name": (
            torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
        ),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "cpu_count": len(affinity) if affinity is not None else os.cpu_count(),
        "loadavg_start": loadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gmpo": dist_version("gmpo"),
        "trl": dist_version("trl"),
        "verl": dist_version("verl"),
        "repeats": args.repeats,
        "repeats_large": args.repeats_large,
        "warmup": args.warmup,
        "timing": args.timing,
        "seed": args.seed,
        "epsilon": EPSILON,
        "memory_method": (
            "torch.cuda.max_memory_allocated, in-process"
            if device.type == "cuda"
            else "VmHWM - VmRSS of a fresh subprocess, reset by clear_refs=5 after one warmup "
            f"call; child env {CHILD_ENV}"
        ),
    }


def _warn_if_busy(meta: Mapping[str, Any]) -> None:
    with contextlib.suppress(ValueError, IndexError, TypeError):
        load = float(meta["loadavg_start"].split()[0])
        if load >= 0.5:
            print(
                f"WARNING: load average {load:.2f} with {meta['cpu_count']} CPUs: other processes "
                f"are running; with {meta['torch_threads']} torch threads, timings will be noisy "
                "(a parallel region waits for its slowest, descheduled thread).",
                flush=True,
            )


def run_timings(
    impls: Sequence[Impl],
    shapes: Sequence[tuple[int, int]],
    device: torch.device,
    args: Any,
    bandwidths: list[float] | None = None,
) -> list[Row]:
    """Time every available implementation on each shape (and, on CUDA, measure its memory).
    The copy bandwidth is measured again before each shape and appended to ``bandwidths``: the
    machine's memory bandwidth drifts, and the bound should use the best it showed."""
    rows: list[Row] = []
    for shape in shapes:
        if bandwidths is not None:
            bandwidths.append(copy_bandwidth(device))
        tokens = shape[0] * shape[1]
        repeats = args.repeats if tokens <= LARGE_TOKENS else args.repeats_large
        xs = input_sets(shape, device, args.seed, getattr(torch, args.dtype), args.timing)
        x = xs[0]
        shape_rows = {
            i.key: Row(i, shape, i.status, memory_status="not measured" if i.make else i.status)
            for i in impls
        }
        steps = {i.key: i.make(x) for i in impls if i.make is not None}
        first: dict[str, float] = {}  # the first call at this shape: compiles, if anything does
        for key in list(steps):
            try:
                first[key] = timed_call(steps[key], x)
            except Exception as e:  # say, no compiler on this platform: that row fails, not all
                msg = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}"
                shape_rows[key].status = shape_rows[key].memory_status = msg
                print(f"{key} {shape[0]}x{shape[1]}: {msg}", flush=True)
                del steps[key]
        checks = check_against(steps, x, "trl")
        step_sets = [steps] + [
            {i.key: i.make(other) for i in impls if i.make is not None and i.key in steps}
            for other in xs[1:]
        ]
        samples = time_steps(step_sets, xs, repeats, args.warmup)
        timings = {key: Timing(samples[key], first[key]) for key in samples}
        for key, timing in timings.items():
            shape_rows[key].timing = timing
            shape_rows[key].check = checks.get(key)
            if device.type == "cuda" and not args.no_memory:
                shape_rows[key].peak_extra_bytes = peak_extra_bytes(steps[key], x)
                shape_rows[key].memory_status = "ok"
        summary = ", ".join(f"{k} {t.median_s * 1e3:.3g} ms" for k, t in timings.items())
        print(f"{shape[0]}x{shape[1]} ({repeats} repeats): {summary}", flush=True)
        if "gmpo-compiled" in timings:
            compile_s = timings["gmpo-compiled"].first_call_s
            print(
                f"  gmpo-compiled first call (compilation, if any): {compile_s:.3g} s", flush=True
            )
        for key, c in checks.items():
            if c["loss_rel_diff"] > 1e-4 or c["grad_max_diff_rel"] > 1e-4:
                print(f"  WARNING: {key} disagrees with the TRL transcription: {c}", flush=True)
        rows += shape_rows.values()
        del x, xs, steps, step_sets
    return rows


def run_memory_subprocesses(
    rows: Sequence[Row], seed: int, jobs: int, env: Mapping[str, str] | None = None
) -> None:
    """CPU peak memory: one fresh subprocess per (implementation, shape), ``jobs`` at a time.

    Running several at once does not change what each one measures (its own high-water mark).
    """
    todo = [r for r in rows if r.impl.make is not None and r.timing is not None]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {
            pool.submit(measure_memory_subprocess, r.impl.key, r.shape, seed, env): r for r in todo
        }
        for future in concurrent.futures.as_completed(futures):
            row, res = futures[future], future.result()
            row.memory_status = res["status"]
            row.peak_extra_bytes = res.get("peak_extra_bytes")
            mib = "–" if row.peak_extra_bytes is None else f"{row.peak_extra_bytes / 2**20:.3g} MiB"
            shape = f"{row.shape[0]}x{row.shape[1]}"
            print(f"peak extra memory, {row.impl.key} {shape}: {mib} ({row.memory_status})")


def write_outputs(
    meta: Mapping[str, Any], rows: Sequence[Row], bandwidth: float, args: Any
) -> None:
    records = to_records(rows, bandwidth)
    tables = render_tables(records, bandwidth)
    print()
    print(tables, flush=True)
    if overhead := _overhead_line(records):
        print(overhead.removeprefix("- "), flush=True)
    if args.no_write:
        return
    device = meta["device"]
    stem = f"loss_{device}" + (f"_{args.tag}" if args.tag else "")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = args.results_dir / f"{stem}.md", args.results_dir / f"{stem}.json"
    md_path.write_text(render_markdown(meta, tables, records))
    json_path.write_text(json.dumps({"meta": meta, "results": records}, indent=2) + "\n")
    print(f"wrote {md_path} and {json_path}", flush=True)
    if args.plot is not None:
        png = args.plot
    elif args.tag:
        png = args.results_dir / f"loss_time_per_token_{device}_{args.tag}.png"
    else:
        png = IMG_DIR / f"loss_time_per_token_{device}.png"
    title = (
        f"GMPO loss forward+backward, {meta['device_name']}, {meta['torch_threads']} threads, "
        f"torch {meta['torch']}"
    )
    plot(records, bandwidth, title, png)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child_memory:
        _child_memory(args.child_memory, args.shapes[0], args.seed)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    t_start = time.perf_counter()
    malloc = steady_malloc()  # before the inputs exist; see _common.STEADY_MALLOC
    command = command_line(__file__, sys.argv[1:] if argv is None else argv)
    meta = collect_meta(args, device, command)
    meta["malloc"] = malloc if malloc is not None else "glibc defaults (mallopt unavailable)"
    print(
        f"torch {meta['torch']}, device {device.type} ({meta['device_name']}), "
        f"{meta['torch_threads']} torch threads, load average {meta['loadavg_start']}",
        flush=True,
    )
    _warn_if_busy(meta)
    bw_start = copy_bandwidth(device)
    print(f"copy bandwidth ({COPY_MIB} MiB, read+write): {bw_start / 1e9:.1f} GB/s", flush=True)

    launch_env = dict(os.environ)  # importing verl sets variables; the subprocesses get these
    impls = load_impls(args.impls)
    meta["verl_status"] = next(
        (f"{meta['verl']} (called)" if i.make else i.status for i in impls if i.key == "verl"),
        "not run",
    )
    per_shape: list[float] = []
    rows = run_timings(impls, args.shapes, device, args, per_shape)
    bw_end = copy_bandwidth(device)
    # the fastest measurement gives the tightest (least flattering) bound
    bandwidth = max(bw_start, bw_end, *per_shape)
    meta["copy_bandwidth_gbps"] = {
        "start": bw_start / 1e9,
        "before_each_shape": [round(b / 1e9, 2) for b in per_shape],
        "end": bw_end / 1e9,
        "used": bandwidth / 1e9,
    }
    meta["loadavg_end"] = loadavg()
    meta["timing_wall_s"] = round(time.perf_counter() - t_start, 1)
    if device.type == "cpu" and not args.no_memory:
        todo = rows
        if args.quick:  # one shape proves the method runs; each subprocess costs seconds
            todo = [r for r in rows if r.shape == args.shapes[-1]]
            for r in rows:
                if r.shape != args.shapes[-1] and r.memory_status == "not measured":
                    r.memory_status = "skipped (--quick)"
        run_memory_subprocesses(todo, args.seed, args.memory_jobs, launch_env)
    meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_outputs(meta, rows, bandwidth, args)
    print(f"total {time.perf_counter() - t_start:.1f} s", flush=True)
    failed = [
        f"{r.impl.key} {r.shape[0]}x{r.shape[1]}"
        for r in rows
        if r.status.startswith("failed") or r.memory_status.startswith("failed")
    ]
    if failed:
        print(f"FAILED rows (see the JSON or the messages above): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
