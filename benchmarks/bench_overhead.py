"""Where a plain call's time goes on a small batch, against verl's and TRL's GMPO losses.

Run from the repository root::

    python benchmarks/bench_overhead.py          # writes results/figures-bench/overhead_cpu.*

At 2×16 and 8×256 there is next to nothing to compute: every torch call costs its dispatch
whatever its size, so a call's time is about the number of torch calls it makes. This script
reports, for each implementation of ``bench_loss.py`` (same inputs, same step: forward, the
metrics, ``loss.backward()``):

* **torch calls**: functions and Tensor methods called from Python in one step (attribute
  reads left out), counted with a ``TorchFunctionMode``, split into the forward (the loss call
  and its metrics) and the backward (``loss.backward()``; autograd's own kernels run in C++ and
  are not counted);
* **time of each part** of gmpo's plain step, one torch thread, the thread's CPU time, the
  median of repeated calls, the parts taking turns call by call with verl's and TRL's steps:
  the whole step; the step without reading ``out.metrics``; the loss call alone (which writes
  the gradient); the math layer alone (``gmpo_core._math.forward``, statistics included); the
  clip statistics alone (``clip_signs`` and ``tally`` on the same intermediate tensors). The
  parts are their differences: metrics, backward, validation and ``autograd.Function`` glue,
  statistics, and the loss with its gradient. verl's and TRL's steps are split into forward and
  backward the same way.
* **dispatch against Python**: each implementation's forward with its metrics, its torch calls
  recorded with their arguments and called again straight-line (:func:`replay`: the same
  kernels and the same dispatch, in the grad mode each ran in, without the Python between
  them), timed with the parts. The forward's time less the replay's is what the Python around
  the torch calls costs (argument checks, helper functions, records, the
  ``autograd.Function``'s own bookkeeping).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import RESULTS, command_line, environment, steady_malloc, write_results
from bench_loss import EPSILON, make_inputs, make_step
from torch import Tensor
from torch.overrides import TorchFunctionMode

from gmpo_core import _counts, _math, _rows, gmpo_loss
from gmpo_core.options import check_hyperparameters

SHAPES = ((2, 16), (8, 256))
HOSTS = ("verl", "TRL")


class _Record(TorchFunctionMode):
    """Records each torch call from Python (attribute reads left out) with its arguments and
    whether grad mode was on, for :func:`count` and :func:`replay`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[bool, Callable[..., Any], Any, Any]] = []

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        if getattr(func, "__name__", "") != "__get__":
            self.calls.append((torch.is_grad_enabled(), func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def replay(fn: Callable[[], Any]) -> Callable[[], None]:
    """The torch calls ``fn`` makes from Python, called again straight-line on the arguments
    they had (each in the grad mode it ran in): the same kernels and dispatch, without the
    Python around them. The time of ``fn`` less this one's is what that Python costs."""
    fn()
    with _Record() as rec:
        fn()
    runs: list[tuple[bool, list[tuple[Callable[..., Any], Any, Any]]]] = []
    for grad, func, args, kwargs in rec.calls:
        if not runs or runs[-1][0] != grad:
            runs.append((grad, []))
        runs[-1][1].append((func, args, kwargs))

    def straight() -> None:
        for grad, calls in runs:
            with torch.set_grad_enabled(grad):
                for func, args, kwargs in calls:
                    func(*args, **kwargs)

    return straight


def count(fn: Callable[[], Any]) -> int:
    fn()  # first-call work is not what is counted
    with _Record() as rec:
        fn()
    return len(rec.calls)


def gmpo_parts(x: dict[str, Tensor]) -> dict[str, Callable[[], Any]]:
    """gmpo's plain step and the nested pieces whose differences are its parts."""
    logp, old, adv, mask = x["logp"], x["old_logp"], x["advantages"], x["mask"]
    eps_low, eps_high, _ = check_hyperparameters(EPSILON, None)
    h = _math.Hyper(eps_low, eps_high, None, 0.0)
    b = _math.Batch(logp.detach(), old, adv, mask, None, None, None, None)
    # the intermediate tensors the statistics start from, as _math.forward makes them
    mf = _math.as_float(mask, logp.dtype)
    r = torch.where(mask, logp.detach() - old, 0)
    sign, _, q, cq = _math.sign_space(r, adv, h)
    n = _rows.row_sum(mf, None, exact=True)
    nf = n.clamp(min=1)

    def statistics_only() -> None:
        _counts.tally(_counts.clip_signs(r, q, cq, mf, None, dual=False), sign, n, nf, dual=False)

    forward = make_step("gmpo plain", x, backward_too=False)
    return {
        "step": make_step("gmpo plain", x),
        "loss call": lambda: gmpo_loss(logp, old, adv, mask, epsilon=EPSILON),
        "loss call and metrics": forward,
        "math": lambda: _math.forward(b, h, True),
        "statistics": statistics_only,
        "calls straight-line": replay(forward),
    }


def host_parts(impl: str, x: dict[str, Tensor]) -> dict[str, Callable[[], Any]]:
    """A host's step, its forward with its metrics alone (the graph recorded, not run), and that
    forward's torch calls replayed straight-line."""
    forward = make_step(impl, x, backward_too=False)
    return {"step": make_step(impl, x), "forward": forward, "calls straight-line": replay(forward)}


def time_parts(parts: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each callable, taking turns call by call (thread CPU time)."""
    for fn in parts.values():
        for _ in range(20):
            fn()
    times: dict[str, list[float]] = {k: [] for k in parts}
    for _ in range(repeats):
        for k, fn in parts.items():
            t0 = time.thread_time()
            fn()
            times[k].append((time.thread_time() - t0) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def measure(shape: tuple[int, int], repeats: int) -> dict[str, Any]:
    x = make_inputs(*shape)
    g = gmpo_parts(x)
    hosts = {impl: host_parts(impl, x) for impl in HOSTS}
    parts = {f"gmpo {k}": fn for k, fn in g.items()}
    for impl, hp in hosts.items():
        parts.update({f"{impl} {k}": fn for k, fn in hp.items()})
    t = time_parts(parts, repeats)
    gmpo = {
        "step": t["gmpo step"],
        "metrics": t["gmpo loss call and metrics"] - t["gmpo loss call"],
        "backward": t["gmpo step"] - t["gmpo loss call and metrics"],
        "validation and Function glue": t["gmpo loss call"] - t["gmpo math"],
        "statistics (clip signs, tally)": t["gmpo statistics"],
        "loss and its gradient": t["gmpo math"] - t["gmpo statistics"],
    }
    out: dict[str, Any] = {"gmpo plain": gmpo}
    straight = {"gmpo plain": t["gmpo calls straight-line"]}
    for impl in HOSTS:
        step, fwd = t[f"{impl} step"], t[f"{impl} forward"]
        out[impl] = {"step": step, "forward and metrics": fwd, "backward": step - fwd}
        straight[impl] = t[f"{impl} calls straight-line"]
    calls = {"gmpo plain": count(g["step"])}
    calls.update({impl: count(hosts[impl]["step"]) for impl in HOSTS})
    calls_fwd = {"gmpo plain": count(g["loss call and metrics"])}
    calls_fwd.update({impl: count(hosts[impl]["forward"]) for impl in HOSTS})
    return {"time_ms": out, "calls": calls, "calls_forward": calls_fwd, "straight_ms": straight}


def report(result: dict[str, Any]) -> str:
    lines = ["# Where a small call's time goes", "", *environment(result)]
    lines += ["- clock: thread CPU time, one torch thread", ""]
    for shape, m in result["shapes"].items():
        g = m["time_ms"]["gmpo plain"]
        lines += [f"## {shape.replace('x', '×')}", ""]
        lines += ["| gmpo plain, part of a step | ms | share |", "|---|---|---|"]
        for k, v in g.items():
            if k != "step":
                lines.append(f"| {k} | {v:.3g} | {100 * v / g['step']:.0f} % |")
        lines += [f"| whole step | {g['step']:.3g} | |", ""]
        lines += ["| step | ms | forward and metrics, ms | backward, ms | torch calls "
                  "(forward and metrics) |", "|---|---|---|---|---|"]  # fmt: skip
        for impl in ("gmpo plain", *HOSTS):
            t, c, cf = m["time_ms"][impl], m["calls"][impl], m["calls_forward"][impl]
            fwd = t["step"] - t["backward"]
            lines.append(f"| {impl} | {t['step']:.3g} | {fwd:.3g} | {t['backward']:.3g} | "
                         f"{c} ({cf}) |")  # fmt: skip
        lines += ["", "| forward and metrics | ms | its torch calls straight-line, ms | Python "
                  "around them, ms | per call straight-line, us |", "|---|---|---|---|---|"]  # fmt: skip
        for impl in ("gmpo plain", *HOSTS):
            t, cf = m["time_ms"][impl], m["calls_forward"][impl]
            fwd, calls = t["step"] - t["backward"], m["straight_ms"][impl]
            lines.append(f"| {impl} | {fwd:.3g} | {calls:.3g} | {fwd - calls:.3g} | "
                         f"{1e3 * calls / cf:.2g} |")  # fmt: skip
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=2000, help="timed calls of each part")
    p.add_argument("--quick", action="store_true", help="few calls, nothing written (CI)")
    p.add_argument("--no-write", action="store_true", help="print the report only")
    args = p.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)
    result: dict[str, Any] = {"command": command_line(__file__, argv), "allocator": steady_malloc()}
    repeats = 20 if args.quick else args.repeats
    result["shapes"] = {f"{b}x{t}": measure((b, t), repeats) for b, t in SHAPES}
    text = report(result)
    print(text)
    if not (args.no_write or args.quick):
        write_results(RESULTS / "figures-bench" / "overhead_cpu", result, text, __file__, argv)


if __name__ == "__main__":
    main()
