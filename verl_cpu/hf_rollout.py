"""Test support: a small ``hf`` rollout for verl 0.9.1 on CPU. Not part of the shipped package.

verl 0.9.1 registers only the ``vllm``, ``sglang`` and ``trtllm`` rollout servers, and no CPU
build of vLLM fits the pins. This module is the smallest server verl's agent loop can talk to:

- :class:`HFRolloutServer`, a Ray actor holding the Hugging Face model, that samples token by
  token (temperature only) and reports each sampled token's log-prob
  (``rollout.calculate_log_probs``);
- :class:`HFServerAdapter`, verl's ``BaseRollout`` in the actor worker: with
  ``checkpoint_engine.backend=naive`` verl hands it the actor's weights after every update, and
  it sends them to the server;
- :class:`HFReplica`, verl's ``RolloutReplica`` that starts one server per replica (hybrid mode).

:mod:`verl_cpu.cpu_support` registers them as ``actor_rollout_ref.rollout.name=hf``. The
server prints one line per weight sync (``hf rollout: weights synced ...``) for the tests.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput


def _server_name(replica_rank: int) -> str:
    return f"hf_rollout_server_{replica_rank}"


def _get(config: Any, key: str, default: Any = None) -> Any:
    """A field of a verl config that is a dataclass or a DictConfig."""
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


class HFRolloutServer:
    """Samples with the Hugging Face model and its KV cache; one request at a time (small models)."""

    def __init__(self, rollout_config: Any, model_config: Any, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        path = _get(model_config, "local_path") or _get(model_config, "path")
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.max_new_tokens = int(_get(rollout_config, "response_length"))
        eos = self.model.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.generator = torch.Generator().manual_seed(
            int(_get(rollout_config, "seed", 0)) + replica_rank
        )
        self.lock = asyncio.Lock()
        self.syncs = 0
        self.global_steps: int | None = None

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], temperature: float) -> tuple[list[int], list[float]]:
        ids = torch.tensor([prompt_ids])  # the prompt, then each new token alone (KV cache)
        past = None
        tokens: list[int] = []
        log_probs: list[float] = []
        for _ in range(self.max_new_tokens):
            out = self.model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=self.generator))
            else:  # greedy (validation)
                logp = torch.log_softmax(logits, -1)
                token = int(logp.argmax())
            tokens.append(token)
            log_probs.append(float(logp[token]))
            if token in self.eos:
                break
            ids = torch.tensor([[token]])
        return tokens, log_probs

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data or kwargs.get("audio_data"):
            raise NotImplementedError("the hf test rollout is text-only")
        top_p, top_k = sampling_params.get("top_p", 1.0), sampling_params.get("top_k", -1)
        if top_p not in (None, 1.0) or top_k not in (None, -1, 0):
            raise NotImplementedError(
                f"the hf test rollout samples with temperature only, got {sampling_params}"
            )
        async with self.lock:
            tokens, log_probs = self._sample(
                list(prompt_ids), float(sampling_params.get("temperature", 1.0))
            )
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None) -> int:
        async with self.lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            tied = self.model.config.tie_word_embeddings
            if unexpected or [k for k in missing if not (tied and k == "lm_head.weight")]:
                raise RuntimeError(
                    f"hf rollout: weight names do not match: {missing=} {unexpected=}"
                )
            self.syncs += 1
            self.global_steps = global_steps
        print(
            f"hf rollout: weights synced (sync {self.syncs}, global_steps {global_steps}, "
            f"{len(state)} tensors)",
            flush=True,
        )
        return self.syncs

    # verl's replica calls these around generation and weight syncs: nothing to do on CPU
    async def wake_up(self) -> None: ...
    async def sleep(self) -> None: ...
    async def clear_kv_cache(self) -> None: ...
    async def release_kv_cache(self) -> None: ...
    async def resume_kv_cache(self) -> None: ...
    async def abort_all_requests(self, reject_request: bool = False) -> None: ...
    async def resume_generation(self) -> None: ...
    async def start_profile(self, **kwargs: Any) -> None: ...
    async def stop_profile(self) -> None: ...


class HFReplica(RolloutReplica):
    """One :class:`HFRolloutServer` per replica, beside the actor workers (hybrid mode)."""

    async def launch_servers(self) -> None:
        if self.nnodes != 1:
            raise NotImplementedError("the hf test rollout runs on one node")
        server = (
            ray.remote(HFRolloutServer)
            .options(
                name=_server_name(self.replica_rank),
                num_cpus=0,
                max_concurrency=self.max_concurrency,
            )
            .remote(self.config, self.model_config, self.replica_rank)
        )
        self.servers = [server]
        self._server_handle = server
        self._server_address = _server_name(self.replica_rank)

    def rollout_worker_use_gpu(self) -> bool:
        return False


async def _aiter(weights: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


class HFServerAdapter(BaseRollout):
    """verl's rollout in the actor worker: forwards the actor's weights to the server."""

    def __init__(
        self, config: Any, model_config: Any, device_mesh: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world
        self.is_leader_rank = rank % world == 0
        self._server: Any = None

    async def resume(self, tags: list[str]) -> None: ...

    async def release(self) -> None: ...

    async def update_weights(
        self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the hf test rollout takes full tensors, got {wire_format}")
        state = {}
        async for name, tensor in _aiter(weights):
            if hasattr(tensor, "full_tensor"):  # a DTensor
                tensor = tensor.full_tensor()
            state[name] = tensor.detach().to("cpu", torch.float32).clone()
        if not self.is_leader_rank:
            return
        if self._server is None:
            self._server = ray.get_actor(_server_name(self.replica_rank))
        await self._server.update_weights.remote(state, kwargs.get("global_steps"))
