"""GMPO on a toy verifiable task, with nothing but torch and gmpo_core (CPU, seconds).

Task: given a digit d, write d, d+1, d, d+1, d (mod 10). The reward is the fraction of correct
digits, so it is verifiable and starts near 0.1 for a random policy. The
policy is a tiny autoregressive MLP; each step samples G completions per prompt, turns rewards
into group-relative advantages (GRPO's estimator), and takes ``iterations`` GMPO updates on the
batch, so from the second update on the log-ratio is not 0 and the trust region matters.

    python examples/core_demo.py --steps 60 --seed 0

The project's main job is ``make train`` (``gmpo train``: TRL's GRPOTrainer with gmpo_core's
loss on a tiny model); this script is the same loop written out with torch and gmpo_core alone.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import Tensor, nn

from gmpo_core import gmpo_loss

V, L = 10, 5  # digits, completion length


class Policy(nn.Module):
    """logits(next digit | prompt digit, position, previous digit)."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.prompt = nn.Embedding(V, hidden)
        self.pos = nn.Embedding(L, hidden)
        self.prev = nn.Embedding(V + 1, hidden)  # V = "no previous digit"
        self.head = nn.Sequential(
            nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, V)
        )

    def forward(self, prompts: Tensor, completions: Tensor) -> Tensor:
        """Log-probs of every digit at every position. Shape: (N,), (N, L) -> (N, L, V)."""
        prev = torch.cat([torch.full_like(completions[:, :1], V), completions[:, :-1]], dim=1)
        pos = torch.arange(L, device=prompts.device)
        h = self.prompt(prompts)[:, None] + self.pos(pos)[None] + self.prev(prev)
        return torch.log_softmax(self.head(h), dim=-1)

    @torch.no_grad()
    def sample(self, prompts: Tensor, generator: torch.Generator) -> Tensor:
        out = torch.zeros(len(prompts), L, dtype=torch.long)
        for t in range(L):
            logp = self.forward(prompts, out)[:, t]
            out[:, t] = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        return out


def token_logp(policy: Policy, prompts: Tensor, completions: Tensor) -> Tensor:
    """Shape: (N, L): log-prob of each sampled digit."""
    return policy(prompts, completions).gather(-1, completions[..., None]).squeeze(-1)


def reward(prompts: Tensor, completions: Tensor) -> Tensor:
    target = (prompts[:, None] + torch.arange(L) % 2) % V
    return (completions == target).float().mean(1)


def train(steps: int = 60, seed: int = 0, prompts_per_step: int = 16, group: int = 8,
          iterations: int = 2, lr: float = 1e-2, epsilon: float = 0.4, impl: str = "plain",
          log_every: int = 5) -> list[dict[str, float]]:  # fmt: skip
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = Policy()
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    history = []
    for step in range(steps):
        t0 = time.perf_counter()
        prompts = torch.randint(0, V, (prompts_per_step,), generator=gen).repeat_interleave(group)
        completions = policy.sample(prompts, gen)
        r = reward(prompts, completions)
        grouped = r.view(-1, group)
        adv = (
            (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
        ).view(-1)
        mask = torch.ones(len(prompts), L, dtype=torch.bool)
        with torch.no_grad():
            old_logp = token_logp(policy, prompts, completions)
        for _ in range(iterations):
            out = gmpo_loss(token_logp(policy, prompts, completions), old_logp, adv, mask,
                            epsilon=epsilon, impl=impl)  # type: ignore[arg-type]  # fmt: skip
            opt.zero_grad()
            out.loss.backward()
            opt.step()
        row = {"step": step, "reward": r.mean().item(), "loss": out.loss.item(),
               "seconds": time.perf_counter() - t0}  # fmt: skip
        row.update({k: v.item() for k, v in out.metrics.items()})
        history.append(row)
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
    return history


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epsilon", type=float, default=0.4)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--impl", choices=["plain", "compiled"], default="plain")
    a = p.parse_args()
    h = train(steps=a.steps, seed=a.seed, epsilon=a.epsilon, iterations=a.iterations, impl=a.impl)
    first = sum(r["reward"] for r in h[:5]) / 5
    last = sum(r["reward"] for r in h[-5:]) / 5
    print(f"mean reward: first 5 steps {first:.3f} -> last 5 steps {last:.3f}")


if __name__ == "__main__":
    main()
