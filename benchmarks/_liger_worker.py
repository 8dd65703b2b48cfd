"""bench_liger.py's worker process: one (B, T, H, V, dtype) on one device, every path of the
comparison, timed call by call in turns (``--time``), or one path's peak memory (``--memory``).
The parent runs it as ``bench_liger.py --worker ...`` and reads the JSON line it prints last.

Paths (the same inputs for all; every one ends in ``loss.backward()`` with gradients reaching the
hidden states and the LM-head weight):

* ``gmpo plain`` / ``gmpo compiled``: ``gmpo_core.lm_head.token_logprobs`` (no entropy), then
  ``gmpo_loss(impl=...)`` with its metrics built; ``gmpo plain fp32-backward``: the head with
  ``backward_precision="float32"`` (on a CPU the same code as ``gmpo plain``);
* ``Liger grpo`` / ``Liger dapo`` (``+ compiled``): liger-kernel's ``LigerFusedLinearGRPOLoss``
  (``chunked_loss``) with ``beta=0``, ``use_ref_model=False`` (no KL: gmpo's rows have none
  either) and ``old_per_token_logps`` given, ``compiled=`` False or True;
* ``TRL materialized``: the (N, V) logits ``h @ W.T``, ``log_softmax`` in float32 and ``gather``,
  then TRL 1.16's GMPO loss lines (``_hosts.trl_gmpo_loss``).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from _common import proc_status_kib, reset_peak_rss, steady_malloc
from _hosts import trl_gmpo_loss

W_ROW_STRIDE = 97  # rows of the weight gradient kept for the cross-path comparison
PATHS = (
    "gmpo plain",
    "gmpo compiled",
    "Liger grpo",
    "Liger grpo compiled",
    "Liger dapo",
    "Liger dapo compiled",
    "TRL materialized",
    "gmpo plain fp32-backward",
)
#: the paths run unless --paths says otherwise (the last: the same code as gmpo plain on a CPU)
DEFAULT_PATHS = PATHS[:-1]
Inputs = dict[str, Any]


def make_inputs(b: int, t: int, h: int, v: int, dtype: str, device: str, seed: int = 0) -> Inputs:
    """Liger's benchmark footing: hidden N(0, 1) (B, T, H) and an ``nn.Linear(H, V)`` weight in
    ``dtype``, random token ids, every token valid, N(0, 1) advantages; and the old log-probs,
    the policy's own (on-policy, as a first step after sampling): every ratio is 1 up to
    rounding, so every objective here has the same value and gradient (the comparison checks it)."""
    import torch

    from gmpo_core.lm_head import token_logprobs

    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / h**0.5  # nn.Linear's initialization
    x: Inputs = {
        "hidden": torch.randn(b, t, h, generator=g).to(dt),
        "weight": (torch.rand(v, h, generator=g) * 2 - 1).mul_(bound).to(dt),
        "ids": torch.randint(0, v, (b, t), generator=g),
        "adv": torch.randn(b, generator=g),
    }
    x = {k: val.to(device) for k, val in x.items()}
    with torch.no_grad():
        x["old"] = token_logprobs(x["hidden"], x["weight"], x["ids"], compute_entropy=False)[0]
    x["mask"] = torch.ones(b, t, dtype=torch.bool, device=device)
    x["mask_float"] = x["mask"].float()  # Liger's attention mask (its benchmark's torch.ones)
    x["mask_long"] = x["mask"].long()  # TRL's completion_mask
    x["hidden"].requires_grad_()
    x["weight"].requires_grad_()
    return x


def make_step(path: str, x: Inputs) -> Callable[[], float]:
    """One forward+backward of ``path`` on ``x``; returns the loss (a host read after the
    backward, outside nothing: every path pays it alike)."""
    import torch

    hidden, weight, ids, adv, old = x["hidden"], x["weight"], x["ids"], x["adv"], x["old"]

    def done(loss: torch.Tensor) -> float:
        loss.backward()
        return float(loss.detach())

    if path.startswith("gmpo"):
        from gmpo_core import gmpo_loss
        from gmpo_core.lm_head import token_logprobs

        impl = "compiled" if path.endswith("compiled") else "plain"
        backward = "float32" if path.endswith("fp32-backward") else "half"

        def gmpo() -> float:
            logp = token_logprobs(
                hidden, weight, ids, compute_entropy=False, backward_precision=backward
            )[0]
            out = gmpo_loss(logp, old, adv, x["mask"], impl=impl)  # type: ignore[arg-type]
            _ = out.metrics  # the metric tensors, as the hosts build them
            return done(out.loss)

        return gmpo
    if path.startswith("Liger"):
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        module = LigerFusedLinearGRPOLoss(
            beta=0.0,
            use_ref_model=False,
            loss_type=path.split()[1],
            compiled=path.endswith("compiled"),
        )

        def liger() -> float:
            loss, _metrics = module(
                hidden, weight, ids, x["mask_float"], adv, old_per_token_logps=old
            )
            return done(loss)

        return liger
    if path == "TRL materialized":

        def materialized() -> float:
            logits = hidden @ weight.t()  # (B, T, V)
            logp_all = torch.log_softmax(logits.float(), dim=-1)
            logp = logp_all.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
            return done(trl_gmpo_loss(logp, old, adv, x["mask_long"])[0])

        return materialized
    raise ValueError(f"unknown path {path!r}")


def _clear(x: Inputs) -> None:
    x["hidden"].grad = None
    x["weight"].grad = None


def _snapshot(x: Inputs, loss: float) -> dict[str, Any]:
    return {
        "loss": loss,
        "grad_hidden": x["hidden"].grad.detach().float().clone(),
        "grad_weight_rows": x["weight"].grad[::W_ROW_STRIDE].detach().float().clone(),
    }


def _differences(snaps: dict[str, dict[str, Any]], ref: str) -> dict[str, dict[str, float]]:
    """Each path's loss, and its largest |x − ref| / max |ref| per gradient."""
    out: dict[str, dict[str, float]] = {}
    base = snaps[ref]
    for path, s in snaps.items():
        d = {"loss": s["loss"], "loss_abs_diff": abs(s["loss"] - base["loss"])}
        for key in ("grad_hidden", "grad_weight_rows"):
            scale = float(base[key].abs().max().clamp(min=1e-30))
            d[key] = float((s[key].double() - base[key].double()).abs().max()) / scale
        out[path] = d
    return out


def time_paths(args: argparse.Namespace) -> dict[str, Any]:
    """Every path on the same inputs: one warm-up call each (the compiled paths compile there;
    its result is the values comparison), then ``repeats`` calls each, the paths taking turns
    call by call. Per call: the process's CPU time (all its threads) and the wall time; on CUDA
    the wall time between synchronizations and each path's peak allocated memory."""
    import torch

    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out: dict[str, Any] = {"allocator": None if cuda else steady_malloc()}
    x = make_inputs(args.b, args.t, args.h, args.v, args.dtype, args.device, args.seed)
    paths = args.paths.split(",")
    steps = {p: make_step(p, x) for p in paths}
    snaps: dict[str, dict[str, Any]] = {}
    cpu: dict[str, list[float]] = {p: [] for p in paths}
    wall: dict[str, list[float]] = {p: [] for p in paths}
    peak: dict[str, float] = {}
    for p, step in steps.items():
        _clear(x)
        snaps[p] = _snapshot(x, step())
    for rep in range(args.repeats):
        for p, step in steps.items():
            _clear(x)
            sync()
            if cuda and rep == 0:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            c0, w0 = time.process_time(), time.perf_counter()
            step()
            sync()
            cpu[p].append(time.process_time() - c0)
            wall[p].append(time.perf_counter() - w0)
            if cuda and rep == 0:
                peak[p] = float(torch.cuda.max_memory_allocated() - base)
    ref = "gmpo plain" if "gmpo plain" in snaps else paths[0]
    out.update(cpu_s=cpu, wall_s=wall, compare=_differences(snaps, ref), reference=ref)
    if cuda:
        out["peak_extra_bytes"] = peak
    return out


def memory_path(args: argparse.Namespace) -> dict[str, Any]:
    """One path in this fresh process (the parent sets ``MALLOC_ENV``): a warm-up call (imports,
    compilation), then the high-water mark is reset and one call measured; peak extra = VmHWM −
    VmRSS after the reset: everything the call allocated, both gradients included, the inputs
    excluded."""
    x = make_inputs(args.b, args.t, args.h, args.v, args.dtype, args.device, args.seed)
    step = make_step(args.paths, x)
    _clear(x)
    step()
    _clear(x)
    base = reset_peak_rss()
    step()
    return {"peak_extra_bytes": (proc_status_kib("VmHWM") - base) * 1024.0}


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    result = memory_path(args) if args.memory else time_paths(args)
    print(json.dumps(result))
