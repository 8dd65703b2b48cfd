"""What differs between the torch releases the core supports (torch >= 2.4), pinned down where
gmpo depends on it. ``make compat`` runs this file at torch 2.4 (Python 3.10) and at the newest
torch pip installs; the main run at the tested torch.

- S1's tie: a value exactly on a bound is not clipped, its gradient is 1, on every path (torch
  2.14 changed the gradient of ``clamp`` at a tie to 0.5);
- ``gmpo_loss`` inside a user's ``torch.compile`` (torch 2.4's Dynamo cannot trace
  ``NamedTuple._replace``);
- the compiled path's first call may change the process's floating-point mode (torch 2.4 flushes
  subnormals to zero after it): gmpo's results do not depend on subnormals either way.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from gmpo_core import clip_log_ratio, clip_metrics, gmpo_loss, trust_region_log_ratio

TRACES = {
    "called": None,
    "in a user's compile (eager)": "eager",
    "in a user's compile (aot_eager)": "aot_eager",
}


def traced(fn, how):  # type: ignore[no-untyped-def]
    backend = TRACES[how]
    return fn if backend is None else torch.compile(fn, backend=backend, fullgraph=True)


def _grad(y: torch.Tensor, x: torch.Tensor, **kwargs: bool) -> torch.Tensor:
    (g,) = torch.autograd.grad(y, x, **kwargs)
    return g


# ---------------------------------------------------------------------------------------------
# S1: a value on its bound is not clipped, on every torch and every path
# ---------------------------------------------------------------------------------------------

# eps = 0.5 and log dual_clip = 1 are exact in binary; 2**-10 puts a value just past a bound.
ON, PAST = 0.5, 0.5 + 2**-10


# create_graph=True is not combined with AOTAutograd (aot_eager): its compiled backward donates
# buffers and refuses a double backward once a first call has cached it without one
PATHS = [
    (how, backward)
    for how in TRACES
    for backward in ("loss", "create_graph", "log_coef")
    if not (backward == "create_graph" and TRACES[how] == "aot_eager")
]


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize(("how", "backward"), PATHS)
def test_a_token_on_its_bound_passes_gradient_one_on_every_path(impl, how, backward):
    # Row 0: A = +1, r = [0.5, 0.5 + 2^-10]: c = [0.5, 0.5], log_coef 0.5, the second clipped.
    # Row 1: A = -1, r = [-0.5, -0.5 - 2^-10]: c = [-0.5, -0.5], log_coef -0.5.
    # d loss / d logp_t = -A exp(log_coef) / (n B) at unclipped tokens: -e^.5/4 and e^-.5/4.
    # d sum(log_coef) / d logp_t = 1 / n = 1/2 at unclipped tokens ("log_coef": an upstream
    # gradient on log_coef; it and create_graph=True take the recomputing backward).
    logp = torch.tensor([[ON, PAST], [-ON, -PAST]], requires_grad=True)
    out = traced(gmpo_loss, how)(
        logp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), epsilon=0.5, impl=impl
    )
    if backward == "log_coef":
        g, expected = _grad(out.log_coef.sum(), logp), [[0.5, 0.0], [0.5, 0.0]]
    else:
        g = _grad(out.loss, logp, create_graph=backward == "create_graph")
        expected = [[-math.exp(0.5) / 4, 0.0], [math.exp(-0.5) / 4, 0.0]]
    torch.testing.assert_close(g.detach(), torch.tensor(expected))
    assert out.stats.num_clipped_high.item() == 1 and out.stats.num_clipped_low.item() == 1


@pytest.mark.parametrize("impl", ["plain", "compiled"])
@pytest.mark.parametrize("how", list(TRACES))
def test_a_token_on_the_dual_cap_passes_gradient_one(impl, how):
    # A = -1, dual_clip = e (log cap 1): r = [1, 1 + 2^-10] -> c = [1, 1], log_coef 1,
    # loss = e; d loss / d logp = [e / 2, 0] (the second token is capped).
    logp = torch.tensor([[1.0, 1.0 + 2**-10]], requires_grad=True)
    out = traced(gmpo_loss, how)(
        logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=math.e, impl=impl
    )
    torch.testing.assert_close(out.loss.detach(), torch.tensor(math.e))
    torch.testing.assert_close(_grad(out.loss, logp), torch.tensor([[math.e / 2, 0.0]]))
    assert out.stats.num_clipped_dual is not None and out.stats.num_clipped_dual.item() == 1


@pytest.mark.parametrize("how", list(TRACES))
def test_the_building_blocks_pass_gradient_one_on_the_bound(how):
    x = torch.tensor([-ON, ON, -PAST, PAST], requires_grad=True)
    y = traced(lambda v: clip_log_ratio(v, epsilon=0.5), how)(x)
    torch.testing.assert_close(_grad(y.sum(), x), torch.tensor([1.0, 1.0, 0.0, 0.0]))

    r = torch.tensor([[ON, PAST], [-ON, -PAST], [1.0, 1.0 + 2**-10]], requires_grad=True)
    adv = torch.tensor([1.0, -1.0, -1.0])
    c = traced(lambda v: trust_region_log_ratio(v, adv, epsilon=0.5, dual_clip=math.e), how)(r)
    torch.testing.assert_close(c.detach(), torch.tensor([[ON, ON], [-ON, -ON], [1.0, 1.0]]))
    expected = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    torch.testing.assert_close(_grad(c.sum(), r), expected)
    stats = clip_metrics(r.detach(), adv, torch.ones(3, 2), epsilon=0.5, dual_clip=math.e)
    assert [s.item() for s in stats[1:4]] == [1, 1, 1]  # low, high, dual: the tokens past


# ---------------------------------------------------------------------------------------------
# inside a user's torch.compile
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gmpo_in_a_users_fullgraph_compile(backend, dual_clip):
    """torch 2.4's Dynamo raised 'inline in skipfiles: ClipStats._replace' here."""
    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(3, 5, generator=g) * 0.3).requires_grad_()
    old, adv = torch.randn(3, 5, generator=g) * 0.3, torch.tensor([1.0, -0.5, 0.0])
    mask = torch.rand(3, 5, generator=g) > 0.2

    def step(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = gmpo_loss(x, old, adv, mask, dual_clip=dual_clip)
        return out.loss, out.metrics["clip_ratio/region_mean"]

    (loss, region), (want, want_region) = (
        torch.compile(step, backend=backend, fullgraph=True)(logp),
        step(logp),
    )
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(region, want_region)
    torch.testing.assert_close(_grad(loss, logp), _grad(want, logp))


def test_clip_metrics_in_a_users_fullgraph_compile():
    r, adv = torch.tensor([[0.1, 0.9], [-0.9, 0.2]]), torch.tensor([1.0, -1.0])
    stats = torch.compile(
        lambda x: clip_metrics(x, adv, torch.ones(2, 2)), backend="eager", fullgraph=True
    )(r)
    assert stats.num_clipped_dual is None and stats.num_clipped_high.item() == 1


# ---------------------------------------------------------------------------------------------
# the floating-point mode after the first compiled call
# ---------------------------------------------------------------------------------------------

_SUBNORMALS = textwrap.dedent(
    """
    import torch
    from gmpo_core import gmpo_loss

    def subnormals_survive():
        return bool((torch.tensor([1e-40]) * torch.tensor([1.0])).item() != 0)

    def loss_and_grad(impl):
        logp = torch.tensor([[1e-39, 2e-39, 0.3], [-1e-39, 0.2, 0.1]], requires_grad=True)
        out = gmpo_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -1.0]),
                        torch.ones(2, 3), impl=impl)
        out.loss.backward()
        return out.loss.item(), logp.grad.tolist()

    before = subnormals_survive(), loss_and_grad("plain")
    loss_and_grad("compiled")  # the first compiled call
    after = subnormals_survive(), loss_and_grad("plain")
    print(before[0], after[0])
    assert before[1] == after[1], (before[1], after[1])
    """
)


def test_results_do_not_depend_on_the_mode_the_first_compiled_call_may_set():
    """In a fresh process: the plain path gives the same loss and gradient before and after the
    first compiled call, whether or not that call made the process flush subnormals to zero
    (torch 2.4 does, 2.13 does not; docs/api.md)."""
    run = subprocess.run(
        [sys.executable, "-c", _SUBNORMALS], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    before, after = run.stdout.split()[-2:]
    assert before == "True"  # a process starts with subnormals
    print(f"torch {torch.__version__}: subnormals after the first compiled call: {after}")
