"""The GMPO objective as pure functions of two records: the one math layer of :mod:`gmpo_core`.

Every path runs :func:`forward`: the plain path eagerly inside one ``torch.autograd.Function``
(:mod:`gmpo_core.loss`) whose backward scales the gradient :func:`forward` wrote, the compiled
path the same function under ``torch.compile`` (:mod:`gmpo_core.compiled`), and a user's
``torch.compile`` traces it under autograd. The public building blocks (:mod:`gmpo_core.ops`) call the pieces. docs/semantics.md
states every rule; its section numbers are cited as S1, S2, ...

Inputs travel as a :class:`Batch` (tensors) and a :class:`Hyper` (validated hyper-parameters:
Python floats, or 0-d tensors on the compiled path so that new values never recompile). Nothing
here validates or synchronizes with the device.

A row is either a padded row of a (B, T) batch or a *segment* of packed (N,) tokens, given by
``cu_seqlens`` (flash-attention's convention). Every per-row reduction goes through
:func:`row_sum` and every per-row value reaches the tokens through :func:`to_tokens`, so both
layouts run the same formulas. With an :class:`Across`, a row's tokens are split across the
ranks of a process group: the per-row sums are all-reduced before the exponential.

On CPU, ATen's kernels that read or write ``bool`` tensors are several times slower than float
arithmetic, so masks enter arithmetic as 0/1 floats (:func:`as_float`), and ``torch.where`` with
the mask is used once per input that may hold junk at masked positions (S6).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

from gmpo_core._across import Across, Totals, all_rows
from gmpo_core._counts import Cuts, clip_stats, log_ratio_range
from gmpo_core.metrics import ClipStats

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


class Segments(NamedTuple):
    """Packed rows. Shape: offsets (S + 1,) int64, within [0, N] and non-decreasing; ids (N,)
    int64, the row of each token."""

    offsets: Tensor
    ids: Tensor


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

    def to(self, dtype: torch.dtype) -> RowSums:
        return self.replaced([t.to(dtype) for t in self.present()])


class Forward(NamedTuple):
    """What :func:`forward` returns. ``loss``, ``per_sequence_loss`` and ``log_coef`` are
    differentiable in ``logp`` when run under autograd; the rest is detached.

    Shape:
        loss: (). per_sequence_loss, log_coef: (B,).
    """

    loss: Tensor
    per_sequence_loss: Tensor
    log_coef: Tensor
    stats: ClipStats
    kl_sum: Tensor | None  # sum of the k3 estimator over valid tokens; None without KL
    loss_grad: Tensor | None  # (B, T) or (N,) d loss / d logp, compute dtype, when asked for
    totals: Totals | None = None  # the reduced sums, with an Across


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; float32, bf16 and fp16 are computed in float32 (S8)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


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


def rows(values: Tensor) -> Tensor:
    """Per-row values (B,) as a (B, 1) column that broadcasts against (B, T)."""
    return values.unsqueeze(-1)


def segments(cu_seqlens: Tensor, n_tokens: int) -> Segments:
    """The rows of packed tokens, without a device sync: offsets clamped into [0, N] and made
    non-decreasing (so that no values of ``cu_seqlens`` can make a kernel read out of bounds;
    :func:`gmpo_core._checks.check_cu_seqlens_values` rejects such values on request), and each
    token's row, ``#{i >= 1: offsets[i] <= t}``, as a cumulative count of row starts."""
    offsets = torch.cummax(cu_seqlens.to(torch.int64).clamp(0, n_tokens), 0).values
    # The ends of rows 0..S-1 are the starts of rows 1..S (N for the last and trailing empty
    # rows); row S does not exist, so the count stops at S - 1. Not ``offsets[1:-1]``: compiled
    # code would specialize its size S - 1 at 1 (a recompilation between S = 2 and S = 3).
    ends = offsets[1:]
    starts = offsets.new_zeros(n_tokens + 1).index_add_(0, ends, torch.ones_like(ends))
    return Segments(offsets, starts[:n_tokens].cumsum(0).clamp(max=offsets.shape[0] - 2))


def row_sum(x: Tensor, seg: Segments | None, exact: bool = False) -> Tensor:
    """Per-row sums: over the last axis of padded rows (ATen's pairwise sum), over each segment
    of packed ones accumulated in float64 (a segment's sum is sequential: in float32 it would
    lose digits with the segment's length). In ``x``'s dtype; with ``exact`` (counts: ``x``
    holds integers), float64 wherever ``x``'s dtype could not hold every integer of the sum
    (float32 counts to 2^24). Padded sums in compiled CPU code: see :func:`unguarded`.
    Packed sums of a tensor that may be differentiated (:func:`differentiated`) are an
    ``index_add`` over each token's row, which has a double backward and a forward derivative;
    the others (the forward inside the paths' ``autograd.Function``, counts) a
    ``torch.segment_reduce``, which has neither but is ~3x faster on CPU (0.18 against 0.59 ms
    for 164k tokens, torch 2.13). Both sum each segment in token order on CPU, so they agree to
    the bit there. Shape: (B, T) -> (B,), or (N,) -> (S,)."""
    if seg is None:
        wide = exact and x.dtype != torch.float64 and x.shape[-1] > _EXACT_FLOAT32
        if exact and unguarded(x):  # counts in int32: exact to 2^31, about as fast as float32
            counts = x.to(torch.int32).sum(-1, dtype=torch.int32)
            return counts.to(torch.float64 if wide else x.dtype)
        if wide:
            return x.sum(-1, dtype=torch.float64)
        return wide_sum(x, -1)
    x64 = x.to(torch.float64)
    if differentiated(x):
        sums = x64.new_zeros(seg.offsets.shape[0] - 1).index_add(0, seg.ids, x64)
    else:
        sums = torch.segment_reduce(x64, "sum", offsets=seg.offsets, unsafe=True)
    return sums if exact else sums.to(x.dtype)


def wide_sum(x: Tensor, dim: int | None = None) -> Tensor:
    """``x.sum(dim)`` (all of ``x`` when ``dim`` is None) in ``x``'s dtype; accumulated in
    float64 where :func:`unguarded`. Shape: (..., T) -> (...), or () with ``dim`` None."""
    if unguarded(x):
        wide = x.sum(dtype=torch.float64) if dim is None else x.sum(dim, dtype=torch.float64)
        return wide.to(x.dtype)
    return x.sum() if dim is None else x.sum(dim)


def unguarded(x: Tensor) -> bool:
    """Whether a sum of ``x`` is traced for Inductor's CPU code in float32 (or lower): there it
    is taken in another dtype (float64 values, int32 counts). Inductor's CPU code for a float32
    sum chooses between two loops by whether it runs over more than 4096 elements, and guards
    that choice on the sizes of the first call: a later call on the other side of 4096 (a
    (3, 5) batch, then (3, 4100) or (5000, 3)) would compile again. Other dtypes have one loop.
    Eager code, float64 and other devices sum as ATen does."""
    return (
        torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.is_floating_point()
        and x.dtype != torch.float64
    )


def differentiated(x: Tensor) -> bool:
    """Whether a derivative of ``x`` may be taken: it records autograd history (a
    ``torch.func.grad`` input too), or carries a forward-mode tangent (a dual tensor of
    ``torch.autograd.forward_ad`` or of ``torch.func.jvp``, which ``unpack_dual`` both see).
    Traced code is not run in forward mode: there the history decides."""
    if x.requires_grad:
        return True
    return not torch.compiler.is_compiling() and has_tangent(x)


def constant(x: Tensor) -> Tensor:
    """``x`` detached where it records history (a ``detach`` is a call of its own, which counts on
    small batches: the paths' forward runs without history)."""
    return x.detach() if x.requires_grad else x


def has_tangent(x: Tensor) -> bool:
    """Whether ``x`` carries a forward-mode tangent at the current level (False outside one)."""
    return forward_ad.unpack_dual(x).tangent is not None  # type: ignore[no-untyped-call]


_EXACT_FLOAT32 = 2**24  # float32 holds every integer up to here


def to_tokens(values: Tensor, seg: Segments | None) -> Tensor:
    """Per-row values where they broadcast against the tokens. Shape: (B,) -> (B, 1), or
    (S,) -> (N,)."""
    return rows(values) if seg is None else values.index_select(0, seg.ids)


def sign_space(
    r: Tensor, adv: Tensor, h: Hyper, seg: Segments | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """The trust region (S1) in sign space, ``q = sign(A) r``, where every row's region is the
    upper bound ``q <= eps`` (eps_high where A >= 0, eps_low where A < 0), and under a dual clip
    also ``q >= -log dual_clip`` where A < 0. Where the result may be differentiated
    (:func:`differentiated`), each bound is a ``torch.where`` on a strict comparison, which passes
    the gradient 1 to a value exactly on the bound on every torch (a ``clamp`` passes 1 there on
    torch 2.4 to 2.13; torch 2.14.1 passes 0.5 with a tensor bound, 0 with a number bound).
    Elsewhere (the paths' forward, which writes the gradient itself) it is a ``clamp``, the same
    values in one pass: the comparison and the ``where`` on its bool result took 12 % of a
    plain call at 256 x 4096 on CPU (docs/benchmarks.md). Equal bounds given as numbers (the
    plain path's) stay numbers: no per-row tensor of them is made.

    Returns ``(sign, q, clipped q)``. Shape: r (B, T) or (B,), adv (B,) -> sign (B,), q and
    clipped q of r's shape; or with ``seg``, r (N,) and adv (S,) -> sign (S,), q (N,).
    """
    pos = adv >= 0
    one = torch.ones_like(adv)
    sgn = torch.where(pos, one, -one)  # (B,)
    q = r * along(sgn, r, seg)
    cap: Bound
    if isinstance(h.eps_high, float) and h.eps_high == h.eps_low:
        cap = h.eps_high
    else:
        cap = along(torch.where(pos, one * h.eps_high, one * h.eps_low), r, seg)
    exact = differentiated(q)  # the gradient on a bound is 1 on every torch
    cq = torch.where(q > cap, cap, q) if exact else q.clamp(max=cap)
    if h.log_dual is not None:
        floor = along(torch.where(pos, -math.inf, one * -h.log_dual), r, seg)
        cq = torch.where(cq < floor, floor, cq) if exact else cq.clamp(min=floor)
    return sgn, q, cq


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
    sgn, _, cq = sign_space(r, adv, h, seg)
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
    logp, adv = b.logp.to(dt), b.adv.to(dt)
    valid = valid_tokens(b.mask, b.w_tok)  # (B, T) bool
    mf = as_float(valid, dt)  # (B, T) 0/1
    r = torch.where(valid, logp - b.old_logp.to(dt), 0)  # (B, T), exactly 0 at invalid positions
    sgn, q, cq = sign_space(r, adv, h, seg)  # (B,), (B, T), (B, T): cq is 0 where r is
    cq_rows, n_rows = row_sum(cq, seg), row_sum(mf, seg, exact=True)  # (B,) each
    log_w_rows = kl_rows = em1 = None
    if b.w_tok is not None:  # per-token weights enter as their geometric mean (S7)
        log_w_rows = row_sum(torch.where(valid, torch.log(b.w_tok.to(dt)), 0), seg)
    if b.ref_logp is not None:  # the k3 estimator expm1(d) - d, d = ref - logp (S3)
        k, em1 = k3(logp, b.ref_logp.to(dt), valid)  # (B, T) each
        kl_rows = row_sum(k, seg)
    sums = RowSums(cq_rows, n_rows, log_w_rows, kl_rows)
    totals = clip = None
    if across is not None:  # every sum before the exponential
        clip = clip_signs(r, q, cq, mf, seg, dual=h.log_dual is not None)
        sums = RowSums(sums.cq, sums.n, sums.log_w, sums.kl, clip.cut_rows, clip.signed_rows)
        reduced, lo, hi, totals = all_rows(sums.present(), clip.lo, clip.hi, across)
        sums = sums.replaced(reduced)
        clip = Cuts(clip.cut, reduced[-2], reduced[-1], lo, hi)  # present(): cut, signed last
    n_exact = sums.n  # counts stay exact (float64 where float32 would not be)
    sums = sums.to(dt)
    n = sums.n
    nf = n.clamp(min=1)
    log_coef = sgn * sums.cq / nf  # (B,) the log geometric mean of the clipped ratios (S2)
    active = (adv != 0) & (n > 0)  # (B,) empty and A = 0 rows: policy term exactly 0 (S4, S5)
    log_w = log_coef
    if sums.log_w is not None:
        log_w = log_coef + sums.log_w / nf
    policy = -adv * torch.exp(torch.where(active, log_w, 0))  # (B,)
    if b.w_row is not None:
        policy = policy * b.w_row.to(dt)
    policy = torch.where(active, policy, 0)
    per_seq, kl_sum = policy, None
    if em1 is not None and sums.kl is not None:
        per_seq = policy + h.beta * sums.kl / nf
        kl_sum = wide_sum(sums.kl.detach())
    if clip is None:  # after the policy term, as compiled code schedules it best
        clip = clip_signs(r, q, cq, mf, seg, dual=h.log_dual is not None)
    del r, q, cq  # no longer needed: the gradient's (B, T) temporaries can take their memory
    stats = clip_stats(clip, adv, n_exact, dual=h.log_dual is not None)
    rows_b = max(per_seq.shape[0], 1)
    loss = wide_sum(per_seq) / rows_b  # mean over rows; 0 when B = 0 (S4)
    grad = None
    if with_grad:  # mf - |s| = passes
        grad = (mf - clip.cut) * to_tokens(policy.detach() / (nf * rows_b), seg)  # (B, T)
        if em1 is not None:
            grad = grad - em1.detach() * to_tokens(h.beta / (nf * rows_b), seg)
    return Forward(loss, per_seq, log_coef, stats, kl_sum, grad, totals)


def clip_signs(
    r: Tensor, q: Tensor, cq: Tensor, mf: Tensor, seg: Segments | None, dual: bool = True
) -> Cuts:
    """Where the trust region cut q (:class:`Cuts`). Without ``dual`` (no dual clip) ``s`` is
    never positive: ``|s| = -s``, and the cut rows are the negated signed rows, one row sum fewer.
    Shape: r, q, cq, mf (B, T) or (N,)."""
    lo, hi = log_ratio_range(constant(r), mf)  # first: fewer (B, T) tensors alive at once
    s = torch.sign(constant(cq) - constant(q))  # (B, T)
    signed = row_sum(s, seg, exact=True)
    if not dual:
        return Cuts(-s, -signed, signed, lo, hi)
    a = s.abs()
    return Cuts(a, row_sum(a, seg, exact=True), signed, lo, hi)
