"""gmpo_tasks: the built-in tasks, their models and warm start, in plain torch (transformers and
datasets are imported only to build a model or a dataset; TRL never).

- :mod:`gmpo_tasks.task`: ``Task``, what a task is, for ``gmpo --task`` and the stability study
  alike; :mod:`gmpo_tasks.catalog`: ``TASKS``, the one list of tasks;
- a module per task: :mod:`gmpo_tasks.successor` (the toy run), :mod:`gmpo_tasks.reverse`
  (reverse 16 digits: docs/study.md's task and setting), :mod:`gmpo_tasks.add` (add two
  numbers);
- :mod:`gmpo_tasks.chars` (the characters and the character tokenizer), :mod:`gmpo_tasks.models`
  (the tiny models), :mod:`gmpo_tasks.warm_start` (the supervised warm start and its settings).

The loss variants are ``gmpo_variants``'; the rules that judge runs, ``gmpo_stats``'.
"""
