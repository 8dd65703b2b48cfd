"""Experiment: what a hand-written one-pass CPU kernel would gain over the Inductor kernel.

Not part of gmpo_core and not used by it. ``gmpo_core``'s compiled forward kernel reads each row
twice (a row-sum loop, then a loop that writes the gradient: Inductor does not fuse them). This
prototype, C++/OpenMP built with ``torch.utils.cpp_extension.load_inline`` (needs a C++ compiler
and ninja; about a minute to build), reads each row once: its second loop finds the row in the
core's cache. It covers the plain variant only (float32, no KL, no weights, no dual clip) and
fewer statistics than the real kernel, so it flatters itself a little. It checks its loss and
gradient against ``gmpo_loss(impl="eager")`` and exits 1 if they disagree, then times both
kernels alone in ``bench_loss.py``'s conditions (a TRL-transcription call before each timed
call), and once more at once (inputs in cache)::

    python benchmarks/experiments/onepass_cpu.py              # 256x4096 and 512x8192
    python benchmarks/experiments/onepass_cpu.py 64x2048

Discussion: docs/benchmarks.md, "Where the time goes".
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_loss as bl

from gmpo_core import fused, gmpo_loss

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>
std::vector<torch::Tensor> onepass(torch::Tensor logp, torch::Tensor old, torch::Tensor adv, torch::Tensor mask, double eps_lo, double eps_hi) {
  const int64_t B = logp.size(0), T = logp.size(1);
  auto grad = torch::empty_like(logp);
  auto rows = torch::empty({4, B}, logp.options());
  const float* lp = logp.data_ptr<float>(); const float* op = old.data_ptr<float>();
  const float* ap = adv.data_ptr<float>(); const uint8_t* mp = mask.data_ptr<uint8_t>();
  float* gp = grad.data_ptr<float>(); float* rp = rows.data_ptr<float>();
  const float inf = std::numeric_limits<float>::infinity();
  #pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < B; ++i) {
    const float* l = lp + i * T; const float* o = op + i * T; const uint8_t* m = mp + i * T;
    const float a = ap[i];
    const float lo = a >= 0 ? -inf : (float)-eps_lo, hi = a >= 0 ? (float)eps_hi : inf;
    float s = 0.f, n = 0.f, clipped = 0.f, rmax = -inf;
    #pragma omp simd reduction(+:s,n,clipped) reduction(max:rmax)
    for (int64_t t = 0; t < T; ++t) {
      const float v = (float)m[t];
      const float d = l[t] - o[t];
      const float r = v != 0.f ? d : 0.f;
      const float c = r < lo ? lo : (r > hi ? hi : r);
      s += c; n += v; clipped += (r < lo || r > hi) ? 1.f : 0.f;
      const float rm = v != 0.f ? r : -inf;
      rmax = rmax > rm ? rmax : rm;
    }
    const float nf = n > 1.f ? n : 1.f;
    const float lc = s / nf;
    const float policy = (a != 0.f && n > 0.f) ? -a * std::exp(lc) : 0.f;
    const float coef = policy / nf / (float)B;
    float* g = gp + i * T;
    #pragma omp simd
    for (int64_t t = 0; t < T; ++t) {
      const float r = l[t] - o[t];
      const float v = (float)m[t];
      g[t] = (v != 0.f && r >= lo && r <= hi) ? coef : 0.f;
    }
    rp[i] = policy; rp[B + i] = lc; rp[2 * B + i] = clipped; rp[3 * B + i] = rmax;
  }
  auto loss = rows[0].mean();
  return {loss, rows, grad};
}
"""

FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math", "-fno-math-errno"]
FLAGS += ["-fassociative-math", "-fno-signed-zeros"]  # lets the row sums vectorize


def main(shapes: list[str]) -> int:
    t0 = time.perf_counter()
    mod = load_inline(
        "gmpo_onepass_experiment", cpp_sources=SOURCE, functions=["onepass"],
        extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
    )  # fmt: skip
    print(f"built in {time.perf_counter() - t0:.1f} s")
    torch.set_num_threads(2)
    for shape in shapes:
        b, t = (int(v) for v in shape.split("x"))
        x = bl.make_inputs(b, t, torch.device("cpu"))
        mask, lp = x.mask.view(torch.uint8), x.logp.detach()
        loss, _, grad = mod.onepass(lp, x.old_logp, x.advantages, mask, bl.EPSILON, bl.EPSILON)
        ref = gmpo_loss(x.logp, x.old_logp, x.advantages, x.mask, epsilon=bl.EPSILON, impl="eager")
        (ref_grad,) = torch.autograd.grad(ref.loss, x.logp)
        if not (
            torch.allclose(loss, ref.loss.detach(), rtol=1e-5, atol=1e-7)
            and torch.allclose(grad, ref_grad, rtol=1e-5, atol=1e-12)
        ):
            print(f"{shape}: the prototype disagrees with gmpo_loss", file=sys.stderr)
            return 1
        (trl,) = bl.load_impls(["trl"])
        assert trl.make is not None
        sweep = trl.make(x)
        kernels = fused.default_kernels()
        params = fused._params(bl.EPSILON, bl.EPSILON, None, 0.0, torch.float32, lp.device)
        args = (lp, x.old_logp, x.advantages, mask)
        calls = {
            "inductor": functools.partial(
                kernels.forward, *args, None, None, None, params, False, True
            ),
            "one pass": functools.partial(mod.onepass, *args, bl.EPSILON, bl.EPSILON),
        }
        for f in (*calls.values(), sweep):
            for _ in range(3):
                f()
        samples: dict[str, list[float]] = {}
        for _ in range(25):
            for name, f in calls.items():
                bl.timed_call(sweep, x)
                for key in (name, f"{name}, again at once"):
                    t0 = time.perf_counter()
                    out = f()
                    samples.setdefault(key, []).append(time.perf_counter() - t0)
                    del out
        print(f"{shape}, 2 threads, 25 repeats, median ms of the kernel alone:")
        for key, values in samples.items():
            print(f"  {key}: {statistics.median(values) * 1e3:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["256x4096", "512x8192"]))
