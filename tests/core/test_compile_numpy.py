"""A NumPy scalar in a user's ``torch.compile``: Dynamo traces it as a 0-d array, whose value is
unknown while tracing (docs/semantics.md S17), so ``float()`` of it is what traces; passed as it
is, gmpo reads it outside the graph, and under ``fullgraph=True`` it is refused by name."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

from gmpo_core import gmpo_loss, masked_power_mean
from tests._helpers import loss_inputs


def _numpy_cases() -> dict[str, tuple[Any, np.floating[Any]]]:
    """``name -> (step(x, mask, value), a NumPy scalar)``: ``p`` of the power mean and
    ``epsilon`` of the loss, each an argument of the user's compiled function."""
    x = loss_inputs(3, 8, seed=9)

    def power(logp: torch.Tensor, mask: torch.Tensor, p: Any) -> torch.Tensor:
        return masked_power_mean(logp, mask, p)

    def loss(logp: torch.Tensor, mask: torch.Tensor, epsilon: Any) -> torch.Tensor:
        return gmpo_loss(logp, x["old_logp"], x["advantages"], mask, epsilon=epsilon).loss

    return {"p": (power, np.float64(0.5)), "epsilon": (loss, np.float32(0.3))}


@pytest.mark.parametrize("name", ["p", "epsilon"])
def test_a_numpy_scalar_in_a_users_compiled_function(name: str) -> None:
    """Dynamo traces every NumPy scalar as a 0-d array, whose value is unknown while tracing
    (docs/semantics.md S17): ``float()`` of it before the compiled call traces as a Python
    number does, in one graph; passed as it is, the result is the eager one (gmpo reads the
    value outside the graph), and under ``fullgraph=True`` the refusal names ``float(...)``.
    Regression: ``fullgraph=True`` failed inside gmpo's error message (``repr() on tensor``)."""
    step, value = _numpy_cases()[name]
    x = loss_inputs(3, 8, seed=9)
    expected = step(x["logp"], x["mask"], value)
    counter = CompileCounter()
    got = torch.compile(step, backend=counter, fullgraph=True)(x["logp"], x["mask"], float(value))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert counter.frame_count == 1
    torch._dynamo.reset()  # a new compilation of the same function, which then breaks
    with warnings.catch_warnings():  # Dynamo on the eager fallback's functorch check
        warnings.filterwarnings("ignore", "Dynamo does not know how to trace", UserWarning)
        got = torch.compile(step, backend=CompileCounter())(x["logp"], x["mask"], value)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch._dynamo.reset()
    with pytest.raises(Exception) as err:
        torch.compile(step, backend=CompileCounter(), fullgraph=True)(x["logp"], x["mask"], value)
    assert "repr() on tensor" not in str(err.value)


@pytest.mark.parametrize("name", ["p", "epsilon"])
def test_a_numpy_array_is_refused_by_its_dimensions(name: str) -> None:
    """A 0-d array (what a NumPy scalar is inside torch.compile) is refused in one line that
    names ``float(...)`` rather than showing the array (whose repr Dynamo cannot build)."""
    step, value = _numpy_cases()[name]
    x = loss_inputs(3, 8, seed=9)
    with pytest.raises(ValueError) as err:
        step(x["logp"], x["mask"], np.asarray(value))
    message = str(err.value)
    assert message.startswith(f"{name} must be a finite number") and "\n" not in message
    assert message.endswith(
        "got a 0-d NumPy array (inside torch.compile a NumPy scalar is one, whose value is "
        f"unknown while tracing: pass float({name}))"
    )
