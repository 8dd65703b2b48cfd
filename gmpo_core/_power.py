"""The power mean of ratios in log space (docs/semantics.md S17), on the rows of
:mod:`gmpo_core._math` (padded (B, T) or packed segments).

For a row's valid log-values x_t (n of them) and an exponent p::

    log M_p = (1/p) log(mean_t exp(p x_t))      p != 0
    log M_0 = mean_t x_t                        (the geometric mean, S2)

Written as it stands, it overflows (exp(p x) for p x past 88 in float32) and, for small |p|,
loses every digit: ``log(mean exp(p x))`` is about ``p mean(x)``, computed with an absolute
error of about eps log n, which the division by p then multiplies by 1/p (0.25 to 0.5 off at
p = 1e-6 in float32). Here, with m the x_t where p x_t is largest (the row's max of x for
p > 0, its min for p < 0) and e_t = x_t - m, so that p e_t <= 0::

    log M_p = m + L / p,   L = log(mean_t exp(p e_t)) in [-log n, 0]

* near 0 (``y = mean_t expm1(p e_t) >= -1/2``): ``L = log1p(y)``. Every term of y has the sign
  of the others and its full relative precision (expm1), and log1p keeps it: L / p is
  ``mean(e) + p var(x) / 2 + ...`` to a few ulps, however small p is, so the result is
  continuous at p = 0;
* far from 0 (y < -1/2, so |L| > log 2 and nothing cancels): ``L = log(sum_t exp(p e_t)) -
  log n``, the logsumexp, whose sum is at least 1 (the term at m is exp(0));
* |p| below :data:`SERIES_BELOW`: ``mean(x) + p var(x) / 2``, the expansion at 0 (its next term,
  p^2 k3 / 6, is below 1e-40 max|x - mean|^3), so that p e and 1 / p never underflow or
  overflow.

m is a constant (detached): the value does not depend on it, so neither does its gradient,
``exp(p x_t) / sum_s exp(p x_s)`` at valid tokens, 0 elsewhere.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gmpo_core._rows import Segments, row_sum, to_tokens

#: Below this |p|, the expansion ``mean + p var / 2`` (it then equals the power mean to within
#: 1e-40 max|x - mean|^3); at and above, the power mean itself.
SERIES_BELOW = 1e-20


def log_power_mean(x: Tensor, valid: Tensor, n: Tensor, p: float, seg: Segments | None) -> Tensor:
    """The log of the power mean of ``exp(x)`` over each row's valid positions (S17); 0 for an
    empty row. ``x`` is in the compute dtype, ``n`` the valid counts in it; values at invalid
    positions never matter. Shape: (B, T), (B, T) bool, (B,) -> (B,); or (N,), (N,), (S,) ->
    (S,)."""
    nf = n.clamp(min=1)
    mean = row_sum(torch.where(valid, x, 0), seg) / nf
    if p == 0:
        return mean
    if abs(p) < SERIES_BELOW:
        d = torch.where(valid, x - to_tokens(mean, seg), 0)
        return mean + (p / 2) * (row_sum(d * d, seg) / nf)
    top = row_extreme(x.detach(), valid, n, seg, largest=p > 0)  # (B,)
    z = p * torch.where(valid, x - to_tokens(top, seg), 0)  # <= 0; exactly 0 at invalid tokens
    y = row_sum(torch.expm1(z), seg) / nf  # (B,) in [-1, 0]
    near = y >= -0.5
    total = row_sum(torch.where(valid, torch.exp(z), 0), seg)  # (B,) >= 1 in a non-empty row
    # each branch's input is made harmless where it is not taken (no inf * 0 in the backward)
    log_mean = torch.where(
        near,
        torch.log1p(torch.where(near, y, 0)),
        torch.log(torch.where(near, 1, total)) - torch.log(nf),
    )
    return top + log_mean / p


def row_extreme(x: Tensor, valid: Tensor, n: Tensor, seg: Segments | None, largest: bool) -> Tensor:
    """Each row's max (``largest``) or min of ``x`` over valid positions; 0 for an empty row.
    Shape: (B, T) -> (B,); or (N,) -> (S,)."""
    far = -math.inf if largest else math.inf
    kept = torch.where(valid, x, far)
    if seg is not None:
        rows = kept.new_full((seg.offsets.shape[0] - 1,), far)
        found = rows.scatter_reduce(0, seg.ids, kept, "amax" if largest else "amin")
    elif x.shape[-1] == 0:  # no column: amax/amin refuse an empty reduction
        found = kept.new_full(x.shape[:-1], far)
    else:
        found = kept.amax(-1) if largest else kept.amin(-1)
    return torch.where(n > 0, found, 0)
