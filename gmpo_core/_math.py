"""The GMPO objective as pure functions of two records: the one math layer of :mod:`gmpo_core`.

Every path runs :func:`forward`: the plain path eagerly inside one ``torch.autograd.Function``
(:mod:`gmpo_core.loss`) whose backward scales the gradient :func:`forward` wrote, the compiled
path the same function under ``torch.compile`` (:mod:`gmpo_core.compiled`), and a user's
``torch.compile`` traces it under autograd. The public building blocks (:mod:`gmpo_core.ops`) call the pieces. docs/semantics.md
states every rule; its section numbers are cited as S1, S2, ...

Inputs travel as a :class:`Batch` (tensors) and a :class:`Hyper` (validated hyper-parameters:
Python floats, or 0-d tensors on the compiled path so that new values never recompile). Nothing
here validates or synchronizes with the device.

A row is a padded row of a (B, T) batch or a segment of packed (N,) tokens
(:mod:`gmpo_core._rows`), both run by the same formulas. With an :class:`Across`, a row's tokens
are split across the ranks of a process group: the per-row sums are all-reduced before the
exponential.

On CPU, ATen's kernels that read or write ``bool`` tensors are several times slower than float
arithmetic, so masks enter arithmetic as 0/1 floats (:func:`as_float`), and ``torch.where`` with
the mask is used once per input that may hold junk at masked positions (S6).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from gmpo_core._across import Across, Totals, all_rows
from gmpo_core._counts import Cuts, Tally, clip_signs, passes, tally
from gmpo_core._rows import (
    Segments,
    constant,
    differentiated,
    row_sum,
    segments,
    to_tokens,
    wide_sum,
)

Bound = float | Tensor


class Hyper(NamedTuple):
    """Validated hyper-parameters."""

    eps_low: Bound  # log-space lower bound: r >= -eps_low where A < 0
    eps_high: Bound  # log-space upper bound: r <= eps_high where A >= 0
    log_dual: Bound | None  # log of the dual-clip cap (A < 0 rows); None: no dual clip
    beta: Bound  # weight of the sequence KL


class Batch(NamedTuple):
    """The loss's tensors, validated; every one but ``logp`` is detached (a constant of the loss).

    Shape:
        padded: logp, old_logp, mask, ref_logp, w_tok: (B, T). adv, w_row: (B,).
        packed (``cu_seqlens`` given): logp, old_logp, mask, ref_logp, w_tok: (N,); adv, w_row:
        (S,); cu_seqlens: (S + 1,) integer, row i is tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``.
    """

    logp: Tensor
    old_logp: Tensor
    adv: Tensor
    mask: Tensor  # bool, or 0/1 of any real dtype
    ref_logp: Tensor | None  # None when beta == 0
    w_tok: Tensor | None  # per-token rollout weights
    w_row: Tensor | None  # per-row rollout weights
    cu_seqlens: Tensor | None = None  # packed segments; None: padded rows


class RowSums(NamedTuple):
    """The per-row sums :func:`forward` reduces before the exponential: the clipped log-ratios,
    the valid tokens, and where present the log rollout weights, the k3 KL, and (split across
    ranks) the cut counts. ``present()`` is the fixed order in which a split forward all-reduces
    them. Shape: (B,) each."""

    cq: Tensor
    n: Tensor
    log_w: Tensor | None = None
    kl: Tensor | None = None
    cut: Tensor | None = None
    signed: Tensor | None = None

    def present(self) -> list[Tensor]:
        return [t for t in self if t is not None]

    def replaced(self, values: list[Tensor]) -> RowSums:
        """The same fields, the present ones replaced by ``values`` in :meth:`present`'s order
        (built field by field, not by ``_replace`` or ``_make``: traceable by every supported
        ``torch.compile``)."""
        out: list[Tensor | None] = []
        k = 0
        for t in self:
            out.append(None if t is None else values[k])
            k += t is not None
        return RowSums(out[0], out[1], out[2], out[3], out[4], out[5])  # type: ignore[arg-type]


class Forward(NamedTuple):
    """What :func:`forward` returns. ``loss``, ``per_sequence_loss`` and ``log_coef`` are
    differentiable in ``logp`` when run under autograd; the rest is detached.

    Shape:
        loss: (). per_sequence_loss, log_coef: (B,).
    """

    loss: Tensor
    per_sequence_loss: Tensor
    log_coef: Tensor
    stats: Tally  # the clip statistics (S10)
    kl_sum: Tensor | None  # sum of the k3 estimator over valid tokens; None without KL
    loss_grad: Tensor | None  # (B, T) or (N,) d loss / d logp, compute dtype, when asked for
    totals: Totals | None = None  # the reduced sums, with an Across


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, bf16 and fp16 are computed in float32 (S8)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def to_dtype(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, without the call where ``x`` has that dtype (on a small batch a call
    costs its dispatch, even one that returns ``x``)."""
    return x if x.dtype == dtype else x.to(dtype)


def valid_tokens(mask: Tensor, w_tok: Tensor | None = None) -> Tensor:
    """mask != 0, minus the tokens whose rollout weight is exactly 0 (S7). Shape: (B, T) bool."""
    if mask.dtype == torch.bool:
        valid = mask
    elif torch.compiler.is_compiling() and not mask.is_floating_point():
        # compiled code loads bytes as a mask slowly, as numbers fast; exact for integers
        valid = mask.to(torch.float32) != 0
    else:
        valid = mask != 0
    return valid if w_tok is None else valid & (w_tok != 0)


def as_float(valid: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool tensor as 0/1 floats: eagerly through a zero-copy uint8 view (ATen converts uint8
    to float ~10x faster than bool on CPU); directly where traced (compiled code converts bool
    well, and a dtype view would be compiled to a scalar loop). Shape: unchanged."""
    if torch.compiler.is_compiling():
        return valid.to(dtype)
    return valid.view(torch.uint8).to(dtype)


def sign_space(
    r: Tensor, adv: Tensor, h: Hyper, seg: Segments | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The trust region (S1) in sign space, ``q = sgn r`` with sgn = +1 where A >= 0 and -1
    where A < 0, where every row's region is the upper bound ``q <= eps`` (eps_high where
    A >= 0, eps_low where A < 0), and under a dual clip also ``q >= -log dual_clip`` where
    A < 0. Where the result may be differentiated (:func:`differentiated`), each bound is a
    ``torch.where`` on a strict comparison, which passes the gradient 1 to a value exactly on the
    bound on every torch (a ``clamp`` passes 1 there on torch 2.4 to 2.13; torch 2.14.1 passes
    0.5 with a tensor bound, 0 with a number bound). Elsewhere (the paths' forward, which writes
    the gradient itself) it is a ``clamp``, the same values in one pass: the comparison and the
    ``where`` on its bool result took 12 % of a plain call at 256 x 4096 on CPU
    (docs/benchmarks.md). Equal bounds given as numbers (the plain path's) stay numbers: no
    per-row tensor of them is made.

    Returns ``(sign(A), sgn, q, clipped q)``. Shape: r (B, T) or (B,), adv (B,) -> sign(A) and
    sgn (B,), q and clipped q of r's shape; or with ``seg``, r (N,) and adv (S,) -> (S,), (S,),
    (N,), (N,).
    """
    sign = torch.sign(adv)  # (B,) -1, 0, 1
    sgn = sign + (sign == 0)  # (B,) -1, 1
    q = r * along(sgn, r, seg)
    cap: Bound
    if isinstance(h.eps_high, float) and h.eps_high == h.eps_low:
        cap = h.eps_high
    else:
        one = torch.ones_like(adv)
        cap = along(torch.where(sgn > 0, one * h.eps_high, one * h.eps_low), r, seg)
    exact = differentiated(q)  # the gradient on a bound is 1 on every torch
    cq = torch.where(q > cap, cap, q) if exact else q.clamp(max=cap)
    if h.log_dual is not None:
        floor = along(torch.where(sgn > 0, -math.inf, -h.log_dual * torch.ones_like(adv)), r, seg)
        cq = torch.where(cq < floor, floor, cq) if exact else cq.clamp(min=floor)
    return sign, sgn, q, cq


def along(values: Tensor, r: Tensor, seg: Segments | None) -> Tensor:
    """Per-row values where they broadcast against ``r``: per token (a (B, T) or packed r) or
    per row (a (B,) r). Shape: (B,) -> (B, 1) or (B,); (S,) -> (N,)."""
    if seg is not None or r.dim() == 2:
        return to_tokens(values, seg)
    return values


def trust_region(r: Tensor, adv: Tensor, h: Hyper, seg: Segments | None = None) -> Tensor:
    """The clipped log-ratio c (S1): ``min(r, eps_high)`` where A >= 0, ``max(r, -eps_low)``
    (and ``min(., log dual_clip)``) where A < 0. Shape: r (B, T) or (B,), adv (B,) -> r's; or
    with ``seg``, r (N,), adv (S,) -> (N,)."""
    _, sgn, _, cq = sign_space(r, adv, h, seg)
    return cq * along(sgn, r, seg)


def masked_mean(x: Tensor, valid: Tensor, n: Tensor, seg: Segments | None = None) -> Tensor:
    """Row sums of ``x`` over valid positions divided by max(n, 1) (S2). Values at invalid
    positions never matter. Shape: (B, T), (B, T), (B,) -> (B,); or (N,), (N,), (S,) -> (S,)."""
    return row_sum(torch.where(valid, x, 0), seg) / n.clamp(min=1)


def k3(logp: Tensor, ref_logp: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
    """The k3 estimator of KL(pi || pi_ref) per token, ``expm1(d) - d`` with d = ref - logp
    (S3): never negative, exactly 0 at invalid positions; and ``expm1(d)`` (its gradient with
    respect to ``logp`` is ``-expm1(d)``). Shape: (B, T) -> (B, T), (B, T)."""
    d = torch.where(valid, ref_logp - logp, 0)
    em1 = torch.expm1(d)
    return em1 - d, em1


def forward(b: Batch, h: Hyper, with_grad: bool = False, across: Across | None = None) -> Forward:
    """Eq. 4 of the paper per row (S1-S8), its statistics (S10), and with ``with_grad`` the
    gradient of ``loss`` with respect to ``logp``, written out::

        d loss / d logp_t = [passes_t policy_i - beta expm1(ref_t - logp_t)] / (B n_i)

    where ``passes_t`` is 1 at valid tokens where the clamp passes the gradient (S1) and
    ``policy_i`` the row's policy term, its own derivative with respect to ``log_coef_i``. Every
    row's gradient is proportional to the upstream gradient of its ``per_sequence_loss``, so a
    backward only scales it per row.

    Rows are padded (B, T) or, with ``b.cu_seqlens``, segments of packed (N,) tokens. With
    ``across``, every per-row sum is the sum over the group's ranks (:func:`all_rows`), so every
    rank computes the whole rows' values, and the gradient at its own tokens.

    ``b`` holds the inputs in their own dtypes; everything is computed in :func:`compute_dtype`
    of ``logp``'s.
    """
    dt = compute_dtype(b.logp.dtype)
    seg = None if b.cu_seqlens is None else segments(b.cu_seqlens, b.logp.shape[0])
    logp, adv = to_dtype(b.logp, dt), to_dtype(b.adv, dt)
    valid = valid_tokens(b.mask, b.w_tok)  # (B, T) bool
    mf = as_float(valid, dt)  # (B, T) 0/1
    r = torch.where(valid, logp - to_dtype(b.old_logp, dt), 0)  # (B, T), 0 at invalid positions
    sign, sgn, q, cq = sign_space(r, adv, h, seg)  # (B,) x2, (B, T) x2: cq is 0 where r is
    cq_rows, n_rows = row_sum(cq, seg), row_sum(mf, seg, exact=True)  # (B,) each
    log_w_rows = kl_rows = em1 = None
    if b.w_tok is not None:  # per-token weights enter as their geometric mean (S7)
        log_w_rows = row_sum(torch.where(valid, torch.log(b.w_tok.to(dt)), 0), seg)
    if b.ref_logp is not None:  # the k3 estimator expm1(d) - d, d = ref - logp (S3)
        k, em1 = k3(logp, b.ref_logp.to(dt), valid)  # (B, T) each
        kl_rows = row_sum(k, seg)
    totals = clip = None
    dual = h.log_dual is not None
    if across is not None:  # every sum before the exponential
        clip = clip_signs(r, q, cq, mf, seg, dual=dual)
        sums = RowSums(cq_rows, n_rows, log_w_rows, kl_rows, clip.cut_rows, clip.signed_rows)
        reduced, lo, neg_hi, totals = all_rows(sums.present(), clip.lo, clip.neg_hi, across)
        sums = sums.replaced(reduced)
        clip = Cuts(clip.s, reduced[-2], reduced[-1], lo, neg_hi)  # present(): cut, signed last
        n_rows = sums.n
        # the reduced sums are in the dtype they were stacked in; the counts are made dt below
        cq_rows = to_dtype(sums.cq, dt)
        log_w_rows = None if sums.log_w is None else to_dtype(sums.log_w, dt)
        kl_rows = None if sums.kl is None else to_dtype(sums.kl, dt)
    # counts stay exact (float64 where float32 would not be); the other local sums are in dt
    n_exact, n = n_rows, to_dtype(n_rows, dt)
    nf = n.clamp(min=1)
    log_coef = sgn * cq_rows / nf  # (B,) the log geometric mean of the clipped ratios (S2)
    # (B,) empty and A = 0 rows (sign(A) n = 0): policy term exactly 0 (S4, S5)
    active = (sign * n) != 0
    log_w = log_coef
    if log_w_rows is not None:
        log_w = log_coef + log_w_rows / nf
    # exp(-inf) = 0 in inactive rows, where no gradient reaches log_w (no inf * 0 in a backward)
    policy = -adv * torch.exp(torch.where(active, log_w, -math.inf))  # (B,)
    if b.w_row is not None:
        policy = torch.where(active, policy * b.w_row.to(dt), 0)
    per_seq, kl_sum = policy, None
    if em1 is not None and kl_rows is not None:
        per_seq = policy + h.beta * kl_rows / nf
        kl_sum = wide_sum(kl_rows.detach())
    if clip is None:  # after the policy term, as compiled code schedules it best
        clip = clip_signs(r, q, cq, mf, seg, dual=dual)
    del r, q, cq  # no longer needed: the gradient's (B, T) temporaries can take their memory
    stats = tally(clip, sign, n_exact, nf, dual=dual)
    rows_b = max(per_seq.shape[0], 1)
    loss = wide_sum(per_seq) / rows_b  # mean over rows; 0 when B = 0 (S4)
    grad = None
    if with_grad:
        grad = passes(mf, clip, dual=dual)
        grad = grad * to_tokens(constant(policy) / (nf * rows_b), seg)  # (B, T)
        if em1 is not None:
            grad = grad - em1.detach() * to_tokens(h.beta / (nf * rows_b), seg)
    return Forward(loss, per_seq, log_coef, stats, kl_sum, grad, totals)
