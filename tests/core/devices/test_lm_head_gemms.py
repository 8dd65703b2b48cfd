"""Which GEMMs ``token_logprobs`` runs on CUDA, proven without a GPU.

The GEMMs' dtypes are one pure function, ``gemm_plan(device type, dtypes, autocast dtype,
backward_precision)``. Here it is driven for ``"cuda"`` on CPU tensors: the head then issues the
GEMMs it issues on a GPU, ``GemmRecorder`` records each (and runs the CUDA-only float32-output
overloads on the CPU by upcasting), and every GEMM's operand and result dtypes are asserted, in
three setups: bf16 weights, fp16 weights, float32 weights under a bf16 autocast.
``test_cuda_tensors_take_the_plan_of_cuda`` proves that a call on CUDA tensors takes its plan from
that function: ``FakeTensorMode`` CUDA tensors reach it, with the device type "cuda".

Before this test existed the head upcast every operand and ran float32 GEMMs whatever the
dtypes (on the code of that time ``gemm_plan`` does not exist, the patch below does nothing,
and the first assertion on the recorded dtypes fails).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import gmpo_core.lm_head as lm_head
from gmpo_core.lm_head import token_logprobs
from tests.core.devices._gemm_recorder import Gemm, GemmRecorder

N, H, V, CHUNK = 10, 16, 40, 4  # 3 chunks, the last ragged
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
#: setup -> (weight and hidden dtype, autocast dtype, the half dtype the GEMMs take)
SETUPS = {
    "bf16 weights": (BF16, None, BF16),
    "fp16 weights": (F16, None, F16),
    "float32 weights, bf16 autocast": (F32, BF16, BF16),
}


def _as_cuda(monkeypatch: pytest.MonkeyPatch, autocast: torch.dtype | None) -> None:
    """The head plans its GEMMs as on a CUDA device with this autocast state."""
    real = getattr(lm_head, "gemm_plan", None)
    if real is None:  # the code before the plan: nothing to drive
        return

    def cuda_plan(_device: str, hidden: Any, weight: Any, bias: Any, _ac: Any, bwd: str) -> Any:
        return real("cuda", hidden, weight, bias, autocast, bwd)

    monkeypatch.setattr(lm_head, "gemm_plan", cuda_plan)


def _inputs(dtype: torch.dtype, bias: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    out = {
        "hidden": torch.randn(N, H, generator=g).to(dtype).requires_grad_(),
        "weight": (torch.randn(V, H, generator=g) / H**0.5).to(dtype).requires_grad_(),
        "targets": torch.randint(0, V, (N,), generator=g),
        "bias": (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None,
    }
    return out


def _record(setup: str, backward: str, bias: bool = False) -> list[Gemm]:
    dtype = SETUPS[setup][0]
    x = _inputs(dtype, bias)
    kwargs: dict[str, Any] = {"bias": x["bias"], "temperature": 0.7, "chunk_size": CHUNK}
    if backward != "half":
        kwargs["backward_precision"] = backward
    with GemmRecorder() as rec:
        logps, entropies = token_logprobs(x["hidden"], x["weight"], x["targets"], **kwargs)
        assert entropies is not None
        (logps.sum() + 0.1 * entropies.sum()).backward()
    return rec.gemms


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("setup", SETUPS)
def test_default_runs_every_gemm_on_half_operands(
    monkeypatch: pytest.MonkeyPatch, setup: str, bias: bool
) -> None:
    """backward_precision="half" (the default): the forward's 3 GEMMs, and in the backward the
    3 recomputations and the 6 gradient GEMMs, all take the half dtype's operands and write
    float32: none multiplies float32 by float32."""
    _, autocast, half = SETUPS[setup]
    _as_cuda(monkeypatch, autocast)
    gemms = _record(setup, "half", bias)
    assert [(g.operands, g.out) for g in gemms] == [((half, half), F32)] * 12, gemms
    assert all(g.touches(V) for g in gemms)
    mm, addmm = "aten.mm.dtype_out", "aten.addmm.dtype_out"
    # the forward's, then per chunk the recomputation, ∂L/∂h and ∂L/∂W (accumulated)
    assert [g.op for g in gemms] == [mm] * 3 + [mm, mm, addmm] * 3


@pytest.mark.parametrize("setup", SETUPS)
def test_float32_backward_runs_float32_gradient_gemms(
    monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    """backward_precision="float32": the logits' GEMMs (forward and recomputation) still take the
    half operands; the gradient GEMMs multiply float32 by float32, as asked."""
    _, autocast, half = SETUPS[setup]
    _as_cuda(monkeypatch, autocast)
    gemms = _record(setup, "float32")
    logits = [g for g in gemms if g.op == "aten.mm.dtype_out"]
    grads = [g for g in gemms if g.op != "aten.mm.dtype_out"]
    assert [(g.operands, g.out) for g in logits] == [((half, half), F32)] * 6, gemms
    assert grads and all((g.operands, g.out) == ((F32, F32), F32) for g in grads), grads


def test_the_plan_on_other_devices() -> None:
    """The CPU and meta keep float32 GEMMs without a warning; a CUDA without the float32-output
    overload (and any other accelerator) falls back to them with a reason to warn."""
    from gmpo_core import _gemms
    from gmpo_core.lm_head import GemmPlan, gemm_plan

    float32 = GemmPlan(F32, F32, F32, None)
    for device in ("cpu", "meta"):
        assert gemm_plan(device, BF16, BF16) == float32
        assert gemm_plan(device, F32, F32, None, BF16) == float32
    assert gemm_plan("cuda", BF16, BF16) == GemmPlan(F32, BF16, BF16, None)
    assert gemm_plan("cuda", F32, F32) == float32  # float32 outside autocast: float32
    assert gemm_plan("cuda", BF16, BF16, None, None, "float32") == GemmPlan(F32, BF16, F32, None)
    assert gemm_plan("cuda", torch.float64, BF16).forward == torch.float64
    mps = gemm_plan("mps", F16, F16)
    assert mps[:3] == (F32, F32, F32) and mps.fallback is not None and "mps" in mps.fallback
    assert _gemms.float32_output_gemm("cuda") == _gemms._HAS_DTYPE_OVERLOADS
    assert _gemms._HAS_DTYPE_OVERLOADS == (
        tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 8)
    )


def test_no_float32_output_gemm_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA without the overload (torch < 2.8): float32 GEMMs and one warning, never silently."""
    from gmpo_core import _gemms

    monkeypatch.setattr(_gemms, "_HAS_DTYPE_OVERLOADS", False)
    monkeypatch.setattr(lm_head, "_WARNED", set())
    _as_cuda(monkeypatch, None)
    with pytest.warns(UserWarning, match="runs its GEMMs in float32") as seen:
        gemms = _record("bf16 weights", "half")
        _record("bf16 weights", "half")
    assert len(seen) == 1
    assert gemms and all(g.operands == (F32, F32) for g in gemms)


def test_cuda_tensors_take_the_plan_of_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """``token_logprobs`` on (fake) CUDA tensors calls ``gemm_plan`` with the device type
    "cuda" and the inputs' dtypes, and hands its plan to the autograd node unchanged: the plan
    the tests above drive is the one a GPU runs."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from gmpo_core.lm_head import GemmPlan, gemm_plan

    asked: list[tuple[Any, ...]] = []
    handed: list[Any] = []

    def spy(*args: Any) -> GemmPlan:
        asked.append(args)
        return gemm_plan(*args)

    def node(*args: Any) -> tuple[torch.Tensor, None]:
        handed.append(args[-1])
        return torch.empty(args[0].shape[0], device=args[0].device), None

    monkeypatch.setattr(lm_head, "gemm_plan", spy)
    monkeypatch.setattr(lm_head._ChunkedTokenLogProbs, "apply", node)
    with FakeTensorMode():
        hidden = torch.empty(2, 3, H, dtype=BF16, device="cuda")
        weight = torch.empty(V, H, dtype=BF16, device="cuda")
        targets = torch.zeros(2, 3, dtype=torch.long, device="cuda")
        token_logprobs(hidden, weight, targets, compute_entropy=False)
    assert asked == [("cuda", BF16, BF16, None, None, "half")]
    assert handed == [GemmPlan(F32, BF16, BF16, None)]


def test_autocast_state_is_read_for_the_inputs_device() -> None:
    from gmpo_core._gemms import autocast_dtype

    assert autocast_dtype("cpu") is None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert autocast_dtype("cpu") == BF16
        assert autocast_dtype("meta") is None  # no autocast for meta
