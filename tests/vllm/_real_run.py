"""The run behind ``tests/vllm/test_real_model.py``, in a process of its own: GMPOTrainer generating
with vLLM (TRL's colocate mode) on a real pretrained model for a few optimizer steps, recording what
the test asserts. ``python -m tests.vllm._real_run MODEL_DIR OUT.pt`` (from the repository root, in
the vLLM environment) writes the record with ``torch.save``:

- ``generations``: for each generation, ``tests.vllm._support.Recorder``'s row (the optimizer step,
  the trainer's and vLLM's log-probs of the sampled tokens, the mask) and the log-probs of the same
  tokens under the initial weights (``stale``: a frozen copy of the model as loaded), TRL's
  importance-sampling ratio, and vLLM's weights against the trainer's right after the generation:
  each engine parameter that has a trainer parameter of the same name and shape, compared with
  that parameter cast to the engine's dtype and with the initial weights cast likewise;
- ``losses``: for each loss step, the arguments and result of the ``gmpo_loss`` call that
  ``GMPOTrainer`` made (with the gradient of the loss in the log-probs), and the batch's TRL
  inputs it came from;
- ``args``, ``log_history``, ``seconds`` (import, build, train) and ``peak_rss_mb``.
"""

from __future__ import annotations

import copy
import os
import resource
import sys
import time
from typing import Any

#: vLLM's own CPU CI switch (``vllm/platforms/cpu.py``, ``vllm/v1/worker/cpu_worker.py``): the model
#: traced once by dynamo but run with eager kernels instead of Inductor's, and no warm-up pass.
#: Building the real model's engine took 302 s without it on two shared cores (Inductor compiling
#: 30 layers and a warm-up forward of 4096 tokens), 16 s with it; the weights, the sampling and
#: TRL's sync are the same code either way.
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")
#: one OpenMP thread, on CPU 0, for vLLM and (vLLM's worker binds the process's threads) the
#: trainer: on two cores that other jobs share, two threads decoded 13 times slower than one
#: (OpenMP's barriers wait for a thread the scheduler took away)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
_START = time.perf_counter()

import torch  # noqa: E402  (after the environment vLLM reads)

#: chat prompts (one user message each, the model's chat template renders them)
QUESTIONS = ("Name a fruit.", "Say hello to a friend.", "Name a colour.", "Count to three.")
#: each generation: 2 prompts x 4 completions of up to 12 tokens; each serves two optimizer steps
#: (num_iterations 2: the second is off-policy, so GMPO's clip acts); 3 steps, so generations come
#: before steps 0 and 2, the second after two updates. A high learning rate, so that two updates
#: move the weights well beyond bf16's rounding
RUN: dict[str, Any] = dict(
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=12,
    num_iterations=2,
    max_steps=3,
    learning_rate=1e-4,
    temperature=1.0,
    vllm_importance_sampling_correction=True,
    vllm_importance_sampling_mode="sequence_mask",  # TRL's default, stated
    vllm_importance_sampling_clip_max=3.0,
)


def brevity(completions: list[Any], **_: Any) -> list[float]:
    """Minus the reply's length in characters / 64: a spread within every group of completions,
    so that every row has an advantage."""
    return [-len(c[-1]["content"]) / 64 for c in completions]


def _engine_model(trainer: Any) -> Any:
    engine = trainer.vllm_generation.llm.llm_engine
    return engine.model_executor.driver_worker.model_runner.model


def compare_weights(engine: Any, trainer_model: Any, stale: Any) -> dict[str, Any]:
    """Each engine parameter with a trainer parameter of the same name and shape: equal to the
    trainer's (cast to the engine's dtype, as TRL's sync copies it)? How many of its elements
    differ from the initial weights cast likewise?"""
    own, initial = dict(trainer_model.named_parameters()), dict(stale.named_parameters())
    names, unequal, moved, ndim = [], [], [], []
    for name, param in engine.named_parameters():
        if name not in own or own[name].shape != param.shape:
            continue
        names.append(name)
        ndim.append(param.ndim)
        if not torch.equal(param.data, own[name].detach().to(param.dtype)):
            unequal.append(name)
        moved.append(int((param.data != initial[name].detach().to(param.dtype)).sum()))
    dtype = str(next(engine.parameters()).dtype)
    return {"names": names, "unequal": unequal, "moved": moved, "ndim": ndim, "dtype": dtype}


def main(model_dir: str, out: str) -> None:
    from datasets import Dataset

    import gmpo_kit.kl as kl  # GMPOTrainer's loss step calls gmpo_loss there
    from gmpo_trl import GMPOConfig, GMPOTrainer
    from tests.vllm._support import Recorder

    import_s = time.perf_counter() - _START
    messages = [{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS]
    args = GMPOConfig(
        output_dir=os.path.join(os.path.dirname(out), "run"),
        use_cpu=True,
        bf16=False,
        seed=0,
        gmpo_impl="plain",
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=256,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        **RUN,
    )
    start = time.perf_counter()
    trainer = GMPOTrainer(
        model=model_dir,
        reward_funcs=brevity,
        args=args,
        train_dataset=Dataset.from_list(messages * 8),
    )
    build_s = time.perf_counter() - start
    stale = copy.deepcopy(trainer.model).eval()  # the initial weights, as loaded
    engine = _engine_model(trainer)
    recorder = Recorder(trainer)
    extras: list[dict[str, Any]] = []
    recorded = trainer._generate_and_score_completions

    def generation(inputs: Any) -> Any:
        batch = recorded(inputs)
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        with torch.no_grad():
            old, _, _ = trainer._get_per_token_logps_and_entropies(
                stale, ids, mask, batch["completion_ids"].size(1)
            )
        extras.append({"stale": old, "ratio": batch["importance_sampling_ratio"].clone(),
                       "weights": compare_weights(engine, trainer.model, stale)})  # fmt: skip
        return batch

    trainer._generate_and_score_completions = generation

    losses: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    inner_loss, inner_core = trainer._compute_loss, kl.gmpo_loss

    def compute_loss(model: Any, inputs: dict[str, Any]) -> Any:
        current["inputs"] = inputs
        return inner_loss(model, inputs)

    def gmpo_loss(logp: Any, old_logp: Any, advantages: Any, mask: Any, **kw: Any) -> Any:
        result = inner_core(logp, old_logp, advantages, mask, **kw)
        (grad,) = torch.autograd.grad(result.loss, logp, retain_graph=True)
        inputs = current["inputs"]
        weights = kw.get("is_weights")
        losses.append({
            "step": trainer.state.global_step,
            "logp": logp.detach().clone(), "old": old_logp.detach().clone(),
            "adv": advantages.detach().clone(), "mask": mask.clone(),
            "is_weights": None if weights is None else weights.clone(),
            "weights_are_trls": weights is inputs.get("importance_sampling_ratio"),
            "epsilon": kw["epsilon"], "epsilon_high": kw["epsilon_high"],
            "dual_clip": kw.get("dual_clip"), "beta": kw.get("beta", 0.0),
            "loss": float(result.loss.detach()), "grad": grad.clone(),
            "inputs": {k: inputs[k].clone() for k in ("old_per_token_logps",
                       "sampling_per_token_logps", "completion_mask", "importance_sampling_ratio")},
        })  # fmt: skip
        return result

    trainer._compute_loss = compute_loss
    kl.gmpo_loss = gmpo_loss
    start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - start
    record = {
        "generations": [{**row, **extra} for row, extra in zip(recorder.rows, extras, strict=True)],
        "losses": losses,
        "args": {k: getattr(trainer.args, k) for k in RUN}
        | {"vllm_importance_sampling_clip_min": trainer.args.vllm_importance_sampling_clip_min},
        "log_history": trainer.state.log_history,
        "seconds": {"import": import_s, "build": build_s, "train": train_s},
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    torch.save(record, out)
    print(f"REAL_RUN {out}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
