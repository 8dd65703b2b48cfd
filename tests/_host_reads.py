"""Count the reads of ``meta`` tensors to the host, answering them with zeros.

A ``meta`` tensor has no values: ``.tolist()``, ``.item()``, ``bool(t)``, ``float(t)`` and
``.cpu()`` all raise, and so does mixing it with a CPU tensor. An adapter that runs on meta
tensors up to its one read of the metrics therefore makes no other host-device synchronization,
and creates no constant on the CPU. :class:`HostReads` lets that one read through: it intercepts
``Tensor.tolist`` and ``Tensor.item`` on meta tensors (through torch's ``__torch_function__``
mode), records each call, and answers with zeros of the right shape, so the adapter can finish
and the test can assert how many reads it made. Every other host read still raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_READS = {torch.Tensor.tolist: "tolist", torch.Tensor.item: "item"}


class HostReads(TorchFunctionMode):
    """``with HostReads() as reads: ...``; then ``reads.calls`` is ``[(method, shape), ...]``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _READS and args and isinstance(args[0], torch.Tensor) and args[0].is_meta:
            t = args[0]
            self.calls.append((_READS[func], tuple(t.shape)))
            zeros = torch.zeros(t.shape, dtype=t.dtype)  # on the CPU: the answer of the read
            return zeros.tolist() if func is torch.Tensor.tolist else zeros.item()
        return func(*args, **kwargs)
