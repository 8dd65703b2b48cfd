"""``gmpo_kit``'s metric states: values added by name with their reductions, reduced with a
host's collectives (two, whatever the number of states), read back by name, and turned into
floats with one read to the host."""

from __future__ import annotations

import math

import pytest
import torch

from gmpo_core import gmpo_loss
from gmpo_kit import MetricStates, add_core_stats, core_metrics, read
from tests._host_reads import HostReads


class Collectives:
    """Two processes' states reduced as a host's collectives would: each call sums (or takes
    the min of) this process's vector and the other's, and is counted."""

    def __init__(self, other: MetricStates) -> None:
        self.other = other.reduce(sum=self._keep("sum"), min=self._keep("min"))
        self.calls: list[str] = []

    def _keep(self, kind: str):  # the other process's packed vectors, as they were sent
        def keep(flat: torch.Tensor) -> torch.Tensor:
            setattr(self, f"_{kind}", flat.clone())
            return flat

        return keep

    def sum(self, flat: torch.Tensor) -> torch.Tensor:
        self.calls.append("sum")
        return flat + self._sum

    def min(self, flat: torch.Tensor) -> torch.Tensor:
        self.calls.append("min")
        return torch.minimum(flat, self._min)


def _states(scale: float) -> MetricStates:
    s = MetricStates()
    s.sum("tokens", torch.tensor(3 * scale))
    s.min("low", torch.tensor([1.0, -2.0]) * scale)
    s.max("high", torch.tensor(5.0 * scale))
    s.sum("pair", torch.tensor([[1, 2]]) * int(scale))
    return s


def test_states_reduce_by_name_with_two_collectives() -> None:
    mine, other = _states(1.0), _states(2.0)
    collectives = Collectives(other)
    reduced = mine.reduce(sum=collectives.sum, min=collectives.min)
    assert collectives.calls == ["sum", "min"]  # one each, for four states
    assert reduced["tokens"].item() == 9.0 and reduced["tokens"].dtype == torch.float64
    assert reduced["low"].tolist() == [1.0, -4.0] and reduced["low"].dtype == torch.float32
    assert reduced["high"].item() == 10.0  # the max, though reduced as a min
    assert reduced["pair"].tolist() == [[3.0, 6.0]]  # the shape added
    assert "tokens" in reduced and "missing" not in reduced


def test_without_collectives_the_states_are_this_process_values() -> None:
    reduced = _states(1.0).reduce()
    assert reduced["tokens"].item() == 3.0 and reduced["high"].item() == 5.0
    assert reduced["low"].tolist() == [1.0, -2.0]


def test_a_kind_without_states_calls_no_collective() -> None:
    states = MetricStates()
    states.sum("n", torch.tensor(1.0))
    calls: list[str] = []

    def refuse(flat: torch.Tensor) -> torch.Tensor:
        calls.append("min")
        raise AssertionError("no extremum was added")

    assert states.reduce(sum=lambda t: t * 2, min=refuse)["n"].item() == 2.0
    assert calls == []


def test_a_name_is_added_once() -> None:
    states = MetricStates()
    states.sum("x", torch.tensor(1.0))
    with pytest.raises(ValueError, match="metric state 'x' is added twice"):
        states.max("x", torch.tensor(1.0))


def test_fraction_is_nan_or_the_empty_value_without_a_count() -> None:
    states = MetricStates()
    for name, value in (("a", 3.0), ("n", 4.0), ("b", 0.0), ("none", 0.0)):
        states.sum(name, torch.tensor(value))
    reduced = states.reduce()
    assert reduced.fraction("a", "n").item() == 0.75
    assert math.isnan(reduced.fraction("b", "none").item())
    assert reduced.fraction("b", "none", empty=0.0).item() == 0.0


def test_read_is_one_host_read_of_every_value() -> None:
    """On ``meta`` every read to the host is seen: the values reach the host in one ``tolist``."""
    states = MetricStates()
    states.sum("n", torch.ones((), device="meta"))
    states.max("hi", torch.ones((), device="meta"))
    reduced = states.reduce()
    values = {"mean": reduced.fraction("n", "n"), "hi": reduced["hi"], "x": reduced["n"] * 2}
    with HostReads() as reads:
        host = read(values)
    assert reads.calls == [("tolist", (3,))]
    assert list(host) == ["mean", "hi", "x"] and all(isinstance(v, float) for v in host.values())
    assert read({}) == {}


def test_read_gives_every_value_exactly() -> None:
    """float32 beside float64 and an integer count past float32's 2^24: none is rounded."""
    x = torch.tensor(0.1, dtype=torch.float32)
    n = torch.tensor(2**40 + 1)
    host = read({"x": x, "n": n, "y": torch.tensor([0.1], dtype=torch.float64)})
    assert host["x"] == x.item() != 0.1
    assert host["n"] == 2**40 + 1 and host["y"] == 0.1
    assert read({"x": x, "n": n})["n"] == 2**40 + 1  # no float64 value to widen the stack


def _call(rows: slice, batch: dict[str, torch.Tensor]):
    return gmpo_loss(**{k: v[rows] for k, v in batch.items()}, epsilon=0.2, dual_clip=2.0)


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(6, 5, generator=g)
    return {
        "logp": logp,
        "old_logp": logp + 0.4 * torch.randn(6, 5, generator=g),
        "advantages": torch.randn(6, generator=g),
        "mask": torch.rand(6, 5, generator=g) > 0.3,
    }


def test_core_metrics_by_name_are_the_core_metrics() -> None:
    out = _call(slice(None), _batch())
    states = MetricStates()
    add_core_stats(states, out.stats)
    got = core_metrics(states.reduce(), dual=True)
    assert got.keys() == out.metrics.keys()
    for key, value in out.metrics.items():
        torch.testing.assert_close(got[key], value.float(), rtol=0, atol=0, equal_nan=True)


def test_core_metrics_of_two_processes_are_those_of_the_whole_batch() -> None:
    batch = _batch()
    halves = []
    for rows in (slice(0, 3), slice(3, 6)):
        states = MetricStates()
        add_core_stats(states, _call(rows, batch).stats)
        halves.append(states)
    collectives = Collectives(halves[1])
    got = core_metrics(halves[0].reduce(sum=collectives.sum, min=collectives.min), dual=True)
    whole = _call(slice(None), batch).metrics
    assert whole["clip_ratio/region_mean"] > 0  # the clip acts: the test can fail
    for key, value in whole.items():
        torch.testing.assert_close(got[key], value.float(), rtol=0, atol=0, equal_nan=True)
