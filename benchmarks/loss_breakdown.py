"""Where the compiled loss's time goes, in the loss benchmark's conditions.

``bench_loss.py`` interleaves the implementations, so each of our calls follows a call of the TRL
transcription, whose temporaries (34 MiB at 256x4096) evict our inputs and the interpreter's
working set from the caches. This script times, under the same condition (one TRL-transcription
call before every timed call), the full call and pieces of it::

    python benchmarks/loss_breakdown.py                  # 256x4096, 2 threads
    python benchmarks/loss_breakdown.py --shape 512x8192
    python benchmarks/loss_breakdown.py --quick          # tiny: proves the script runs (CI)

Rows (median ms of forward+backward unless said otherwise):

* ``full``: ``gmpo_loss(impl="compiled")``, ``out.metrics`` built, ``loss.backward()``, as in
  ``bench_loss.py``;
* ``forward kernel``: the compiled forward kernel alone (it also writes the gradient), called
  directly; ``forward kernel, again at once``: the same call repeated immediately, inputs in cache;
* ``bare``: a minimal autograd function around the same kernel call (no input validation, no
  statistics or metrics, one output) and its backward, which hands on the kernel's gradient:
  what remains of the Python and autograd cost when everything optional is gone;
* ``bare + validation`` and ``bare + metrics``: the cost of those two pieces on top.

It reaches into ``gmpo_core.fused`` (the default kernels): a diagnostic, not an API.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_loss import EPSILON, load_impls, make_inputs, parse_shapes, timed_call
from torch import Tensor

from gmpo_core import _checks, fused, gmpo_loss
from gmpo_core.ops import METRIC_KEYS, metrics_dict


def _kernel_call(x: Any) -> Callable[[], tuple[Tensor | None, ...]]:
    """The compiled forward kernel with the arguments ``gmpo_loss`` would give it."""
    kernels = fused.default_kernels()
    params = fused._params(EPSILON, EPSILON, None, 0.0, torch.float32, x.logp.device)
    mask = x.mask.view(torch.uint8)
    logp = x.logp.detach()
    args = (logp, x.old_logp, x.advantages, mask, None, None, None, params, False, True)
    return lambda: kernels.forward(*args)


class _Bare(torch.autograd.Function):
    """The kernel, one output, and a backward that hands on the gradient the kernel wrote."""

    @staticmethod
    def forward(ctx: Any, logp: Tensor, call: Callable[[], tuple[Tensor, ...]]) -> Tensor:
        out = call()
        ctx.grad = out[-1]
        return out[0]

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor | None, None]:
        grad, ctx.grad = ctx.grad, None
        return grad * grad_loss if bool(grad_loss != 1) else grad, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=parse_shapes, default=[(256, 4096)], help="one BxT")
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="8x64, 3 repeats")
    args = p.parse_args(argv)
    ((b, t),) = [(8, 64)] if args.quick else args.shape
    repeats = 3 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    x = make_inputs(b, t, torch.device("cpu"))
    (trl,) = load_impls(["trl"])
    assert trl.make is not None
    sweep = trl.make(x)  # the TRL transcription's step: what bench_loss runs between our calls
    kernel = _kernel_call(x)
    metric_vector = torch.zeros(len(METRIC_KEYS))

    def full() -> Tensor:
        out = gmpo_loss(x.logp, x.old_logp, x.advantages, x.mask, epsilon=EPSILON, impl="compiled")
        _ = out.metrics
        return out.loss

    def bare(validate: bool = False, metrics: bool = False) -> Callable[[], Tensor]:
        def step() -> Tensor:
            if validate:
                _checks.check_hyperparameters(EPSILON, None, None)
                _checks.check_beta(0.0, None)
                _checks.check_gmpo_inputs(x.logp, x.old_logp, x.advantages, x.mask, None, None)
            loss = _Bare.apply(x.logp, kernel)  # type: ignore[no-untyped-call]
            if metrics:
                metrics_dict(metric_vector, False, False)
            return loss  # type: ignore[no-any-return]

        return step

    steps = {"full": full, "bare": bare(), "bare + validation": bare(validate=True)}
    steps["bare + metrics"] = bare(metrics=True)
    for step in (*steps.values(), sweep):
        for _ in range(3):  # compile, warm up
            x.logp.grad = None
            step().backward()
    samples: dict[str, list[float]] = {k: [] for k in [*steps, "forward kernel"]}
    samples["forward kernel, again at once"] = []
    for _ in range(repeats):
        for key, step in steps.items():
            timed_call(sweep, x)
            samples[key].append(timed_call(step, x))
        timed_call(sweep, x)
        for key in ("forward kernel", "forward kernel, again at once"):
            t0 = time.perf_counter()
            out = kernel()
            samples[key].append(time.perf_counter() - t0)
            del out
    print(
        f"{b}x{t}, {args.threads} threads, {repeats} repeats, a TRL-transcription call before each"
    )
    print("| piece | median ms |\n|---|---|")
    for key, values in samples.items():
        print(f"| {key} | {statistics.median(values) * 1e3:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
