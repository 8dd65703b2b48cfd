"""The stability study's policy: a tiny causal transformer with a KV cache, in plain torch.

Pre-LayerNorm blocks, learned positions, tied input and output embeddings initialized
N(0, 0.02) (``tied=False``: an output layer of its own with a bias, and PyTorch's default
initialization, N(0, 1) embeddings: the other model of docs/study.md's regime question). ``sample`` draws
completions token by token from the cache (temperature 1) and returns the sampled tokens'
log-probs and the policy's entropy at each position; ``completion_logps`` recomputes the
log-probs of given completions with one causal forward (what the loss is built on).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Cache = list[tuple[Tensor, Tensor]]


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        b, t, d = x.shape
        q, k, v = (
            self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        )
        if past is not None:  # decoding: the new positions see every cached one
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=past is None)  # (B, H, t, d/H)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x)), k, v


class TinyLM(nn.Module):
    """``layers`` blocks of width ``d`` with ``heads`` heads over ``vocab`` tokens; the output
    layer tied to the token embeddings (``tied``) or its own."""

    def __init__(self, vocab: int = 16, d: int = 64, heads: int = 4, layers: int = 2,
                 max_len: int = 64, tied: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = None if tied else nn.Linear(d, vocab)
        if tied:
            nn.init.normal_(self.tok.weight, std=0.02)
            nn.init.normal_(self.pos.weight, std=0.02)

    def forward(self, ids: Tensor, cache: Cache | None = None) -> tuple[Tensor, Cache]:
        """Logits (B, t, V) of the next token at each of the t new positions, and the new cache."""
        start = 0 if cache is None else cache[0][0].shape[2]
        x = self.tok(ids) + self.pos(torch.arange(start, start + ids.shape[1]))
        new: Cache = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, None if cache is None else cache[i])
            new.append((k, v))
        x = self.ln(x)
        return (x @ self.tok.weight.T if self.head is None else self.head(x)), new


class Sample(NamedTuple):
    completions: Tensor  # (B, L) sampled token ids
    logps: Tensor  # (B, L) their log-probs under the sampling policy
    entropy: Tensor  # (B, L) the policy's entropy at each position


@torch.no_grad()
def sample(model: TinyLM, prompts: Tensor, length: int, generator: torch.Generator) -> Sample:
    """``length`` tokens after each prompt (B, P), at temperature 1, from the KV cache."""
    logits, cache = model(prompts)
    logits = logits[:, -1]
    tokens, logps, entropy = [], [], []
    for i in range(length):
        logp = torch.log_softmax(logits, -1)  # (B, V)
        tok = torch.multinomial(logp.exp(), 1, generator=generator)  # (B, 1)
        tokens.append(tok)
        logps.append(logp.gather(1, tok))
        entropy.append(-(logp.exp() * logp).sum(-1, keepdim=True))
        if i + 1 < length:
            logits, cache = model(tok, cache)
            logits = logits[:, -1]
    return Sample(torch.cat(tokens, 1), torch.cat(logps, 1), torch.cat(entropy, 1))


def completion_logps(model: TinyLM, prompts: Tensor, completions: Tensor) -> Tensor:
    """Log-probs (B, L) of the completions (B, L) after the prompts (B, P), one forward."""
    ids = torch.cat([prompts, completions], 1)[:, :-1]
    logits, _ = model(ids)
    logits = logits[:, prompts.shape[1] - 1 :]  # (B, L, V): the positions that predict them
    return torch.log_softmax(logits, -1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
