"""The real model's runs (docs/real_model.md): SmolLM2-135M-Instruct (``gmpo_tasks.pretrained``)
on the chat tasks (``gmpo_tasks.chat``), on a CPU.

- :mod:`studies.real_model.untrained`: the untrained model's reward per task on the calibration
  seeds (no run trains on them);
- :mod:`studies.real_model.seeds`: ``gmpo train`` on several seeds, each run's time, peak memory
  and held-out reward before and after, and the reward curves over seeds.
"""
