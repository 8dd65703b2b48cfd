"""gmpo_kit: the parts every host adapter shares, so that an adapter only unpacks its host's
inputs, calls :func:`gmpo_core.gmpo_loss` and hands back what its host expects.

- :class:`HostOptions`: one record per host, its names for gmpo_core's options (errors of the
  core's rules name the host's fields) and how it gives its advantages (reduced to one per
  sequence, (B,)).
- :func:`gmpo_loss_with_kl`: the loss with the KL over the host's mask, where the host's KL reads
  more tokens than its policy term; the row mean gives 0 at B = 0, as the core's.
- :class:`MetricStates`: per-process values by name, each with its reduction (sum, min, max),
  reduced with the host's collectives; :func:`read` turns the metrics into floats in one device
  synchronization.

No loss math lives here (gmpo_core's public functions compute it), and nothing imports a host:
torch and gmpo_core only. docs/contributing.md says what a new adapter writes.
"""

from __future__ import annotations

from gmpo_kit.host import SCALE, SPREAD, HostOptions, spread_values, varies_within_rows
from gmpo_kit.kl import HostLoss, gmpo_loss_with_kl, row_mean
from gmpo_kit.states import MetricStates, Reduced, add_core_stats, core_metrics, read

__all__ = [
    "SCALE",
    "SPREAD",
    "HostLoss",
    "HostOptions",
    "MetricStates",
    "Reduced",
    "add_core_stats",
    "core_metrics",
    "gmpo_loss_with_kl",
    "read",
    "row_mean",
    "spread_values",
    "varies_within_rows",
]
