"""Screening chat_arith's configurations: the untrained model's held-out reward of each, on the
held-out questions of calibration seed 900 only (32 prompts x 4 samples, temperature 1, up to 32
tokens), sampled by the held-out evaluation's code. Generation only.

    python -m studies.real_model.screen_arith 2:1:3 2:2:3 3:1:2

Each argument is ``terms:min_digits:max_digits``; prints one JSON line a configuration
(results/real-model/calibration_chat_arith.md).
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmpo_tasks import pretrained
    from gmpo_tasks.chat_arith import ChatArithTask
    from gmpo_trl.cli.held_out import held_out_reward

    configs = [tuple(int(x) for x in a.split(":")) for a in (argv or sys.argv[1:] or ["2:1:3"])]
    torch.set_num_threads(1)
    path = pretrained.resolve("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    for terms, lo, hi in configs:
        task = ChatArithTask(length=terms, min_digits=lo, max_digits=hi)
        t0 = time.monotonic()
        entries = task.held_out(32, seed="calibration:900")
        r = held_out_reward(model, tok, task, entries=entries, samples=4, max_tokens=32,
                            temperature=1.0)  # fmt: skip
        print(json.dumps({"terms": terms, "digits": [lo, hi], "space": task.questions(), **r,
                          "seconds": time.monotonic() - t0}), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
