"""TRL adapter tests: one intra-op thread.

The tiny model's matrices are a few kilobytes: a second thread brings no speed, and on a shared
two-core machine its spin-waits make each step many times slower.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
