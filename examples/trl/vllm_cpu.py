"""GMPO with vLLM generating on the CPU (TRL's colocate mode), complete: the toy successor task's
model, tokenizer, reward and prompts come from gmpo_tasks. In the vLLM environment
(docs/vllm.md), from the repository root: python examples/trl/vllm_cpu.py [max_steps]"""

import os
import statistics
import sys
from pathlib import Path

from gmpo_tasks import successor
from gmpo_trl import GMPOConfig, GMPOTrainer

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # vLLM's KV cache in GiB (else sized from RAM)


def main(max_steps: int = 150, output_dir: str = "runs/vllm_cpu") -> GMPOTrainer:
    # a tiny random Qwen2 with one head of 32: vLLM's CPU attention takes head sizes from 32
    model, tokenizer = successor.TASK.model(seed=0, heads=1)
    init = Path(output_dir) / "init"
    model.save_pretrained(init)
    tokenizer.save_pretrained(init)
    model.name_or_path = str(init)  # vLLM builds its engine from the model's name_or_path
    args = GMPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=False,
        use_vllm=True,
        vllm_mode="colocate",  # vLLM in the trainer's process (server mode needs CUDA)
        max_steps=max_steps,
        per_device_train_batch_size=64,
        num_generations=8,  # 8 prompts x 8 completions a step
        max_completion_length=1,  # the reward reads the first character
        learning_rate=5e-3,
        lr_scheduler_type="constant",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
    )
    trainer = GMPOTrainer(
        model=model,
        reward_funcs=successor.successor_reward,  # 1 when the answer is the prompt's digit + 1
        args=args,
        train_dataset=successor.successor_dataset(),  # prompts "d="
        processing_class=tokenizer,
    )
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    first, last = statistics.mean(rewards[:10]), statistics.mean(rewards[-10:])
    print(f"mean reward: first ten steps {first:.2f}, last ten {last:.2f}")
    return trainer


if __name__ == "__main__":
    main(*map(int, sys.argv[1:2]))
