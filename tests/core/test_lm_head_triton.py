"""``token_logprobs(..., backend="triton")``: the fused kernels against float64 and the torch
backend, in float32, bf16 and fp16, forward and backward.

Without a GPU the kernels run in Triton's interpreter on CPU tensors: ``TRITON_INTERPRET=1`` must
be set before Triton is first imported, so this module sets it (when no CUDA device is present)
before importing anything that imports Triton. In a test process that imported Triton earlier
(``torch.compile`` and TRL do), the interpreter cannot be switched on any more:
``test_interpreter_in_a_fresh_process`` then runs this module in a fresh process, where it can.
On a CUDA machine the same checks run natively (the ``gpu`` variants).

The reference is the materialized head in float64 on the same (already rounded) inputs. Done
means: log-probs and entropies within 1e-5 relative of it in every dtype (the float32
accumulators' error; bf16 logits would be 2e-3 off), and gradients within the torch backend's
tolerances (``tests/core/test_lm_head.py``'s table, which docs/lm_head.md states).
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's first import

pytest.importorskip("triton")

from gmpo_core import _triton_head
from gmpo_core.lm_head import token_logprobs
from tests.core.devices._gemm_recorder import GemmRecorder
from tests.core.devices.test_lm_head_gemms import _as_cuda
from tests.core.test_lm_head import TOL, grads_of, leaves, make, reference

ROOT = Path(__file__).resolve().parents[2]
INTERPRETED = _triton_head.interpreted()
#: gradients: tests/core/test_lm_head.py's tolerances for the torch backend; fp16 (absent there)
#: one fp16 rounding (2^-11 relative) with the same margin as bf16's
GRAD_TOL = {**{dt: TOL[dt]["grad"] for dt in TOL}, torch.float16: (1e-3, 5e-6)}
#: log-probs and entropies, every dtype: the float32 accumulators' error (bf16 logits: 2e-3)
VALUE_RTOL = 1e-5
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
_FRESH = "test_interpreter_in_a_fresh_process"
DEVICES = [
    pytest.param(
        "cpu",
        marks=pytest.mark.skipif(
            not INTERPRETED,
            reason=f"Triton was imported before the interpreter could be set: {_FRESH} runs "
            "these in a fresh process (or, with CUDA, the cuda variants run them natively)",
        ),
    ),
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


def on(inp: dict[str, Any], device: str) -> dict[str, Any]:
    """``make``'s inputs on ``device`` (leaves again)."""
    out: dict[str, Any] = {}
    for k, v in inp.items():
        if v is None:
            out[k] = None
        else:
            t = v.detach().to(device)
            out[k] = t.requires_grad_() if v.requires_grad else t
    return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest |got − ref| over the largest |ref|."""
    return float((got.double().cpu() - ref.double().cpu()).abs().max() / ref.abs().max())


def value_close(got: torch.Tensor, ref: torch.Tensor) -> None:
    scale = float(ref.detach().abs().max())
    torch.testing.assert_close(
        got.double().cpu(), ref.double().cpu(), rtol=VALUE_RTOL, atol=VALUE_RTOL * scale,
        check_dtype=False,
    )  # fmt: skip


def grad_close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = GRAD_TOL[dtype]
    scale = max(float(ref.detach().abs().max()), 1.0)
    torch.testing.assert_close(
        got.double().cpu(), ref.double().cpu(), rtol=rtol, atol=atol * scale, check_dtype=False
    )


def ref_of(inp: dict[str, Any], temperature: float) -> tuple[list[torch.Tensor], torch.Tensor,
                                                            torch.Tensor]:  # fmt: skip
    """float64 log-probs, entropies and their gradients on the leaves, from the rounded inputs."""
    cpu = {k: None if v is None else v.detach().cpu().double() for k, v in inp.items()}
    for k in ("hidden", "weight", "bias"):
        if cpu[k] is not None:
            cpu[k].requires_grad_()
    t = cpu["targets"].long()
    ignored = t < 0
    lp, ent = reference(cpu["hidden"], cpu["weight"], t.clamp(min=0), cpu["bias"], temperature)
    lp = lp.masked_fill(ignored, 0.0)
    _, grads = grads_of(cpu, lp, ent)
    return [g for g in grads if g is not None], lp.detach(), ent.detach()


CASES = [  # (n, V, H, temperature, logit_scale, sliced): none a multiple of a block
    (37, 203, 48, 1.0, 1.0, False),
    (70, 150, 40, 0.7, 1.0, True),  # two vocabulary slices (splits), the last ragged
    (21, 131, 72, 1.3, 2.0, True),  # a logit scale, two H blocks, a slice of 3 entries
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=["t1", "t0.7-sliced", "t1.3-scale2-sliced"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
def test_matches_float64_and_the_torch_backend(
    device: str, case: tuple[int, int, int, float, float, bool], bias: bool, dtype: torch.dtype,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    n, vocab, hid, temperature, logit_scale, sliced = case
    if sliced:  # ∂L/∂z one vocabulary block at a time; the forward in vocabulary splits
        monkeypatch.setattr(_triton_head, "_DZ_BYTES", 1)
    else:  # the forward in one program per token block, over the whole vocabulary
        monkeypatch.setattr(_triton_head, "_PROGRAMS", 1)
    inp = on(make(n, hid, vocab, dtype, bias=bias, seed=n + vocab), device)
    inp["targets"][[1, n // 2]] = -100  # ignored positions: log-prob 0, no gradient
    kw = {"bias": inp["bias"], "temperature": temperature, "logit_scale": logit_scale}
    out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], backend="triton", **kw)
    assert out.entropies is not None
    assert out.logps.dtype == out.entropies.dtype == torch.float32
    assert out.logps.device.type == device
    _, got = grads_of(inp, out.logps, out.entropies)
    want, ref_lp, ref_ent = ref_of(inp, temperature / logit_scale)
    assert float(out.logps[1].detach()) == 0.0 and float(ref_lp[1]) == 0.0
    value_close(out.logps, ref_lp)
    value_close(out.entropies, ref_ent)
    for g, w, leaf in zip(got, want, leaves(inp), strict=True):
        assert g is not None and g.dtype == leaf.dtype
        grad_close(g, w, dtype)

    # the torch backend (today's code) on the same inputs: the same values and gradients
    torch_out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], **kw)
    assert torch_out.entropies is not None
    value_close(out.logps, torch_out.logps.detach())
    value_close(out.entropies, torch_out.entropies.detach())
    _, got_torch = grads_of(inp, torch_out.logps, torch_out.entropies)
    for g, t in zip(got, got_torch, strict=True):
        assert g is not None and t is not None
        grad_close(g, t, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["logps_only", "entropies_only", "no_entropy_output"])
def test_single_upstream_gradient(device: str, which: str) -> None:
    """Each output's gradient alone (the backward gets None for the other), bf16."""
    dtype = torch.bfloat16
    inp = on(make(33, 40, 140, dtype, bias=True, seed=5), device)
    out = token_logprobs(
        inp["hidden"], inp["weight"], inp["targets"], bias=inp["bias"], temperature=0.9,
        compute_entropy=which != "no_entropy_output", backend="triton",
    )  # fmt: skip
    assert (out.entropies is None) == (which == "no_entropy_output")
    ref_inp = on(inp, "cpu")
    ref_inp = {k: None if v is None else v.double() if v.is_floating_point() else v
               for k, v in ref_inp.items()}  # fmt: skip
    for k in ("hidden", "weight", "bias"):
        ref_inp[k].requires_grad_()
    ref_lp, ref_ent = reference(ref_inp["hidden"], ref_inp["weight"], ref_inp["targets"],
                                ref_inp["bias"], 0.9)  # fmt: skip
    g_lp, g_ent = inp["g_logp"].to(device).float(), inp["g_ent"].to(device).float()
    if which == "entropies_only":
        assert out.entropies is not None
        got_loss, ref_loss = (out.entropies * g_ent).sum(), (ref_ent * ref_inp["g_ent"]).sum()
    else:
        got_loss, ref_loss = (out.logps * g_lp).sum(), (ref_lp * ref_inp["g_logp"]).sum()
    got = torch.autograd.grad(got_loss, leaves(inp))
    want = torch.autograd.grad(ref_loss, leaves(ref_inp))
    for g, w in zip(got, want, strict=True):
        grad_close(g, w, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_masked_vocabulary(device: str) -> None:
    """−inf bias entries (a masked vocabulary; the first vocabulary block all −inf): finite
    log-probs, entropies and gradients, those of the distribution over the other entries."""
    inp = on(make(20, 32, 260, torch.float32, bias=True, seed=3), device)
    with torch.no_grad():
        inp["bias"][:130] = -math.inf
    inp["targets"] = inp["targets"] % 130 + 130
    out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], bias=inp["bias"],
                         backend="triton")  # fmt: skip
    assert out.entropies is not None
    _, got = grads_of(inp, out.logps, out.entropies)
    # the reference: the same distribution over the entries that are not masked (p = 0 there)
    kept = dict(inp, weight=inp["weight"][130:], bias=inp["bias"][130:],
                targets=inp["targets"] - 130)  # fmt: skip
    want, ref_lp, ref_ent = ref_of(kept, 1.0)
    value_close(out.logps, ref_lp)
    value_close(out.entropies, ref_ent)
    assert got[0] is not None and got[1] is not None
    grad_close(got[0], want[0], torch.float32)  # hidden
    grad_close(got[1][130:], want[1], torch.float32)  # weight: the kept rows
    assert not got[1][:130].any()  # p = 0: no gradient to the masked rows


@pytest.mark.parametrize("device", DEVICES)
def test_large_logits_stay_finite(device: str) -> None:
    """Logits of magnitude ~1e3 (float32's spacing there: 6e-5): finite everywhere, log-probs
    within float32's error of float64's."""
    inp = on(make(20, 32, 260, torch.float32, bias=False, seed=4, scale=40.0), device)
    out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], backend="triton")
    assert out.entropies is not None
    _, got = grads_of(inp, out.logps, out.entropies)
    _, ref_lp, ref_ent = ref_of(inp, 1.0)
    assert out.logps.isfinite().all() and out.entropies.isfinite().all()
    assert all(g is not None and g.isfinite().all() for g in got)
    value_close(out.logps, ref_lp)
    torch.testing.assert_close(out.entropies.double().cpu(), ref_ent, rtol=0, atol=2e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_shape_and_frozen_head(device: str) -> None:
    """(B, T, H) hidden states with a frozen bf16 head: only ``hidden`` gets a gradient."""
    inp = on(make(2 * 9, 24, 77, torch.bfloat16, bias=False, seed=8), device)
    h = inp["hidden"].detach().reshape(2, 9, 24).requires_grad_()
    w = inp["weight"].detach()
    y = inp["targets"].reshape(2, 9)
    out = token_logprobs(h, w, y, backend="triton")
    assert out.logps.shape == (2, 9) and out.entropies is not None
    (got,) = torch.autograd.grad(out.logps.sum() + out.entropies.sum(), h)
    h64 = h.detach().cpu().double().requires_grad_()
    lp, ent = reference(h64, w.cpu().double(), y.cpu())
    (want,) = torch.autograd.grad(lp.sum() + ent.sum(), h64)
    assert got.dtype == torch.bfloat16
    grad_close(got, want, torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_logits_are_not_rounded(device: str) -> None:
    """The point of the kernels: bf16 inputs, log-probs four orders closer to float64 than a
    bf16 logits tile (TRL's rounding) gets."""
    inp = on(make(40, 64, 300, torch.bfloat16, bias=False, scale=3.0), device)
    args = (inp["hidden"], inp["weight"], inp["targets"])
    ours = token_logprobs(*args, backend="triton")
    exact = reference(*(a.cpu() for a in args))
    rounded = reference(*(a.cpu() for a in args), dtype=torch.bfloat16)
    assert rel_err(ours.logps, exact[0]) < 1e-6 < 1e-3 < rel_err(rounded[0], exact[0])


_CUDA_SETUPS = {  # setup -> (inputs' dtype, autocast dtype): the half dtype is the latter's
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
    "fp32 under bf16 autocast": (torch.float32, torch.bfloat16),
}


@pytest.mark.skipif(not INTERPRETED, reason=DEVICES[0].marks[0].kwargs["reason"])
@pytest.mark.parametrize("setup", _CUDA_SETUPS)
def test_the_gpus_half_precision_path_on_the_cpu(monkeypatch: pytest.MonkeyPatch, setup: str):
    """The fused head as it runs on CUDA in half precision (``gemm_plan`` driven for "cuda",
    the float32-output GEMMs emulated by ``GemmRecorder``): half operands into the kernels,
    ∂L/∂z written in the half dtype, and every GEMM over the vocabulary on half operands into
    float32 results, two per vocabulary slice; values and gradients as on the CPU's path."""
    dtype, autocast = _CUDA_SETUPS[setup]
    half = autocast or dtype
    _as_cuda(monkeypatch, autocast)
    monkeypatch.setattr(_triton_head, "_DZ_BYTES", 1)  # two vocabulary slices
    inp = make(37, 48, 203, dtype, bias=False, seed=11)
    ctx = torch.autocast("cpu", dtype=autocast) if autocast else contextlib.nullcontext()
    with GemmRecorder() as rec, ctx:
        out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], temperature=0.8,
                             backend="triton")  # fmt: skip
        _, got = grads_of(inp, out.logps, out.entropies)
    rounded = dict(
        inp, hidden=inp["hidden"].detach().to(half), weight=inp["weight"].detach().to(half)
    )
    want, ref_lp, ref_ent = ref_of(rounded, 0.8)
    assert out.entropies is not None
    value_close(out.logps, ref_lp)
    value_close(out.entropies, ref_ent)
    # ∂L/∂z rounded to half for the GEMMs (backward_precision="half", as the torch backend on
    # CUDA): within the dtype's gradient tolerance relative to the largest entry
    with GemmRecorder(), ctx:
        torch_out = token_logprobs(inp["hidden"], inp["weight"], inp["targets"], temperature=0.8)
        _, got_torch = grads_of(inp, torch_out.logps, torch_out.entropies)
    for g, w, t in zip(got, want, got_torch, strict=True):
        assert rel_err(g, w) < GRAD_TOL[half][0] and rel_err(t, w) < GRAD_TOL[half][0]
        assert rel_err(g, w) < 2 * rel_err(t, w) + 1e-6  # no worse than the torch backend's
    over_v = [g for g in rec.gemms if g.touches(203) or g.touches(128) or g.touches(75)]
    assert len(over_v) == 4, rec.gemms  # ∂L/∂h and ∂L/∂W, per slice of 128 and 75 entries
    assert all(g.operands == (half, half) and g.out == torch.float32 for g in over_v), over_v


# ---------------------------------------------------------------------------------------------
# arguments, the import, the fresh process


def test_bad_backend_and_float64_are_refused() -> None:
    h, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="backend must be one of"):
        token_logprobs(h, w, y, backend="cuda")
    with pytest.raises(ValueError, match="takes float32, bf16 or fp16"):
        token_logprobs(h.double(), w.double(), y, backend="triton")


def test_missing_triton_gives_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton -> ImportError
    monkeypatch.delitem(sys.modules, "gmpo_core._triton_head")
    h, w, y = torch.randn(3, 4), torch.randn(5, 4), torch.tensor([0, 1, 2])
    with pytest.raises(ImportError, match=r"backend='triton'\) needs Triton"):
        token_logprobs(h, w, y, backend="triton")
    assert token_logprobs(h, w, y).logps.shape == (3,)  # the torch backend needs nothing more


def test_gmpo_core_imports_without_triton() -> None:
    code = (
        "import sys; import gmpo_core, gmpo_core.lm_head; "
        "assert 'triton' not in sys.modules, 'gmpo_core imported triton'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=300)


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction
import gmpo_core._triton_head as th
ints = ("n_rows", "vocab", "hid", "v_start", "v_end", "split_len")
T, F = True, False
CASES = [  # (kernel, dtype, F32_DOT, flags): each code path once
    (th._forward_kernel, "bf16", F, dict(HAS_BIAS=T, ENTROPY=T)),
    (th._forward_kernel, "fp16", F, dict(HAS_BIAS=F, ENTROPY=F)),
    (th._forward_kernel, "fp32", T, dict(HAS_BIAS=T, ENTROPY=T)),
    (th._backward_kernel, "bf16", F, dict(HAS_BIAS=T, HAS_GL=T, HAS_GE=T)),
    (th._backward_kernel, "bf16", F, dict(HAS_BIAS=F, HAS_GL=T, HAS_GE=F)),
    (th._backward_kernel, "fp16", F, dict(HAS_BIAS=F, HAS_GL=F, HAS_GE=T)),
    (th._backward_kernel, "fp32", T, dict(HAS_BIAS=T, HAS_GL=T, HAS_GE=T)),
]
for fn, dt, f32, flags in CASES:
    kernel = JITFunction(fn)
    types = {n: "*fp32" for n in kernel.arg_names if n.endswith("_ptr")}
    types.update({n: f"*{dt}" for n in ("h_ptr", "w_ptr", "b_ptr", "dz_ptr")})
    types.update(y_ptr="*i64", scale="fp32")
    consts = {**flags, "F32_DOT": f32, "BLOCK_N": 64, "BLOCK_V": 128, "BLOCK_H": 64}
    sig = {n: types.get(n, "i32" if n in ints or n.startswith("stride") else "constexpr")
           for n in kernel.arg_names}
    src = ASTSource(fn=kernel, signature=sig,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
    triton.compile(src, target=GPUTarget("cuda", 90, 32))
print("compiled")
"""


def test_the_kernels_compile_for_an_h100() -> None:
    """The interpreter runs the kernels as Python; Triton's compiler is stricter (a global a kernel
    reads must be a constexpr, types must agree across branches). Each kernel, in every dtype and
    flag combination, compiles ahead of time for sm_90 (an H100) without a GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


@pytest.mark.skipif(
    INTERPRETED or torch.cuda.is_available(),
    reason="this process runs the interpreter variants itself (or CUDA runs them natively)",
)
def test_interpreter_in_a_fresh_process() -> None:
    """Triton was imported before this module could switch its interpreter on: the interpreter
    variants run in a fresh process, and must pass there."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", __file__],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
