"""A hand-written one-pass CPU forward kernel for the common float32 case.

The Inductor forward kernel (:func:`gmpo_core.fused._forward_kernel` compiled) reads every row
twice: a loop of row sums over all rows, a serial per-row step, then a loop over all rows that
writes the gradient. From about 2^22 tokens the second read comes from memory again, and Inductor
cannot be steered into fusing the two loops. This kernel runs the same computation one row at a
time: the row's sums, its per-row step, then its gradient while the row is still in the core's
cache, so a forward+backward reads logp, old_logp and the mask from memory once and writes the
gradient once; from :data:`STREAM_TOKENS` tokens it writes the gradient with streaming stores,
which skip reading its lines into the cache first (x86). It is written with ATen's portable
vector types and built by Inductor's own C++ toolchain (the compiler, flags and vector ISA that
``torch.compile`` uses on this machine).

It covers float32 ``logp``/``old_logp``/advantages, a bool or uint8 mask, with or without a dual
clip and per-row weights, where the forward also writes the gradient (``speculate``): what
``loss.backward()`` on a float32 policy runs. The KL term, per-token weights, float64 and low
precision take the Inductor kernel, which remains the reference for this one: the property tests
run both against the eager building blocks. The formulas are those of
:func:`gmpo_core.loss._terms`, :func:`gmpo_core.ops._clip_stats` and
:func:`gmpo_core.ops.metric_vector`, in the same order of operations where it matters (the
gradient's per-row value is ``(policy / B) / max(n, 1)``).

If the build fails, the Inductor kernel runs instead (logged once); nothing else changes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import Tensor

_log = logging.getLogger(__name__)

# Below this many tokens a single thread does the work (an OpenMP team costs a few us to wake).
_PARALLEL_TOKENS = 1 << 15
# From this many tokens the gradient is written around the caches (streaming stores): no
# read-for-ownership of its lines, and the inputs keep the cache. Its reader, the backward of
# whatever produced logp (in an RL step the LM head's), is dominated by other work.
STREAM_TOKENS = 1 << 20

_SOURCE = r"""
#include <torch/csrc/inductor/cpp_prefix.h>

// Per row i (T tokens): r = mask ? logp - old_logp : 0; c = clamp(r, lo_i, hi_i);
// log_coef = sum(c) / max(n, 1); policy = active ? -A exp(log_coef) w : 0; and the gradient of
// loss = mean(policy) with respect to logp: (policy / B) / max(n, 1) where the token is valid and
// unclipped, else 0. Counts below lo / above hi, and the extrema of r over valid tokens.
extern "C" void kernel(
    const float* logp, const float* old_logp, const uint8_t* mask, const float* adv,
    const float* w_row, const float* params,
    float* grad,        // (B, T)
    float* loss_out,    // (): the autograd function's outputs get buffers of their own
    float* per_seq,     // (B,)
    float* log_coef,    // (B,)
    float* rows,        // (7, B): policy, n, row_low, row_high, then scratch:
                        //         low, high and dual counts as floats
    float* extrema,     // (2, B) scratch: row min and max of r over valid tokens
    bool* nonempty,     // (B,)
    float* scalars,     // (3,): log_ratio_min, log_ratio_max, kl_sum
    int64_t* totals,    // (4,): num_tokens, num_clipped_low, num_clipped_high, num_clipped_dual
    float* metrics,     // (9,): METRIC_KEYS order
    const int64_t B, const int64_t T, const int64_t has_dual, const int64_t has_w_row,
    const int64_t stream)
{
    using Vec = at::vec::Vectorized<float>;
    using VecU8 = at::vec::Vectorized<uint8_t>;
    constexpr int64_t V = Vec::size();
    const float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float eps_low = params[0], eps_high = params[1], log_dual = params[2];
    const float g = 1.0f / static_cast<float>(B);  // d loss / d per_sequence_loss_i
    // k mask bytes as floats, zeros past them (a partial uint8 load does not zero-fill)
    auto load_mask = [](const uint8_t* p, int64_t k) {
        if (k == V) return at::vec::convert<float>(VecU8::loadu(p, V));
        alignas(64) float buf[V] = {};
        for (int64_t j = 0; j < k; ++j) buf[j] = static_cast<float>(p[j]);
        return Vec::loadu(buf);
    };
    float* policy_out = rows;
    float* n_out = rows + B;
    float* row_low = rows + 2 * B;
    float* row_high = rows + 3 * B;
    float* low_out = rows + 4 * B;
    float* high_out = rows + 5 * B;
    float* dual_out = rows + 6 * B;
    #pragma omp parallel for schedule(static) if (B * T >= PARALLEL_TOKENS)
    for (int64_t i = 0; i < B; ++i) {
        const float* l = logp + i * T;
        const float* o = old_logp + i * T;
        const uint8_t* m = mask + i * T;
        const float a = adv[i];
        // the row's one-sided trust region as bounds on r (ops._row_bounds)
        const float lo = a >= 0.0f ? -inf : -eps_low;
        const float hi = a >= 0.0f ? eps_high : (has_dual ? log_dual : inf);
        const Vec zero(0.0f), one(1.0f), vlo(lo), vhi(hi), vinf(inf), vninf(-inf);
        // NaN: the min/max below need not propagate it; lanes that saw a NaN are flagged and
        // the row's sum and extrema set to NaN after the loop (as torch's clamp, sum, amin give)
        Vec s(0.0f), n(0.0f), below(0.0f), above(0.0f), rmin(inf), rmax(-inf), nan_seen(0.0f);
        for (int64_t t = 0; t < T; t += V) {
            const int64_t k = std::min<int64_t>(V, T - t);  // a partial vector reads zeros
            const Vec valid = load_mask(m + t, k) != zero;  // all-ones lanes where valid
            const Vec r = Vec::blendv(zero, Vec::loadu(l + t, k) - Vec::loadu(o + t, k), valid);
            s += at::vec::clamp(r, vlo, vhi);
            n += valid & one;
            // r is 0 at invalid positions and lo <= 0 <= hi: no mask needed for the counts
            below += r.lt(vlo);
            above += r.gt(vhi);
            rmin = at::vec::clamp_max(Vec::blendv(vinf, r, valid), rmin);
            rmax = at::vec::clamp_min(Vec::blendv(vninf, r, valid), rmax);
            nan_seen = nan_seen | (r != r);
        }
        auto add = [](Vec& x, Vec& y) { return x + y; };
        const bool has_nan = at::vec::vec_reduce_all<float>(add, nan_seen & one) > 0.0f;
        const float s_i = has_nan ? nan : at::vec::vec_reduce_all<float>(add, s);
        const float n_i = at::vec::vec_reduce_all<float>(add, n);
        const float below_i = at::vec::vec_reduce_all<float>(add, below);
        const float above_i = at::vec::vec_reduce_all<float>(add, above);
        const float nf = std::max(n_i, 1.0f);
        const float lc = s_i / nf;
        const bool active = a != 0.0f && n_i > 0.0f;
        float policy = -a * std::exp(active ? lc : 0.0f);
        if (has_w_row) policy = policy * w_row[i];
        policy = active ? policy : 0.0f;
        // the gradient of this row, written while the row is in cache
        const Vec coef((g * policy) / nf);
        float* gr = grad + i * T;
        for (int64_t t = 0; t < T; t += V) {
            const int64_t k = std::min<int64_t>(V, T - t);
            const Vec d = Vec::loadu(l + t, k) - Vec::loadu(o + t, k);
            const Vec keep = (load_mask(m + t, k) != zero) & (d >= vlo) & (d <= vhi);
#if defined(CPU_CAPABILITY_AVX512)
            if (stream && k == V && (reinterpret_cast<uintptr_t>(gr + t) % 64) == 0) {
                _mm512_stream_ps(gr + t, Vec::blendv(zero, coef, keep));
                continue;
            }
#elif defined(CPU_CAPABILITY_AVX2)
            if (stream && k == V && (reinterpret_cast<uintptr_t>(gr + t) % 32) == 0) {
                _mm256_stream_ps(gr + t, Vec::blendv(zero, coef, keep));
                continue;
            }
#endif
            Vec::blendv(zero, coef, keep).store(gr + t, k);
        }
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
        if (stream) _mm_sfence();  // this thread's streaming stores, ordered before what follows
#endif
        per_seq[i] = policy;
        policy_out[i] = policy;
        log_coef[i] = lc;
        n_out[i] = n_i;
        const float low = a < 0.0f ? below_i : 0.0f;
        const float high = a > 0.0f ? above_i : 0.0f;
        low_out[i] = low;
        high_out[i] = high;
        dual_out[i] = a < 0.0f ? above_i : 0.0f;
        row_low[i] = low / nf;
        row_high[i] = high / nf;
        nonempty[i] = n_i > 0.0f;
        extrema[i] = has_nan ? nan : at::vec::vec_reduce_all<float>(
            [](Vec& x, Vec& y) { return at::vec::minimum(x, y); }, rmin);
        extrema[B + i] = has_nan ? nan : at::vec::vec_reduce_all<float>(
            [](Vec& x, Vec& y) { return at::vec::maximum(x, y); }, rmax);
    }
    // totals and extrema over rows (B values each: serial)
    double loss = 0.0;
    int64_t num = 0, low = 0, high = 0, dual = 0;
    float lr_min = inf, lr_max = -inf, rl_min = inf, rh_max = -inf;
    for (int64_t i = 0; i < B; ++i) {
        loss += per_seq[i];
        num += static_cast<int64_t>(n_out[i]);
        low += static_cast<int64_t>(low_out[i]);
        high += static_cast<int64_t>(high_out[i]);
        dual += static_cast<int64_t>(dual_out[i]);
        if (nonempty[i]) {
            lr_min = min_propagate_nan(lr_min, extrema[i]);
            lr_max = max_propagate_nan(lr_max, extrema[B + i]);
            rl_min = min_propagate_nan(rl_min, row_low[i]);
            rh_max = max_propagate_nan(rh_max, row_high[i]);
        }
    }
    loss_out[0] = static_cast<float>(loss / static_cast<double>(B));
    scalars[0] = lr_min;
    scalars[1] = lr_max;
    scalars[2] = 0.0f;
    totals[0] = num;
    totals[1] = low;
    totals[2] = high;
    totals[3] = dual;
    // ops.metric_vector
    const float nn = static_cast<float>(std::max<int64_t>(num, 1));
    const bool has = num > 0;
    const float low_mean = static_cast<float>(low) / nn, high_mean = static_cast<float>(high) / nn;
    metrics[0] = low_mean;
    metrics[1] = high_mean;
    metrics[2] = low_mean + high_mean;
    metrics[3] = has ? rl_min : nan;
    metrics[4] = has ? rh_max : nan;
    metrics[5] = has ? lr_min : nan;
    metrics[6] = has ? lr_max : nan;
    metrics[7] = has_dual ? static_cast<float>(dual) / nn : 0.0f;
    metrics[8] = 0.0f;
}
"""

_ARGTYPES = [
    "const float*", "const float*", "const uint8_t*", "const float*", "const float*",
    "const float*", "float*", "float*", "float*", "float*", "float*", "float*", "bool*",
    "float*", "int64_t*", "float*",
    "const int64_t", "const int64_t", "const int64_t", "const int64_t", "const int64_t",
]  # fmt: skip


class OnePass:
    """The one-pass kernel, called with the forward kernel's arguments where :meth:`applies`;
    it returns the forward kernel's outputs, or None where it could not be built (the caller
    then runs the Inductor kernel). Built on first use."""

    def __init__(self) -> None:
        self._kernel: Any = None
        self.failed = False  # the build failed: never again
        self.calls = 0  # calls that ran the kernel (tests read it)

    def applies(self, args: tuple[Any, ...]) -> bool:
        logp, old_logp, adv, mask, ref_logp, w_tok, w_row, params, _dual, speculate = args
        f32 = torch.float32
        return (
            speculate
            and not self.failed
            and ref_logp is None
            and w_tok is None
            and logp.device.type == "cpu"
            and logp.dtype == f32
            and old_logp.dtype == f32
            and adv.dtype == f32
            and params.dtype == f32
            and mask.dtype == torch.uint8
            and (w_row is None or w_row.dtype == f32)
            and logp.dim() == 2
            and not torch.compiler.is_compiling()
        )

    def __call__(self, *args: Any) -> tuple[Tensor | None, ...] | None:
        kernel = self._kernel or self._build()
        if kernel is None:
            return None
        self.calls += 1
        logp, old_logp, adv, mask, _, _, w_row, params, dual, _ = args
        b, t = logp.shape
        f32 = torch.float32
        grad = torch.empty((b, t), dtype=f32)
        loss = torch.empty((), dtype=f32)
        per_seq = torch.empty((b,), dtype=f32)
        log_coef = torch.empty((b,), dtype=f32)
        rows = torch.empty((7, b), dtype=f32)
        extrema = torch.empty((2, b), dtype=f32)
        nonempty = torch.empty((b,), dtype=torch.bool)
        scalars = torch.empty((3,), dtype=f32)
        totals = torch.empty((4,), dtype=torch.int64)
        metrics = torch.empty((9,), dtype=f32)
        kernel(
            logp.contiguous(), old_logp.contiguous(), mask.contiguous(), adv.contiguous(),
            params if w_row is None else w_row.contiguous(), params,
            grad, loss, per_seq, log_coef, rows, extrema, nonempty, scalars, totals, metrics,
            b, t, int(dual), int(w_row is not None), int(b * t >= STREAM_TOKENS),
        )  # fmt: skip
        policy, n, row_low, row_high, *_ = rows.unbind()
        lr_min, lr_max, kl_sum = scalars.unbind()
        num, low, high, num_dual = totals.unbind()
        stats = (num, low, high, num_dual if dual else None, row_low, row_high, nonempty)
        return (loss, per_seq, log_coef, policy, n, *stats, lr_min, lr_max, kl_sum, metrics, grad)

    def _build(self) -> Any:
        if self.failed:
            return None
        try:
            from torch._inductor.codecache import CppPythonBindingsCodeCache

            source = _SOURCE.replace("PARALLEL_TOKENS", str(_PARALLEL_TOKENS))
            self._kernel = CppPythonBindingsCodeCache.load_pybinding(_ARGTYPES, source)
        except Exception as e:  # any failure: the Inductor kernel from now on
            _log.info("gmpo_core: one-pass CPU kernel unavailable (%r); using Inductor's", e)
            self.failed = True
            return None
        return self._kernel
