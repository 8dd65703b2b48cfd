"""What the property tests share (test_properties.py, test_properties_packed.py): the metric
keys every call returns, the tolerance scale of a per-row result, and the check of the metrics
and stats against the reference's."""

from __future__ import annotations

import numpy as np

from tests.strategies import Batch

METRIC_KEYS = {
    "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "clip_ratio/low_min",
    "clip_ratio/high_max", "log_ratio/min", "log_ratio/max",
}  # fmt: skip


def loss_scale(expected_per_seq: np.ndarray) -> float:
    return float(max(1.0, np.abs(expected_per_seq).max(initial=0.0)))


def assert_metrics_match(out, exp, batch: Batch) -> None:  # type: ignore[no-untyped-def]
    m = {k: v.item() for k, v in out.metrics.items()}
    expected_keys = set(METRIC_KEYS)
    if batch.kwargs.get("beta"):
        expected_keys.add("kl")
    if batch.kwargs.get("dual_clip") is not None:
        expected_keys.add("clip_ratio/dual_mean")
    assert set(m) == expected_keys == set(exp.metrics)
    for key in expected_keys:
        tol = 1e-4 if key == "kl" else 1e-6  # kl sums exp() of up to 2 over the batch
        np.testing.assert_allclose(m[key], exp.metrics[key], rtol=tol, atol=1e-7, err_msg=key)
    s = out.stats
    assert s.num_tokens.item() == exp.stats["num_tokens"]
    assert s.num_clipped_low.item() == exp.stats["num_clipped_low"]
    assert s.num_clipped_high.item() == exp.stats["num_clipped_high"]
    if batch.kwargs.get("dual_clip") is not None:
        assert s.num_clipped_dual is not None
        assert s.num_clipped_dual.item() == exp.stats["num_clipped_dual"]
    else:
        assert s.num_clipped_dual is None
    # the per-row extremes, over the rows that have a valid token (+-inf when none has)
    nonempty = exp.stats["row_clip_low"][valid_rows(batch)]
    low_min = nonempty.min(initial=np.inf)
    high_max = exp.stats["row_clip_high"][valid_rows(batch)].max(initial=-np.inf)
    np.testing.assert_allclose(s.row_clip_low_min.item(), low_min, rtol=1e-6)
    np.testing.assert_allclose(s.row_clip_high_max.item(), high_max, rtol=1e-6)


def valid_rows(batch: Batch) -> np.ndarray:
    """Rows with at least one valid token (zero-weight tokens excluded). Shape: (B,) bool."""
    valid = batch.mask.copy()
    w = batch.kwargs.get("is_weights")
    if w is not None and w.ndim == 2 and w.shape[1] > 1:
        valid &= w != 0
    return valid.any(-1)
