"""Where the compiled loss's time goes, in the loss benchmark's conditions.

Times the full call and pieces of it under either of ``bench_loss.py``'s timings::

    python benchmarks/loss_breakdown.py                        # 256x4096, 2 threads, rotating
    python benchmarks/loss_breakdown.py --shape 512x8192
    python benchmarks/loss_breakdown.py --timing interleaved   # a TRL call before each
    python benchmarks/loss_breakdown.py --quick                # tiny: proves the script runs (CI)

``rotating`` (bench_loss's default) cycles through input sets that together exceed the caches:
inputs come from memory, code stays warm. ``interleaved`` runs one call of the TRL transcription
before every timed call, whose temporaries (34 MiB at 256x4096) evict our inputs and the
interpreter's working set alike.

Rows (median ms of forward+backward unless said otherwise):

* ``full``: ``gmpo_loss(impl="compiled")``, ``out.metrics`` built, ``loss.backward()``, as in
  ``bench_loss.py``;
* ``forward kernel``: the kernel the compiled path runs here (the one-pass kernel in float32),
  called directly; it also writes the gradient. Beside it, ``one-pass kernel, no streaming
  stores`` and ``Inductor's forward kernel`` (what would run without the one-pass kernel);
* ``bare``: a minimal autograd function around the same kernel call (no input validation, no
  statistics or metrics, one output) and its backward, which hands on the kernel's gradient:
  what remains of the Python and autograd cost when everything optional is gone;
* ``bare + validation`` and ``bare + metrics``: the cost of those two pieces on top;
* ``empty autograd function``: a function that computes nothing, forward and backward: the
  floor of any loss called from Python under autograd.

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
from _common import steady_malloc
from bench_loss import EPSILON, input_sets, load_impls, parse_shapes, timed_call
from torch import Tensor

from gmpo_core import _checks, _onepass, fused, gmpo_loss
from gmpo_core.ops import METRIC_KEYS, metrics_dict


def _kernel_calls(x: Any) -> dict[str, Callable[[], Any]]:
    """The forward kernel ``gmpo_loss`` runs on these inputs (with the arguments it would give)
    and, where that is the one-pass kernel, the alternatives: without streaming stores, and
    Inductor's compiled forward."""
    kernels = fused.default_kernels()
    params = fused._params(EPSILON, EPSILON, None, 0.0, torch.float32, x.logp.device)
    mask = x.mask.view(torch.uint8)
    logp = x.logp.detach()
    args = (logp, x.old_logp, x.advantages, mask, None, None, None, params, False, True)
    onepass = kernels.onepass
    if onepass is None or not onepass.applies(args):
        return {"forward kernel": lambda: kernels.forward(*args)}

    def plain_stores() -> Any:
        saved, _onepass.STREAM_TOKENS = _onepass.STREAM_TOKENS, 1 << 62
        try:
            return onepass(*args)
        finally:
            _onepass.STREAM_TOKENS = saved

    return {
        "forward kernel": lambda: onepass(*args),
        "one-pass kernel, no streaming stores": plain_stores,
        "Inductor's forward kernel": lambda: kernels.forward(*args),
    }


class _Empty(torch.autograd.Function):
    """Nothing computed: the cost of an autograd function called from Python."""

    @staticmethod
    def forward(ctx: Any, logp: Tensor) -> Tensor:
        return logp.new_zeros(())

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> None:
        return None


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
    p.add_argument("--timing", default="rotating", choices=("rotating", "interleaved"))
    p.add_argument("--repeats", type=int, default=24)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="8x64, 3 repeats")
    args = p.parse_args(argv)
    ((b, t),) = [(8, 64)] if args.quick else args.shape
    repeats = 3 if args.quick else args.repeats
    torch.set_num_threads(args.threads)
    steady_malloc()  # as bench_loss.py does
    xs = input_sets((b, t), torch.device("cpu"), 0, torch.float32, args.timing)
    (trl,) = load_impls(["trl"])
    assert trl.make is not None
    sweep = trl.make(xs[0])  # the TRL transcription's step: what bench_loss runs between calls
    metric_vector = torch.zeros(len(METRIC_KEYS))

    def pieces(x: Any) -> dict[str, Callable[[], Tensor]]:
        kernel = _kernel_calls(x)["forward kernel"]

        def full() -> Tensor:
            out = gmpo_loss(
                x.logp, x.old_logp, x.advantages, x.mask, epsilon=EPSILON, impl="compiled"
            )
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

        return {
            "full": full,
            "bare": bare(),
            "bare + validation": bare(validate=True),
            "bare + metrics": bare(metrics=True),
            "empty autograd function": lambda: _Empty.apply(x.logp),  # type: ignore[no-untyped-call]
        }

    sets = [(x, pieces(x), _kernel_calls(x)) for x in xs]
    for x, steps, kernels in sets:
        for step in (*steps.values(), sweep):
            for _ in range(3):  # compile, warm up
                x.logp.grad = None
                step().backward()
        for kernel in kernels.values():
            kernel()
    samples: dict[str, list[float]] = {k: [] for k in [*sets[0][1], *sets[0][2]]}
    before = (lambda: timed_call(sweep, xs[0])) if args.timing == "interleaved" else None
    for _ in range(-(-repeats // len(sets))):
        for key in sets[0][1]:
            for x, steps, _ in sets:
                if before is not None:
                    before()
                samples[key].append(timed_call(steps[key], x))
        for key in sets[0][2]:
            for _x, _, kernels in sets:
                if before is not None:
                    before()
                t0 = time.perf_counter()
                out = kernels[key]()
                samples[key].append(time.perf_counter() - t0)
                del out
    condition = (
        "a TRL-transcription call before each"
        if args.timing == "interleaved"
        else f"rotating over {len(sets)} input sets"
    )
    print(f"{b}x{t}, {args.threads} threads, {len(samples['full'])} samples, {condition}")
    print("| piece | median ms |\n|---|---|")
    for key, values in samples.items():
        print(f"| {key} | {statistics.median(values) * 1e3:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
