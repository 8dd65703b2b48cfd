"""TRL adapter tests: one intra-op thread.

The tiny model's matrices are a few kilobytes: a second thread brings no speed, and on a shared
two-core machine its spin-waits make each step many times slower.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread: None) -> None:
    """tests/conftest.py's ``one_thread`` for every test here."""
