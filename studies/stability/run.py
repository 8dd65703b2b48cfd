"""One run of the stability study: the supervised warm start of a seed, and one RL run from it.

The RL loop is GRPO's: each step samples ``group`` completions for each of ``prompts`` prompts
at temperature 1, scores them with the task's reward, normalizes the rewards within each group
(``(r - mean) / (std + 1e-4)``, as TRL), and takes ``minibatches x epochs`` Adam updates on
the batch with the method's loss against the sampling policy's log-probs. Every method of a seed
starts from the same warm start and sees the same prompts (step ``k`` of seed ``s`` draws the
prompts of ``(s, k)``); sampling and minibatch order come from a generator seeded by ``s``.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import gmpo_core
import gmpo_tasks
from gmpo_core import clip_metrics
from gmpo_tasks import add
from gmpo_tasks.add import AddTask
from gmpo_tasks.chars import decode, encode
from gmpo_tasks.reverse import CELL, ReverseTask
from gmpo_tasks.warm_start import WARM, WarmStart
from gmpo_tasks.warm_start import warm_start as supervised
from studies.stability.methods import resolve
from studies.stability.model import TinyLM, completion_logps, sample

STD_EPS = 1e-4  # TRL's group-normalization epsilon
#: the study's tasks by name (``--task``): each has prompts, reward, demonstrations and the
#: lengths of its prompts and answers
TASKS = {"reverse": ReverseTask, "add": AddTask}
#: each task's own settings where they differ from :class:`Setup`'s defaults (``reverse``'s)
TASK_SETUPS: dict[str, dict[str, Any]] = {
    "reverse": {},
    "add": {"length": add.LENGTH, "noise": add.NOISE, "warm_steps": add.WARM.steps},
}
#: the token log-ratio quantiles logged at every step
QUANTILES = (0.01, 0.05, 0.95, 0.99)
#: the per-step curves of a run (each a mean over the step's updates, except reward and
#: entropy, which are the sampled batch's, and grad_norm, the largest)
CURVES = ("reward", "entropy", "log_ratio_min", "log_ratio_max", "clipped_fraction", "grad_norm",
          "skipped", "q01", "q05", "q95", "q99", "seq_range", "clip_low", "clip_high")  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """Everything a run depends on besides method, learning rate, gradient clip and seed."""

    task_name: str = "reverse"  # a key of TASKS
    length: int = 16  # digits to reverse (reverse), digits per number (add)
    noise: float = 0.1  # demonstrations: probability of replacing a target digit
    warm_steps: int = WARM.steps  # supervised steps of the warm start
    warm_batch: int = WARM.batch
    warm_lr: float = WARM.lr
    prompts: int = CELL.prompts  # prompts per RL step
    group: int = CELL.group  # completions per prompt
    minibatches: int = CELL.minibatches  # updates per epoch over a step's batch
    epochs: int = CELL.epochs  # passes over a step's batch
    steps: int = CELL.rollouts  # RL steps (rollouts)
    d: int = 64
    heads: int = 4
    layers: int = 2
    tied: bool = True  # TinyLM's output layer: tied to the embeddings (else its own, see model.py)
    beta2: float = 0.999  # the RL optimizer's (Adam's) second-moment decay

    def __post_init__(self) -> None:
        if self.task_name not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task_name!r}")
        if not 0.0 <= self.beta2 < 1.0:
            raise ValueError(f"beta2 must be in [0, 1), got {self.beta2!r}")
        TASKS[self.task_name](length=self.length, noise=self.noise)  # its checks: length, noise

    @property
    def task(self) -> ReverseTask | AddTask:
        return TASKS[self.task_name](length=self.length, noise=self.noise)

    def model(self) -> TinyLM:
        task = self.task
        return TinyLM(d=self.d, heads=self.heads, layers=self.layers, tied=self.tied,
                      max_len=task.prompt_length + task.answer_length)  # fmt: skip

    @property
    def warm(self) -> WarmStart:
        return WarmStart(steps=self.warm_steps, batch=self.warm_batch, lr=self.warm_lr)

    def warm_key(self) -> str:
        """What the warm start depends on (a cache file name)."""
        keys = ("task_name", "length", "noise", "warm_steps", "warm_batch", "warm_lr", "d",
                "heads", "layers", "tied")  # fmt: skip
        return "_".join(f"{k}{getattr(self, k)}" for k in keys)


def code_fingerprint() -> str:
    """sha256 of the code every run and warm start executes besides its method (which
    ``studies.stability.methods.fingerprint`` covers): this module, the model, the task, the
    alphabet and the warm start, gmpo_core's sources, and torch's version. Part of the cache keys: after a change to any of them, a rerun
    recomputes instead of reusing."""
    tasks = Path(gmpo_tasks.__file__).parent
    files = [Path(__file__), Path(__file__).with_name("model.py"),
             *(tasks / f for f in ("reverse.py", "add.py", "chars.py", "warm_start.py")),
             *sorted(Path(gmpo_core.__file__).parent.rglob("*.py"))]  # fmt: skip
    h = hashlib.sha256(torch.__version__.encode())
    for f in files:
        h.update(f"\0{f.parent.name}/{f.name}\0".encode() + f.read_bytes())
    return h.hexdigest()


def _ids(texts: list[str]) -> torch.Tensor:
    return torch.tensor([encode(t) for t in texts])


@torch.no_grad()
def evaluate(model: TinyLM, setup: Setup, seed: int, n: int = 256) -> tuple[float, float]:
    """(mean reward, mean entropy) of ``n`` completions at temperature 1 on held-out prompts."""
    task = setup.task
    prompts = task.prompts(n, seed=f"eval:{seed}")
    s = sample(model, _ids(prompts), task.answer_length, torch.Generator().manual_seed(seed))
    rewards = task.reward(prompts, [decode(c) for c in s.completions.tolist()])
    return sum(rewards) / n, float(s.entropy.mean())


def warm_start(setup: Setup, seed: int) -> dict[str, Any]:
    """The seed's model after ``warm_steps`` supervised steps on fresh noisy demonstrations:
    ``{"state": state_dict, "reward": ..., "entropy": ..., "cpu_s": ...}``."""
    cpu0 = time.process_time()
    torch.manual_seed(seed)
    model = setup.model()

    def batch_loss(demos: list[tuple[str, str]]) -> torch.Tensor:
        prompts, targets = _ids([p for p, _ in demos]), _ids([c for _, c in demos])
        return -completion_logps(model, prompts, targets).mean()

    supervised(model.parameters(), batch_loss, setup.task, seed, setup.warm)
    reward, entropy = evaluate(model, setup, seed)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"state": state, "reward": reward, "entropy": entropy,
            "cpu_s": time.process_time() - cpu0}  # fmt: skip


def group_advantages(rewards: torch.Tensor, group: int) -> torch.Tensor:
    """``(r - mean) / (std + 1e-4)`` within each consecutive group (unbiased std, as TRL)."""
    g = rewards.view(-1, group)
    return ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + STD_EPS)).reshape(-1)


def rl_run(
    setup: Setup,
    warm: dict[str, Any],
    method: str,
    lr: float,
    grad_clip: float | None,
    seed: int,
) -> dict[str, list[float]]:
    """Per-step curves of one RL run (:data:`CURVES`): reward and entropy of the sampled batch;
    log_ratio_min/max (the most extreme token log-ratio of the step's updates); over the tokens
    of each update, then averaged over the step's updates: clipped_fraction, the token
    log-ratio's quantiles q01, q05, q95, q99, seq_range (max - min over rows of the row-mean
    log-ratio, the log of the sequence's geometric-mean ratio), clip_low and clip_high (the
    fraction of tokens below the method's lower bound with A < 0, above its upper bound with
    A > 0; NaN for a method without token bounds); grad_norm (the largest of the step's updates,
    before clipping), skipped (updates skipped because the gradient was not finite)."""
    spec = resolve(method)
    loss_fn = spec.loss
    torch.manual_seed(seed)
    model = setup.model()
    model.load_state_dict(warm["state"])
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, setup.beta2))
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    task, batch = setup.task, setup.prompts * setup.group
    curves: dict[str, list[float]] = {k: [] for k in CURVES}
    updates = setup.epochs * setup.minibatches
    for step in range(setup.steps):
        prompts = [p for p in task.prompts(setup.prompts, seed=f"{seed}:{step}")
                   for _ in range(setup.group)]  # fmt: skip
        pids = _ids(prompts)  # (B, P)
        s = sample(model, pids, task.answer_length, gen)
        rewards = torch.tensor(task.reward(prompts, [decode(c) for c in s.completions.tolist()]))
        adv = group_advantages(rewards, setup.group)  # (B,)
        mask = torch.ones_like(s.logps, dtype=torch.bool)  # every completion has L tokens
        lo, hi, gn_max, skipped = math.inf, -math.inf, 0.0, 0
        sums = dict.fromkeys(("clipped_fraction", *_UPDATE_STATS), 0.0)
        for _ in range(setup.epochs):
            for idx in torch.randperm(batch, generator=gen).chunk(setup.minibatches):
                logp = completion_logps(model, pids[idx], s.completions[idx])  # (b, L)
                loss, clipped = loss_fn(logp, s.logps[idx], adv[idx], mask[idx])
                r = (logp - s.logps[idx]).detach()
                lo, hi = min(lo, float(r.min())), max(hi, float(r.max()))
                sums["clipped_fraction"] += float(clipped)
                for key, value in update_stats(r, adv[idx], mask[idx], spec.bounds).items():
                    sums[key] += value
                opt.zero_grad(set_to_none=True)
                loss.backward()
                max_norm = math.inf if grad_clip is None else grad_clip
                gn = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
                if math.isfinite(gn):
                    opt.step()
                    gn_max = max(gn_max, gn)
                else:
                    skipped += 1
        step_values = {"reward": float(rewards.mean()), "entropy": float(s.entropy.mean()),
                       "log_ratio_min": lo, "log_ratio_max": hi, "grad_norm": gn_max,
                       "skipped": skipped, **{k: v / updates for k, v in sums.items()}}  # fmt: skip
        for key in CURVES:
            curves[key].append(step_values[key])
    return curves


_UPDATE_STATS = ("q01", "q05", "q95", "q99", "seq_range", "clip_low", "clip_high")


def update_stats(
    r: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    bounds: tuple[float, float] | None,
) -> dict[str, float]:
    """One update's mechanism metrics over its valid tokens: the quantiles :data:`QUANTILES` of
    the token log-ratio ``r`` (b, L), the range over rows of the row-mean log-ratio, and the
    fraction of tokens clipped on each side by ``bounds`` (log space; NaN without bounds)."""
    valid = mask != 0
    q = torch.quantile(
        r[valid].double(), torch.tensor(QUANTILES, dtype=torch.float64, device=r.device)
    )
    row = (r * valid).sum(1) / valid.sum(1).clamp(min=1)  # (b,)
    out = dict(zip(_UPDATE_STATS[:4], q.tolist(), strict=True))
    out["seq_range"] = float(row.max() - row.min())
    if bounds is None:
        out["clip_low"] = out["clip_high"] = math.nan
    else:
        stats = clip_metrics(r, advantages, mask, epsilon=bounds[0], epsilon_high=bounds[1])
        tokens = float(stats.num_tokens)
        out["clip_low"] = float(stats.num_clipped_low) / max(tokens, 1.0)
        out["clip_high"] = float(stats.num_clipped_high) / max(tokens, 1.0)
    return out


def init_worker() -> None:
    """A sweep worker: one intra-op thread (the model's matrices are kilobytes; a second
    thread only adds synchronization)."""
    torch.set_num_threads(1)


def warm_job(setup: dict[str, Any], seed: int, path: str) -> dict[str, Any]:
    """Compute a seed's warm start and save it to ``path``; returns its reward, entropy, cpu_s."""
    warm = warm_start(Setup(**setup), seed)
    torch.save(warm, path)
    return {k: v for k, v in warm.items() if k != "state"}


def run_job(
    setup: dict[str, Any], method: str, lr: float, grad_clip: float | None, seed: int, warm: str
) -> dict[str, Any]:
    """One RL run from the warm start saved at ``warm``: its curves and its CPU seconds."""
    state = torch.load(warm, weights_only=True)
    cpu0 = time.process_time()
    curves = rl_run(Setup(**setup), state, method, lr, grad_clip, seed)
    return {"curves": curves, "cpu_s": time.process_time() - cpu0}
