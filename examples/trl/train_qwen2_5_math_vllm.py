"""GMPO on Qwen2.5-Math-1.5B with vLLM generation: a real GPU run (NOT run in CI).

The paper's zero-RL math setting at a size one node handles: MATH (Lighteval's copy) prompts,
a verifiable accuracy reward (``math_verify``), GMPO's clip range e^±0.4, no KL (beta = 0),
vLLM for generation with its importance-sampling correction (GRPOConfig's default
``vllm_importance_sampling_mode="sequence_mask"``, which GMPO applies as a row weight).

Needs: a CUDA machine, ``pip install -e ".[trl]" vllm math-verify`` in a clone of this
repository, and the hub.
See ``run.sh`` beside this file for the colocate and server commands.
"""

from __future__ import annotations

from datasets import load_dataset
from trl import TrlParser
from trl.rewards import accuracy_reward

from gmpo_trl import GMPOConfig, GMPOTrainer

MODEL = "Qwen/Qwen2.5-Math-1.5B"
DATASET = "DigitalLearningGmbH/MATH-lighteval"
SYSTEM = (
    "A conversation between User and Assistant. The user asks a math question, and the "
    "Assistant solves it step by step and puts the final answer in \\boxed{}."
)


def to_prompt(example: dict) -> dict:
    return {
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": example["problem"]},
        ]
    }


def main() -> None:
    defaults = dict(
        output_dir="runs/qwen2.5-math-1.5b-gmpo",
        epsilon=0.4,  # log space: token ratios clipped to (e^-0.4, e^0.4), the paper's default
        beta=0.0,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        per_device_train_batch_size=16,
        gradient_accumulation_steps=4,
        num_generations=8,
        max_completion_length=1024,
        temperature=1.0,
        num_iterations=1,
        bf16=True,
        gradient_checkpointing=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.3,
        logging_steps=1,
        save_steps=100,
        max_steps=500,
        report_to=["tensorboard"],
    )
    parser = TrlParser(GMPOConfig)
    parser.set_defaults_with_config(**defaults)
    (args,) = parser.parse_args_and_config()
    dataset = load_dataset(DATASET, split="train").map(to_prompt)
    trainer = GMPOTrainer(
        model=MODEL, reward_funcs=accuracy_reward, args=args, train_dataset=dataset
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
