"""bench_lm_head.py's worker process: one path (materialized logits, TRL's chunked head or gmpo_core's), one size, in a fresh process (the parent runs it as ``bench_lm_head.py --worker``)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _common import (
    proc_status_kib,
    reset_peak_rss,
)

W_ROW_STRIDE = 97  # rows of the weight gradient saved for the cross-path comparison


def _make_inputs(
    n: int, hdim: int, vocab: int, seed: int, device: str = "cpu", dtype: str = "float32"
) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, hdim, generator=g)
    weight = torch.randn(vocab, hdim, generator=g) * (1.0 / hdim**0.5) * 4.0
    inputs = {
        "hidden": hidden,
        "weight": weight,
        "targets": torch.randint(0, vocab, (n,), generator=g),
        "g_logp": torch.randn(n, generator=g),
        "g_ent": torch.randn(n, generator=g) * 0.1,
    }
    inputs = {k: v.to(device) for k, v in inputs.items()}
    for k in ("hidden", "weight"):
        inputs[k] = inputs[k].to(getattr(torch, dtype))
    inputs["hidden"].requires_grad_()
    inputs["weight"].requires_grad_()
    return inputs


def _path_fn(path: str, chunk_size: int | None) -> Any:
    import torch

    if path == "materialized":

        def materialized(h: Any, w: Any, t: Any, temp: float, ent: bool) -> Any:
            logits = h @ w.t()  # (N, V)
            logp_all = torch.log_softmax(logits if temp == 1.0 else logits / temp, dim=-1)
            logps = logp_all.gather(-1, t.unsqueeze(-1)).squeeze(-1)
            entropies = -(logp_all.exp() * logp_all).sum(-1) if ent else None
            return logps, entropies

        return materialized
    if path == "trl":
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

        def trl_head(h: Any, w: Any, t: Any, temp: float, ent: bool) -> Any:
            out = ChunkedLogProbFunction.apply(
                h, w, None, t, temp, _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0,
                ("entropy",) if ent else (),
            )  # fmt: skip
            return out[0], out[1]

        return trl_head
    if path in ("gmpo", "gmpo-fp32-backward"):
        from gmpo_core.lm_head import DEFAULT_CHUNK_SIZE, token_logprobs

        cs = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
        backward = "half" if path == "gmpo" else "float32"

        def gmpo_head(h: Any, w: Any, t: Any, temp: float, ent: bool) -> Any:
            return token_logprobs(
                h, w, t, temperature=temp, chunk_size=cs, compute_entropy=ent,
                backward_precision=backward,
            )  # fmt: skip

        return gmpo_head
    raise ValueError(f"unknown path {path!r}")


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads) if args.threads else None
    fn = _path_fn(args.path, args.chunk_size)
    ent = args.outputs == "logp+entropy"

    def step(inp: dict[str, Any]) -> None:
        logps, entropies = fn(inp["hidden"], inp["weight"], inp["targets"], args.temperature, ent)
        loss = (logps * inp["g_logp"]).sum()
        if entropies is not None:
            loss = loss + (entropies * inp["g_ent"]).sum()
        loss.backward()
        inp["logps"], inp["entropies"] = logps.detach(), entropies

    # warmup at a tiny size: library initialization (oneDNN, trl import) is not what we measure
    step(_make_inputs(8, args.hidden, min(args.vocab, 4096), 1, args.device, args.dtype))
    inp = _make_inputs(args.n, args.hidden, args.vocab, args.seed, args.device, args.dtype)
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        rss = reset_peak_rss(trim=False)
    t0 = time.perf_counter()
    step(inp)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if cuda:
        peak_extra = torch.cuda.max_memory_allocated() - base
    else:
        peak_extra = (proc_status_kib("VmHWM") - rss) * 1024
    if args.save:
        w_grad = inp["weight"].grad
        torch.save(
            {
                "logps": inp["logps"],
                "entropies": None if inp["entropies"] is None else inp["entropies"].detach(),
                "grad_hidden": inp["hidden"].grad,
                "grad_weight_rows": w_grad[::W_ROW_STRIDE].clone(),
            },
            args.save,
        )
    print(json.dumps({"seconds": seconds, "peak_extra_bytes": peak_extra}))


# --------------------------------------------------------------------------------------------
# parent: interleaved subprocesses, comparison, tables, plots
