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
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd import forward_ad

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


class Totals(NamedTuple):
    """Per-row sums and token extrema over every rank of a process group.

    Shape:
        sums: (k, B) float, the rows of :func:`forward`'s partial sums. minima: (2,) float,
        ``[min r, -max r]`` (with ±the dtype's largest float where a rank had no valid token).
    """

    sums: Tensor
    minima: Tensor


class Across(NamedTuple):
    """Rows split along the token axis across the ranks of ``group``: every rank holds its own
    tokens of the same rows. ``totals``: the reduced sums of an earlier forward on the same
    inputs (then no collective runs); None: all-reduce them over ``group``."""

    group: Any  # a torch.distributed ProcessGroup (None: the default group)
    totals: Totals | None = None


class Segments(NamedTuple):
    """Packed rows. Shape: offsets (S + 1,) int64, within [0, N] and non-decreasing; ids (N,)
    int64, the row of each token."""

    offsets: Tensor
    ids: Tensor


class Cuts(NamedTuple):
    """Where the trust region cut, with s = -1 where the clamp cut q at eps, +1 at the dual cap,
    0 elsewhere (invalid tokens too): ``|s|`` per token, per row ``sum |s|`` and ``sum s``, and
    the range of the log-ratio over valid tokens (:func:`log_ratio_range`).

    Shape: cut (B, T) or (N,); cut_rows, signed_rows (B,); lo, hi ().
    """

    cut: Tensor
    cut_rows: Tensor
    signed_rows: Tensor
    lo: Tensor
    hi: Tensor


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
    inner = offsets[1:-1]  # the starts of rows 1..S-1 (N for trailing empty rows)
    starts = offsets.new_zeros(n_tokens + 1).index_add_(0, inner, torch.ones_like(inner))
    return Segments(offsets, starts[:n_tokens].cumsum(0))


def row_sum(x: Tensor, seg: Segments | None, exact: bool = False) -> Tensor:
    """Per-row sums: over the last axis of padded rows (ATen's pairwise sum), over each segment
    of packed ones accumulated in float64 (a segment's sum is sequential: in float32 it would
    lose digits with the segment's length). In ``x``'s dtype; with ``exact`` (counts), float64
    wherever ``x``'s dtype could not hold every integer of the sum (float32 counts to 2^24).
    Packed sums of a tensor that may be differentiated (:func:`differentiated`) are an
    ``index_add`` over each token's row, which has a double backward and a forward derivative;
    the others (the forward inside the paths' ``autograd.Function``, counts) a
    ``torch.segment_reduce``, which has neither but is ~3x faster on CPU (0.18 against 0.59 ms
    for 164k tokens, torch 2.13). Both sum each segment in token order on CPU, so they agree to
    the bit there. Shape: (B, T) -> (B,), or (N,) -> (S,)."""
    if seg is None:
        if exact and x.dtype != torch.float64 and x.shape[-1] > _EXACT_FLOAT32:
            return x.sum(-1, dtype=torch.float64)
        return x.sum(-1)
    x64 = x.to(torch.float64)
    if differentiated(x):
        sums = x64.new_zeros(seg.offsets.shape[0] - 1).index_add(0, seg.ids, x64)
    else:
        sums = torch.segment_reduce(x64, "sum", offsets=seg.offsets, unsafe=True)
    return sums if exact else sums.to(x.dtype)


def differentiated(x: Tensor) -> bool:
    """Whether a derivative of ``x`` may be taken: it records autograd history (a
    ``torch.func.grad`` input too), or carries a forward-mode tangent (a dual tensor of
    ``torch.autograd.forward_ad`` or of ``torch.func.jvp``, which ``unpack_dual`` both see).
    Traced code is not run in forward mode: there the history decides."""
    if x.requires_grad:
        return True
    return not torch.compiler.is_compiling() and has_tangent(x)


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
    also ``q >= -log dual_clip`` where A < 0. Each bound is a ``torch.where`` on a strict
    comparison, which runs at the speed of a copy in ATen and passes the gradient 1 to a value
    exactly on the bound on every torch (a ``clamp`` passes 1 there on torch 2.4 to 2.13;
    torch 2.14.1 passes 0.5 with a tensor bound, 0 with a number bound).

    Returns ``(sign, q, clipped q)``. Shape: r (B, T) or (B,), adv (B,) -> sign (B,), q and
    clipped q of r's shape; or with ``seg``, r (N,) and adv (S,) -> sign (S,), q (N,).
    """
    pos = adv >= 0
    one = torch.ones_like(adv)
    sgn = torch.where(pos, one, -one)  # (B,)
    eps = torch.where(pos, one * h.eps_high, one * h.eps_low)  # (B,)
    q = r * along(sgn, r, seg)
    cap = along(eps, r, seg)
    cq = torch.where(q > cap, cap, q)
    if h.log_dual is not None:
        floor = along(torch.where(pos, -math.inf, one * -h.log_dual), r, seg)
        cq = torch.where(cq < floor, floor, cq)
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
    sums = {"cq": row_sum(cq, seg), "n": row_sum(mf, seg, exact=True)}  # (B,) each
    if b.w_tok is not None:  # per-token weights enter as their geometric mean (S7)
        sums["log_w"] = row_sum(torch.where(valid, torch.log(b.w_tok.to(dt)), 0), seg)
    em1 = None
    if b.ref_logp is not None:  # the k3 estimator expm1(d) - d, d = ref - logp (S3)
        k, em1 = k3(logp, b.ref_logp.to(dt), valid)  # (B, T) each
        sums["kl"] = row_sum(k, seg)
    totals = clip = None
    if across is not None:  # every sum before the exponential
        clip = clip_signs(r, q, cq, mf, seg)
        sums["cut"], sums["signed"] = clip.cut_rows, clip.signed_rows
        reduced, lo, hi, totals = all_rows(list(sums.values()), clip.lo, clip.hi, across)
        sums = dict(zip(sums, reduced, strict=True))
        clip = Cuts(clip.cut, sums["cut"], sums["signed"], lo, hi)
    n_exact = sums["n"]  # counts stay exact (float64 where float32 would not be)
    sums = {k: v.to(dt) for k, v in sums.items()}
    n = sums["n"]
    nf = n.clamp(min=1)
    log_coef = sgn * sums["cq"] / nf  # (B,) the log geometric mean of the clipped ratios (S2)
    active = (adv != 0) & (n > 0)  # (B,) empty and A = 0 rows: policy term exactly 0 (S4, S5)
    log_w = log_coef
    if b.w_tok is not None:
        log_w = log_coef + sums["log_w"] / nf
    policy = -adv * torch.exp(torch.where(active, log_w, 0))  # (B,)
    if b.w_row is not None:
        policy = policy * b.w_row.to(dt)
    policy = torch.where(active, policy, 0)
    per_seq, kl_sum = policy, None
    if em1 is not None:
        kl_rows = sums["kl"]  # (B,)
        per_seq = policy + h.beta * kl_rows / nf
        kl_sum = kl_rows.detach().sum()
    if clip is None:  # after the policy term, as compiled code schedules it best
        clip = clip_signs(r, q, cq, mf, seg)
    del r, q, cq  # no longer needed: the gradient's (B, T) temporaries can take their memory
    stats = clip_stats(clip, adv, n_exact, dual=h.log_dual is not None)
    rows_b = max(per_seq.shape[0], 1)
    loss = per_seq.sum() / rows_b  # mean over rows; 0 when B = 0 (S4)
    grad = None
    if with_grad:  # mf - |s| = passes
        grad = (mf - clip.cut) * to_tokens(policy.detach() / (nf * rows_b), seg)  # (B, T)
        if em1 is not None:
            grad = grad - em1.detach() * to_tokens(h.beta / (nf * rows_b), seg)
    return Forward(loss, per_seq, log_coef, stats, kl_sum, grad, totals)


def clip_signs(r: Tensor, q: Tensor, cq: Tensor, mf: Tensor, seg: Segments | None) -> Cuts:
    """Where the trust region cut q (:class:`Cuts`). Shape: r, q, cq, mf (B, T) or (N,)."""
    lo, hi = log_ratio_range(r.detach(), mf)  # first: fewer (B, T) tensors alive at once
    s = torch.sign(cq.detach() - q.detach())  # (B, T)
    a = s.abs()
    return Cuts(a, row_sum(a, seg, exact=True), row_sum(s, seg, exact=True), lo, hi)


def all_rows(
    parts: list[Tensor], lo: Tensor, hi: Tensor, across: Across
) -> tuple[list[Tensor], Tensor, Tensor, Totals]:
    """The per-row sums ``parts`` and the token range ``lo``, ``hi`` over every rank of
    ``across.group`` (or ``across.totals``): first the range with MIN (:func:`first_collective`),
    then the sums with SUM. Each reduced sum keeps the local sum's gradient (the other ranks'
    tokens are constants here), so a rank's gradient is the whole rows' gradient at its own
    tokens. Shape: parts (B,) each."""
    totals = across.totals
    if totals is None:
        sums = torch.stack([p.detach() for p in parts])  # (k, B)
        first = first_collective(lo, hi, sums)
        dist.all_reduce(first, op=dist.ReduceOp.MIN, group=across.group)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=across.group)
        totals = Totals(sums, first[:2].to(lo.dtype))
    reduced = [through(p, t) for p, t in zip(parts, totals.sums.unbind(), strict=True)]
    return reduced, totals.minima[0], -totals.minima[1], totals


#: The dtypes the sums of :func:`all_rows` can have, by their code in :func:`first_collective`.
SUMS_DTYPES = (torch.float32, torch.float64)


def first_collective(lo: Tensor, hi: Tensor, sums: Tensor) -> Tensor:
    """The payload of a split forward's first collective, an all-reduce with MIN: the same
    size and dtype whatever the call, so that a rank in the agreement step (``check_values``,
    :mod:`gmpo_core._agree`), whose first collective has this form too, meets it instead of
    hanging: ``[min r, -max r, 0, -sums.numel(), -(code of sums.dtype)]``, float64 (exact for
    ``lo``, ``hi`` and the counts). A 0 in slot 2 tells an agreeing rank that a rank is in its
    forward, and slots 3 and 4 the all-reduce with SUM it runs next. Shape: (5,)."""
    lo64 = lo.to(torch.float64)
    numel = torch.ones_like(sums, dtype=torch.float64).sum()  # no host value: dynamic sizes
    code = lo64.new_full((), -float(SUMS_DTYPES.index(sums.dtype)))
    return torch.stack([lo64, -hi.to(torch.float64), torch.zeros_like(lo64), -numel, code])


def through(local: Tensor, total: Tensor) -> Tensor:
    """``total``'s value with ``local``'s gradient (an identity: d total / d local = 1)."""
    if not local.requires_grad:
        return total
    return torch.where(local.isfinite(), total + (local - local.detach()), total)


def log_ratio_range(r: Tensor, mf: Tensor) -> tuple[Tensor, Tensor]:
    """Min and max of ``r`` over valid tokens (``mf``: 0/1), ``+big`` and ``-big`` (the dtype's
    largest float) where there is none (:func:`unreached` turns them into ±inf).
    Shape: (B, T) or (N,) -> (), ()."""
    # invalid tokens are pushed out of reach by the largest float
    big = torch.finfo(r.dtype).max
    far = torch.addcmul(r.new_full((), big), mf, r.new_full((), -big))  # 0 at valid tokens
    return extreme(r + far, "min"), extreme(r - far, "max")


def clip_stats(c: Cuts, adv: Tensor, n: Tensor, dual: bool = True) -> ClipStats:
    """Counts and extrema over valid tokens (S10), from where the trust region cut (``c``: the
    range of the log-ratio over valid tokens, and per row the number of tokens cut, ``sum |s|``,
    and ``sum s``) and the row's valid tokens ``n``. Without ``dual`` (no dual clip),
    ``num_clipped_dual`` is None: built so, not replaced afterwards (torch 2.4's ``torch.compile``
    cannot trace ``NamedTuple._replace``).

    Shape: c.lo, c.hi (); c.cut_rows, c.signed_rows, adv, n (B,).
    """
    lo, hi = c.lo, c.hi
    at_eps = (c.cut_rows - c.signed_rows) / 2  # (B,)
    at_cap = (c.cut_rows + c.signed_rows) / 2  # (B,) A < 0 rows only
    low = torch.where(adv < 0, at_eps, 0)
    high = torch.where(adv > 0, at_eps, 0)
    nonempty = n > 0
    nf = n.clamp(min=1)
    big = torch.finfo(lo.dtype).max
    return ClipStats(
        num_tokens=total(n),
        num_clipped_low=total(low),
        num_clipped_high=total(high),
        num_clipped_dual=total(at_cap) if dual else None,
        log_ratio_min=unreached(lo, big),
        log_ratio_max=unreached(hi, big),
        row_clip_low_min=extreme(torch.where(nonempty, low / nf, math.inf), "min").to(lo.dtype),
        row_clip_high_max=extreme(torch.where(nonempty, high / nf, -math.inf), "max").to(lo.dtype),
    )


def total(per_row: Tensor) -> Tensor:
    """The exact int64 total of per-row float counts. Shape: (B,) -> ()."""
    return per_row.to(torch.int64).sum()


def extreme(x: Tensor, kind: str) -> Tensor:
    """Min or max over all of ``x``: +inf or -inf when it is empty. Shape: (B, T), (B,) or
    (N,) -> ().
    Rows first, so that compiled code takes them in the pass that makes the row sums."""
    if x.numel() == 0:
        return x.new_full((), math.inf if kind == "min" else -math.inf)
    if x.dim() == 2:
        x = x.amin(-1) if kind == "min" else x.amax(-1)
    return x.amin() if kind == "min" else x.amax()


def unreached(x: Tensor, big: float) -> Tensor:
    """±inf where an extremum over valid tokens found none (it reads ±``big`` then)."""
    return torch.where(x.abs() >= big, x.sign() * math.inf, x)
