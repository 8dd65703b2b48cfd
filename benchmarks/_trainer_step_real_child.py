"""bench_trainer_step.py's real-model child (``--model``): one trainer's whole step in one
precision, on a pretrained model, in a fresh process (the parent runs it as
``bench_trainer_step.py --model NAME --_child VARIANT --_precision PRECISION``)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from typing import Any

from _common import proc_status_kib, reset_peak_rss

#: the trainers of the real-model mode: gmpo_trl's GMPOTrainer (its defaults, gmpo_core's LM
#: head), TRL's GRPOTrainer (its default loss_type) and trl.experimental.gmpo.GMPOTrainer
REAL_VARIANTS = ("gmpo", "grpo", "trl_gmpo")
PRECISIONS = ("float32", "bf16")
#: the GEMMs the dtype census counts (what autocast leaves at the kernels)
_GEMMS = ("mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_")


def completion_text(entry: dict[str, Any]) -> str:
    """A fixed reply to a chat_chain_sum question: sentences around the answer, as the untrained
    model writes them (the same text for every trainer)."""
    expr, answer = entry["metadata"]["expression"], entry["answer"]
    return (
        f"To find the answer, I work through {expr} one term at a time: {expr} = {answer}. "
        f"So the final answer is {answer}."
    )


def real_batch(
    tokenizer: Any, entries: list[dict[str, Any]], generations: int, completion: int, seed: int
) -> dict[str, Any]:
    """TRL's rows for ``entries`` (each prompt ``generations`` times): the chat template's
    prompt, left-padded, and a fixed completion (:func:`completion_text` and EOS, cut at
    ``completion`` tokens, right-padded), with TRL's masks and one N(0, 1) advantage per row."""
    import torch

    from gmpo_tasks.chat_chain_sum import TASK

    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts, completions = [], []
    for e in entries:
        text = tokenizer.apply_chat_template(
            TASK.messages(e), add_generation_prompt=True, tokenize=False
        )
        p = tokenizer(text, add_special_tokens=False).input_ids
        c = [*tokenizer(completion_text(e), add_special_tokens=False).input_ids, eos]
        prompts += [p] * generations
        completions += [c[:completion]] * generations
    width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    prompt_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    completion_ids = torch.tensor([c + [pad] * (completion - len(c)) for c in completions])
    completion_mask = torch.tensor(
        [[1] * len(c) + [0] * (completion - len(c)) for c in completions]
    )
    g = torch.Generator().manual_seed(seed)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.randn(len(prompts), generator=g),
        # GRPOTrainer's token count of the generation batch (its DAPO loss divides by it)
        "num_items_in_batch": completion_mask.sum(),
    }


def clocks() -> tuple[float, float]:
    """(process CPU time, wall time): with one torch thread the process's CPU time is the step's
    own work, which other processes on the same cores do not inflate; the wall time is kept."""
    return time.process_time(), time.perf_counter()


class HeadClock:
    """Time spent in the LM head (CPU and wall), by phase of the step: each head call's forward
    (the patched function, timed around the call) and its backward (pre- and post-hooks on the
    head's own autograd node: on the CPU the engine runs one node at a time on the calling
    thread)."""

    def __init__(self) -> None:
        self.phase = "idle"
        self.seconds: dict[str, float] = {}  # CPU
        self.wall: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.inside = False  # read by the dtype census
        self.seen: dict[str, Any] = {}  # what the first head call saw (dtypes, autocast)

    def reset(self) -> None:
        self.seconds, self.wall, self.calls = {}, {}, {}

    def _add(self, phase: str, start: tuple[float, float]) -> None:
        cpu, wall = clocks()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + cpu - start[0]
        self.wall[phase] = self.wall.get(phase, 0.0) + wall - start[1]
        self.calls[phase] = self.calls.get(phase, 0) + 1

    def timed(self, fn: Any, name: str) -> Any:
        import torch

        def head(*a: Any, **k: Any) -> Any:
            if not self.seen:
                hidden, weight = a[0], a[1]
                self.seen = {
                    "function": name,
                    "hidden_dtype": str(hidden.dtype),
                    "weight_dtype": str(weight.dtype),
                    "autocast": torch.is_autocast_enabled("cpu"),
                    "autocast_dtype": str(torch.get_autocast_dtype("cpu")),
                }
            self.inside = True
            start = clocks()
            try:
                out = fn(*a, **k)
            finally:
                self._add(self.phase, start)
                self.inside = False
            self._hook(out)
            return out

        return head

    def _hook(self, out: Any) -> None:
        import torch

        tensors = [t for t in out if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        if not tensors:
            return  # the no-grad scoring pass
        # the head's own node: the first custom autograd Function below its output
        queue, node = [tensors[0].grad_fn], None
        while queue:
            n = queue.pop(0)
            if isinstance(n, torch.autograd.function.BackwardCFunction):
                node = n
                break
            queue += [m for m, _ in n.next_functions if m is not None]
        if node is None:
            raise RuntimeError("no autograd Function under the LM head's output")
        start: list[tuple[float, float]] = []

        def pre(_grads: Any) -> None:
            self.inside = True
            start.append(clocks())

        def post(_grads_in: Any, _grads_out: Any) -> None:
            self._add("backward", start.pop())
            self.inside = False

        node.register_prehook(pre)
        node.register_hook(post)

    def install(self) -> None:
        """Time every LM-head call of the trainers: TRL's ``ChunkedLogProbFunction.apply``
        (GRPOTrainer's fused forward, and gmpo_trl's fallback) and gmpo_trl's
        ``token_logprobs`` (``gmpo_lm_head=True``)."""
        import trl.trainer.utils as trl_utils

        import gmpo_trl.head_swap as head_swap

        trl_head = trl_utils._ChunkedLogProbFunction
        trl_head.apply = staticmethod(self.timed(trl_head.apply, "trl ChunkedLogProbFunction"))
        head_swap.token_logprobs = self.timed(head_swap.token_logprobs, "gmpo_core token_logprobs")


def dtype_census(clock: HeadClock) -> tuple[Any, dict[str, dict[str, float]]]:
    """A dispatch mode that counts what reaches the kernels: GEMM GFLOP by dtype, in and out of
    the LM head, and the attention kernels' calls by dtype (below autocast: what ran)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    counts: dict[str, dict[str, float]] = {}

    def add(key: str, dtype: Any, amount: float) -> None:
        row, name = counts.setdefault(key, {}), str(dtype).replace("torch.", "")
        row[name] = row.get(name, 0.0) + amount

    class Census(TorchDispatchMode):  # type: ignore[misc]
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            name = func.overloadpacket.__name__
            if name in _GEMMS:
                a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
                # a: (..., m, k), b: (..., k, n): 2 m k n (times the batch) multiply-adds
                flops = 2.0 * a.numel() * b.shape[-1]
                add("head GEMM GFLOP" if clock.inside else "other GEMM GFLOP", a.dtype, flops / 1e9)
            elif "attention" in name:
                add(f"{name} calls", args[0].dtype, 1)
            return func(*args, **(kwargs or {}))

    return Census(), counts


def _real_trainer(args: argparse.Namespace, model: Any, tokenizer: Any, out_dir: str) -> Any:
    from gmpo_tasks.chat_chain_sum import TASK

    kwargs = TASK.trainer_args(
        out_dir,
        seed=args.seed,
        per_device_train_batch_size=args.batch,
        num_generations=args.generations,
        max_completion_length=args.completion,
        use_cpu=True,
        bf16=args.precision == "bf16",
    )
    if args.variant == "gmpo":
        from gmpo_trl import GMPOConfig as Config
        from gmpo_trl import GMPOTrainer as Trainer
    elif args.variant == "grpo":
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer
    else:
        from trl.experimental.gmpo import GMPOConfig as Config
        from trl.experimental.gmpo import GMPOTrainer as Trainer
    dataset = TASK.dataset(args.seed, n=args.batch)
    return Trainer(
        model=model,
        reward_funcs=TASK.reward,
        args=Config(**kwargs),
        train_dataset=dataset,
        processing_class=tokenizer,
    )


def real_child(args: argparse.Namespace) -> dict[str, Any]:
    """One trainer (``args.variant``) in one precision: warmup steps, then timed steps of
    scoring the old log-probs, the loss, its backward and the optimizer step."""
    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmpo_tasks import pretrained
    from gmpo_tasks.chat_chain_sum import TASK

    clock = HeadClock()
    clock.install()
    t_setup = time.perf_counter()
    path = pretrained.resolve(args.model) if args.model in pretrained.MODELS else args.model
    tokenizer = AutoTokenizer.from_pretrained(path)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tmp = tempfile.mkdtemp(prefix="out_", dir=os.path.dirname(os.path.abspath(args.save)))
    trainer = _real_trainer(args, model, tokenizer, tmp)
    optimizer = trainer.create_optimizer()
    prompts = args.batch // args.generations
    batch = real_batch(
        tokenizer,
        TASK.entries(prompts, seed=f"bench:{args.seed}"),
        args.generations,
        args.completion,
        args.seed + 1,
    )
    model.train()
    trainer.current_gradient_accumulation_steps = 1  # as Trainer.train sets it
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    max_norm = trainer.args.max_grad_norm
    out: dict[str, Any] = {
        "setup_s": time.perf_counter() - t_setup,
        "params": sum(p.numel() for p in model.parameters()),
        "model_config": {
            "architecture": type(model).__name__,
            "vocab_size": model.config.vocab_size,
            "hidden_size": model.config.hidden_size,
            "num_hidden_layers": model.config.num_hidden_layers,
            "tie_word_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
        },
        "threads": torch.get_num_threads(),
        "trainer": f"{type(trainer).__module__}.{type(trainer).__name__}",
        "loss_type": trainer.loss_type,
        "optimizer": f"{type(optimizer).__name__} "
        + json.dumps(
            {k: v for k, v in optimizer.defaults.items() if k in ("lr", "fused", "foreach")}
        ),
        "max_grad_norm": None if max_norm is None else float(max_norm),
        "learning_rate": trainer.args.learning_rate,
        "num_iterations": trainer.args.num_iterations,
        "mixed_precision": str(trainer.accelerator.mixed_precision),
        "native_amp": bool(trainer.accelerator.native_amp),
        "prompt_tokens": int(batch["prompt_ids"].shape[1]),
        "completion_tokens_valid": int(batch["completion_mask"].sum()),
        "positions_per_row": int(input_ids.shape[1]),
    }

    def step() -> tuple[list[tuple[float, float]], Any, Any]:
        """One step: the clocks at the start and after each phase, the loss, the old log-probs."""
        marks = [clocks()]
        clock.phase = "scoring"
        with torch.no_grad():  # GRPOTrainer's old log-probs (num_iterations > 1)
            old, _, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, input_ids, attention_mask, args.completion, batch_size=args.batch
            )
        marks.append(clocks())
        clock.phase = "forward"
        loss = trainer.compute_loss(model, {**batch, "old_per_token_logps": old})
        marks.append(clocks())
        clock.phase = "backward"
        trainer.accelerator.backward(loss)
        marks.append(clocks())
        clock.phase = "optimizer"
        if max_norm is not None and max_norm > 0:
            trainer.accelerator.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(clocks())
        clock.phase = "idle"
        return marks, loss.detach(), old

    # warmup: the first step creates the optimizer state; it runs under the dtype census and
    # its scoring pass (the initial weights, the same in every child) is saved for the parent
    census, counts = dtype_census(clock)
    for rep in range(args.warmup):
        if rep == 0:
            with census:
                _, loss, old = step()
            torch.save(
                {"old_logps": old.float(), "loss": loss.float(), "mask": batch["completion_mask"]},
                args.save,
            )
            out["warmup_loss"] = float(loss)
        else:
            step()
    out["dtype_census"] = counts
    out["head_seen"] = clock.seen
    names = ("scoring", "forward", "backward", "optimizer")
    record: dict[str, list[Any]] = {
        key: []
        for key in (
            "cpu_seconds",
            "wall_seconds",
            "cpu_phases",
            "wall_phases",
            "head_cpu_seconds",
            "head_wall_seconds",
            "peak_rss_bytes",
            "peak_extra_bytes",
        )
    }
    for _ in range(args.repeats):
        gc.collect()
        rss = reset_peak_rss()
        clock.reset()
        marks, _, _ = step()
        hwm = proc_status_kib("VmHWM")
        for i, kind in enumerate(("cpu", "wall")):
            record[f"{kind}_seconds"].append(marks[-1][i] - marks[0][i])
            record[f"{kind}_phases"].append(
                {n: marks[j + 1][i] - marks[j][i] for j, n in enumerate(names)}
            )
        record["head_cpu_seconds"].append(dict(clock.seconds))
        record["head_wall_seconds"].append(dict(clock.wall))
        record["peak_rss_bytes"].append(hwm * 1024)
        record["peak_extra_bytes"].append((hwm - rss) * 1024)
    record["head_calls"] = dict(clock.calls)
    out["step"] = record
    return out
