"""One run of the stability study: the supervised warm start of a seed, and one RL run from it.

The RL loop is GRPO's: each step samples ``group`` completions for each of ``prompts`` prompts
at temperature 1, scores them with the task's reward, normalizes the rewards within each group
(``(r - mean) / (std + 1e-4)``, as TRL), and takes ``minibatches x epochs`` Adam updates on
the batch with the method's loss against the sampling policy's log-probs. Every method of a seed
starts from the same warm start and sees the same prompts (step ``k`` of seed ``s`` draws the
prompts of ``(s, k)``); sampling and minibatch order come from a generator seeded by ``s``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import gmpo_core
from gmpo_core import clip_metrics
from gmpo_tasks.catalog import TINY_TASKS
from gmpo_tasks.chars import decode, encode
from gmpo_tasks.task import CELL, Task
from gmpo_tasks.warm_start import WarmStart
from gmpo_tasks.warm_start import warm_start as supervised
from gmpo_variants import resolve
from studies.stability.files import write_atomic
from studies.stability.model import TinyLM, completion_logps, sample

STD_EPS = 1e-4  # TRL's group-normalization epsilon
#: the token log-ratio quantiles logged at every step
QUANTILES = (0.01, 0.05, 0.95, 0.99)
#: the per-step curves of a run (each a mean over the step's updates, except reward, entropy
#: and length, which are the sampled batch's, and grad_norm, the largest)
CURVES = ("reward", "entropy", "log_ratio_min", "log_ratio_max", "clipped_fraction", "grad_norm",
          "skipped", "q01", "q05", "q95", "q99", "seq_range", "clip_low", "clip_high",
          "length")  # fmt: skip
#: Setup's counts, each at least 1 (``warm_steps`` may be 0: no warm start)
_COUNTS = ("length", "prompts", "minibatches", "epochs", "steps", "d", "heads", "layers",
           "warm_batch")  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """Everything a run depends on besides variant, learning rate, gradient clip and seed. The
    task's own settings (``length``, ``noise``, the warm start's) default to its entry in
    ``gmpo_tasks.catalog.TINY_TASKS`` (:meth:`of`); the RL setting to ``gmpo_tasks.task.CELL``."""

    task_name: str = "reverse"  # a key of TINY_TASKS
    length: int = 16  # the task's size: digits to reverse, digits per number, terms...
    noise: float = 0.1  # demonstrations: probability of replacing an answer character
    warm_steps: int = 400  # supervised steps of the warm start
    warm_batch: int = 64
    warm_lr: float = 3e-3
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
        """Every value a run can use, checked before any work (a ValueError of one line)."""
        if self.task_name not in TINY_TASKS:
            raise ValueError(f"task must be one of {', '.join(TINY_TASKS)}, got {self.task_name!r}")
        for key in _COUNTS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        if self.warm_steps < 0:
            raise ValueError(f"warm_steps must be an integer >= 0, got {self.warm_steps!r}")
        if self.group < 2:
            raise ValueError(f"group must be at least 2 (a group's advantages need its std), "
                             f"got {self.group}")  # fmt: skip
        if self.minibatches > self.prompts * self.group:
            raise ValueError(f"minibatches ({self.minibatches}) must be at most prompts x group "
                             f"({self.prompts * self.group} completions a step)")  # fmt: skip
        if self.d % self.heads:
            raise ValueError(f"d ({self.d}) must be a multiple of heads ({self.heads})")
        if not (math.isfinite(self.warm_lr) and self.warm_lr > 0):
            raise ValueError(f"warm_lr must be a finite number > 0, got {self.warm_lr!r}")
        if not 0.0 <= self.beta2 < 1.0:
            raise ValueError(f"beta2 must be in [0, 1), got {self.beta2!r}")
        self.task  # noqa: B018  (the task's own checks: length, noise)

    @classmethod
    def of(cls, task_name: str, **overrides: Any) -> Setup:
        """The setup of ``task_name`` with its own settings, then ``overrides``."""
        if task_name not in TINY_TASKS:
            raise ValueError(f"task must be one of {', '.join(TINY_TASKS)}, got {task_name!r}")
        task = TINY_TASKS[task_name]
        own = {"length": task.length, "noise": task.noise, "warm_steps": task.warm.steps,
               "warm_batch": task.warm.batch, "warm_lr": task.warm.lr}  # fmt: skip
        return cls(task_name=task_name, **{**own, **overrides})

    @property
    def task(self) -> Task:
        return dataclasses.replace(
            TINY_TASKS[self.task_name], length=self.length, noise=self.noise, warm=self.warm
        )

    @property
    def vocab(self) -> str:
        """The model's symbols: the task's (the end-of-sequence token is one more id)."""
        return TINY_TASKS[self.task_name].symbols

    def model(self) -> TinyLM:
        task = self.task
        return TinyLM(vocab=len(task.symbols) + task.variable_length, d=self.d, heads=self.heads,
                      layers=self.layers, tied=self.tied,
                      max_len=task.prompt_length + task.completion_length)  # fmt: skip

    @property
    def warm(self) -> WarmStart:
        return WarmStart(steps=self.warm_steps, batch=self.warm_batch, lr=self.warm_lr)

    def warm_key(self) -> str:
        """What the warm start depends on (a cache file name)."""
        keys = ("task_name", "length", "noise", "warm_steps", "warm_batch", "warm_lr", "d",
                "heads", "layers", "tied")  # fmt: skip
        return "_".join(f"{k}{getattr(self, k)}" for k in keys)

    def code_fingerprint(self) -> str:
        """sha256 of the code every run and warm start executes besides its variant (which
        ``studies.stability.fingerprint`` covers): the study's run and model, the
        task's sources (``Task.sources``) and its data's package versions, gmpo_core's
        sources, and torch's version. Part of the cache keys: after a change to any of them, a
        rerun recomputes instead of reusing."""
        task = self.task
        files = [Path(__file__), Path(__file__).with_name("model.py"), *task.sources(),
                 *sorted(Path(gmpo_core.__file__).parent.rglob("*.py"))]  # fmt: skip
        h = hashlib.sha256(f"{torch.__version__} {sorted(task.versions().items())}".encode())
        for f in files:
            h.update(f"\0{f.parent.name}/{f.name}\0".encode() + f.read_bytes())
        return h.hexdigest()


def _ids(texts: list[str], vocab: str) -> torch.Tensor:
    return torch.tensor([encode(t, vocab) for t in texts])


def completion_mask(completions: torch.Tensor, eos: int | None) -> torch.Tensor:
    """The valid tokens of sampled completions (B, L): all of them (``eos`` None: answers of one
    length), else those up to and including the first end-of-sequence token ``eos``.

    Shape:
        completions: (B, L). Output: (B, L) bool.
    """
    if eos is None:
        return torch.ones_like(completions, dtype=torch.bool)
    is_eos = (completions == eos).long()
    return (is_eos.cumsum(1) - is_eos) == 0


@dataclass(frozen=True)
class Rollout:
    """Sampled completions of prompts: the sample, the completions' texts (before the
    end-of-sequence token) and their valid tokens (B, L)."""

    sample: Any
    texts: list[str]
    mask: torch.Tensor


def roll_out(model: TinyLM, setup: Setup, prompts: list[str], gen: torch.Generator) -> Rollout:
    """``task.completion_length`` tokens after each prompt at temperature 1 (:func:`sample`),
    and what the reward and the loss read of them."""
    task, vocab = setup.task, setup.vocab
    s = sample(model, _ids(prompts, vocab), task.completion_length, gen)
    mask = completion_mask(s.completions, len(vocab) if task.variable_length else None)
    eos = len(vocab)
    texts = [decode([t for t in row if t != eos][: task.answer_length], vocab)
             if task.variable_length else decode(row, vocab)
             for row in torch.where(mask, s.completions, eos).tolist()]  # fmt: skip
    return Rollout(s, texts, mask)


@torch.no_grad()
def evaluate(model: TinyLM, setup: Setup, seed: int, n: int = 256) -> tuple[float, float]:
    """(mean reward, mean entropy over valid tokens) of ``n`` completions at temperature 1 on
    held-out prompts."""
    prompts = setup.task.prompts(n, seed=f"eval:{seed}")
    out = roll_out(model, setup, prompts, torch.Generator().manual_seed(seed))
    rewards = setup.task.reward(prompts, out.texts)
    return sum(rewards) / n, float(out.sample.entropy[out.mask].mean())


def warm_start(setup: Setup, seed: int) -> dict[str, Any]:
    """The seed's model after ``warm_steps`` supervised steps on fresh noisy demonstrations:
    ``{"state": state_dict, "reward": ..., "entropy": ..., "cpu_s": ...}``. Answers that vary
    in length are learned with their end-of-sequence token."""
    cpu0 = time.process_time()
    torch.manual_seed(seed)
    model = setup.model()
    task, vocab = setup.task, setup.vocab
    eos = len(vocab)

    def batch_loss(demos: list[tuple[str, str]]) -> torch.Tensor:
        prompts = _ids([p for p, _ in demos], vocab)
        if not task.variable_length:
            targets = _ids([c for _, c in demos], vocab)
            return -completion_logps(model, prompts, targets).mean()
        answers = [[*encode(c, vocab), eos] for _, c in demos]
        width = max(len(a) for a in answers)
        targets = torch.tensor([a + [eos] * (width - len(a)) for a in answers])
        valid = completion_mask(targets, eos)
        logps = completion_logps(model, prompts, targets)
        return -torch.where(valid, logps, 0).sum() / valid.sum()

    supervised(model.parameters(), batch_loss, task, seed, setup.warm)
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
    name: str,
    lr: float,
    grad_clip: float | None,
    seed: int,
) -> dict[str, list[float]]:
    """Per-step curves of one RL run (:data:`CURVES`): reward and entropy of the sampled batch;
    log_ratio_min/max (the most extreme token log-ratio of the step's updates); over the tokens
    of each update, then averaged over the step's updates: clipped_fraction, the token
    log-ratio's quantiles q01, q05, q95, q99, seq_range (max - min over rows of the row-mean
    log-ratio, the log of the sequence's geometric-mean ratio), clip_low and clip_high (the
    fraction of tokens below the variant's lower bound with A < 0, above its upper bound with
    A > 0; NaN for a variant without token bounds); grad_norm (the largest of the step's updates,
    before clipping), skipped (updates skipped because the gradient was not finite), length (the
    sampled completions' mean number of valid tokens, the end-of-sequence token included)."""
    variant = resolve(name)
    torch.manual_seed(seed)
    model = setup.model()
    model.load_state_dict(warm["state"])
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, setup.beta2))
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(seed)
    task, batch, vocab = setup.task, setup.prompts * setup.group, setup.vocab
    curves: dict[str, list[float]] = {k: [] for k in CURVES}
    updates = setup.epochs * setup.minibatches
    for step in range(setup.steps):
        prompts = [p for p in task.prompts(setup.prompts, seed=f"{seed}:{step}")
                   for _ in range(setup.group)]  # fmt: skip
        pids = _ids(prompts, vocab)  # (B, P)
        rollout = roll_out(model, setup, prompts, gen)
        s, mask = rollout.sample, rollout.mask  # mask (B, L): the valid tokens
        rewards = torch.tensor(task.reward(prompts, rollout.texts))
        adv = group_advantages(rewards, setup.group)  # (B,)
        lo, hi, gn_max, skipped = math.inf, -math.inf, 0.0, 0
        sums = dict.fromkeys(("clipped_fraction", *_UPDATE_STATS), 0.0)
        for _ in range(setup.epochs):
            for idx in torch.randperm(batch, generator=gen).chunk(setup.minibatches):
                logp = completion_logps(model, pids[idx], s.completions[idx])  # (b, L)
                loss, clipped = variant(logp, s.logps[idx], adv[idx], mask[idx])
                r = (logp - s.logps[idx]).detach()
                valid_r = r[mask[idx]]
                lo, hi = min(lo, float(valid_r.min())), max(hi, float(valid_r.max()))
                sums["clipped_fraction"] += float(clipped)
                for key, value in update_stats(r, adv[idx], mask[idx], variant.bounds).items():
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
        step_values = {"reward": float(rewards.mean()), "entropy": float(s.entropy[mask].mean()),
                       "length": float(mask.sum(1).double().mean()),
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
    thread only adds synchronization), and Ctrl-C ignored: the main process decides
    (``sweep.CtrlC``), and a worker finishes the job it has."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def warm_job(setup: dict[str, Any], seed: int, path: str) -> dict[str, Any]:
    """Compute a seed's warm start and save it to ``path``; returns its reward, entropy, cpu_s."""
    warm = warm_start(Setup(**setup), seed)
    buffer = io.BytesIO()
    torch.save(warm, buffer)
    write_atomic(Path(path), buffer.getvalue())  # whole or not at all
    return {k: v for k, v in warm.items() if k != "state"}


def run_job(
    setup: dict[str, Any], variant: str, lr: float, grad_clip: float | None, seed: int, warm: str
) -> dict[str, Any]:
    """One RL run from the warm start saved at ``warm``: its curves and its CPU seconds."""
    state = torch.load(warm, weights_only=True)
    cpu0 = time.process_time()
    curves = rl_run(Setup(**setup), state, variant, lr, grad_clip, seed)
    return {"curves": curves, "cpu_s": time.process_time() - cpu0}
