"""Test configuration: Hypothesis profiles and torch settings shared by the suite.

Profiles: ``dev`` (fast, default), ``ci`` (300 examples a property, derandomized, what .ci/run
uses), ``nightly`` (3000 examples) and ``smoke`` (5, derandomized: scripts/gpu.sh's dry run
proving that the tests run). Select with ``HYPOTHESIS_PROFILE=ci``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo
from hypothesis import HealthCheck, settings

_common = dict(
    deadline=None,  # the first call of the compiled path compiles
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("dev", max_examples=40, **_common)
settings.register_profile("ci", max_examples=300, derandomize=True, **_common)
settings.register_profile("nightly", max_examples=3000, **_common)
settings.register_profile("smoke", max_examples=5, derandomize=True, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The suite exercises many kernel variants (dtypes, optional inputs) in one process: allow them
# all to compile, and fail loudly instead of silently running a variant eagerly.
for _key, _value in (
    ("recompile_limit", 256),
    ("accumulated_recompile_limit", 2048),
    ("fail_on_recompile_limit_hit", True),
):
    if hasattr(torch._dynamo.config, _key):  # names of torch >= 2.6; the GPU machine has 2.11
        setattr(torch._dynamo.config, _key, _value)
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(params=["plain", "compiled"], scope="session")
def impl(request: pytest.FixtureRequest) -> str:
    """Every property runs against both paths: plain (the default) and compiled."""
    return str(request.param)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test (tiny models: a second thread only spin-waits)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
