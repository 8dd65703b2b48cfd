"""The stats reductions both adapters call (``gmpo_core.metrics.sums``, ``minima``, ``metrics``)
on the ``meta`` device, with every optional statistic (KL, dual clip) and the dtypes the adapters
pass: no constant on the CPU, no host read (a meta tensor has no values).
"""

from __future__ import annotations

import pytest
import torch

from gmpo_core import gmpo_loss
from gmpo_core import metrics as gmpo_metrics

B, T = 6, 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stats_reductions_on_meta(dtype: torch.dtype) -> None:
    meta = {"device": "meta", "dtype": dtype}
    out = gmpo_loss(
        torch.empty(B, T, **meta, requires_grad=True), torch.empty(B, T, **meta),
        torch.empty(B, device="meta"), torch.empty(B, T, dtype=torch.bool, device="meta"),
        beta=0.1, ref_logp=torch.empty(B, T, **meta), dual_clip=2.0,
    )  # fmt: skip
    s, m = gmpo_metrics.sums(out.stats, out.kl_sum), gmpo_metrics.minima(out.stats)
    assert s.is_meta and s.shape == (5,) and s.dtype == torch.float64
    assert m.is_meta and m.shape == (4,)
    for minima in (m, m.float()):  # gmpo_verl: as returned; gmpo_trl: float32 after a gather
        values = gmpo_metrics.metrics(s, minima, dual=True, kl=True)
        assert {"clip_ratio/dual_mean", "kl", "log_ratio/max"} <= set(values)
        assert all(v.is_meta and v.shape == () and v.dtype == minima.dtype for v in values.values())
