"""Metrics by name: per-process states with their reductions, and one read to the host.

A loss step adds each value it logs from by name, with how it reduces across processes: a sum
(counts, sums of values; kept in float64, exact far beyond float32's 2^24) or an extremum (min or
max; float32, as the hosts log them). :meth:`MetricStates.reduce` packs the sums into one vector
and the extrema into another (maxima negated, so both reduce with one min), so that a host's
reduction is two collectives whatever the number of states; TRL's are ``accelerator.reduce`` and
``gather`` + ``amin``, verl has none (it averages the values of every call itself). The metrics
are then made from the :class:`Reduced` states by name, and :func:`read` turns them into floats
in one device synchronization.

The core's own statistics enter as two states (:func:`add_core_stats`), laid out as
:func:`gmpo_core.metrics.sums` and :func:`~gmpo_core.metrics.minima` lay them out, and leave as
:func:`gmpo_core.metrics.metrics` makes them (:func:`core_metrics`): their rules stay the core's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from gmpo_core import ClipStats
from gmpo_core import metrics as gmpo_metrics

#: a host's reduction across processes of a flat vector, element by element
Collective = Callable[[Tensor], Tensor]
#: the names of the core's statistics among the states (:func:`add_core_stats`)
CORE_SUMS, CORE_MINIMA = "gmpo/sums", "gmpo/minima"
_SUM, _MIN = "sum", "min"
_DTYPES = {_SUM: torch.float64, _MIN: torch.float32}


class MetricStates:
    """Per-process values by name, each with its reduction; then :meth:`reduce`.

    Every process of a host must add the same names in the same order (the reduction packs them
    by position), as a loss step whose code runs alike on every process does.
    """

    def __init__(self) -> None:
        self._parts: dict[str, dict[str, Tensor]] = {_SUM: {}, _MIN: {}}
        self._negated: set[str] = set()

    def sum(self, name: str, value: Tensor) -> None:
        """``value`` (any shape) summed across processes."""
        self._add(_SUM, name, value)

    def min(self, name: str, value: Tensor) -> None:
        """``value`` (any shape) min-reduced across processes."""
        self._add(_MIN, name, value)

    def max(self, name: str, value: Tensor) -> None:
        """``value`` (any shape) max-reduced across processes (negated around a min)."""
        self._add(_MIN, name, value)
        self._negated.add(name)

    def _add(self, kind: str, name: str, value: Tensor) -> None:
        if any(name in part for part in self._parts.values()):
            raise ValueError(f"metric state {name!r} is added twice")
        self._parts[kind][name] = _as(
            value.detach() if value.requires_grad else value, _DTYPES[kind]
        )

    def reduce(self, sum: Collective | None = None, min: Collective | None = None) -> Reduced:
        """The states reduced across processes: the sums with ``sum``, the extrema with
        ``min`` (None: this process's values as they were added, for a host that reduces
        nothing)."""
        reduced: dict[str, Tensor] = {}
        for kind, collective in ((_SUM, sum), (_MIN, min)):
            part = self._parts[kind]
            if collective is None or not part:
                reduced.update(part)
                continue
            sign = {name: name in self._negated for name in part}
            flat = collective(
                torch.cat([(-v if sign[k] else v).reshape(-1) for k, v in part.items()])
            )
            start = 0
            for name, v in part.items():
                piece = flat.narrow(0, start, v.numel()).reshape(v.shape)
                reduced[name] = -piece if sign[name] else piece
                start += v.numel()
        return Reduced(reduced)


class Reduced:
    """The states after :meth:`MetricStates.reduce`, read by name (0-d or the shape added)."""

    def __init__(self, values: dict[str, Tensor]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> Tensor:
        return self._values[name]

    def __contains__(self, name: str) -> bool:
        return name in self._values

    def fraction(self, num: str, den: str, empty: float = float("nan")) -> Tensor:
        """``num / den`` of two sums, ``empty`` where ``den`` is 0 (NaN: no value; 0 where the
        host logs a mean over no token as 0)."""
        n, d = self._values[num], self._values[den]
        return torch.where(d > 0, n / d.clamp(min=1), empty)


def add_core_stats(states: MetricStates, stats: ClipStats) -> None:
    """The core's statistics of one call as the states :data:`CORE_SUMS` and
    :data:`CORE_MINIMA` (its maxima are stored negated there)."""
    states.sum(CORE_SUMS, gmpo_metrics.sums(stats))
    states.min(CORE_MINIMA, gmpo_metrics.minima(stats))


def core_metrics(reduced: Reduced, dual: bool) -> dict[str, Tensor]:
    """The core's metrics (docs/semantics.md, "Metrics") from its reduced statistics, by
    :func:`gmpo_core.metrics.metrics`: ``clip_ratio/*`` and ``log_ratio/*``."""
    return gmpo_metrics.metrics(reduced[CORE_SUMS], reduced[CORE_MINIMA], dual)


def read(values: Mapping[str, Tensor]) -> dict[str, float]:
    """0-d tensors as floats, read to the host in one device synchronization (one ``tolist``
    of their stack, in the widest of their float dtypes: every value reads exactly; integer
    values are made float64 first).

    Shape:
        values: each 0-d (or one element).
    """
    if not values:
        return {}
    parts = [v if v.is_floating_point() else v.to(torch.float64) for v in values.values()]
    stacked = torch.stack([v if v.dim() == 0 else v.reshape(()) for v in parts])
    return dict(zip(values, stacked.tolist(), strict=True))


def _as(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` in ``dtype`` (the call skipped where it already is: a loss step adds many)."""
    return x if x.dtype == dtype else x.to(dtype)
