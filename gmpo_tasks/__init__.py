"""gmpo_tasks: the built-in tasks, their models and warm start, the loss variants and the study's
rules, in plain torch (transformers and datasets are imported only to build a model or a dataset;
TRL never).

- :mod:`gmpo_tasks.registry`: ``TASKS``, the one list of tasks (``gmpo --task``, the tests);
- a module per task: :mod:`gmpo_tasks.successor` (the toy run), :mod:`gmpo_tasks.reverse`
  (reverse 16 digits: docs/study.md's task and setting);
- :mod:`gmpo_tasks.chars` (the alphabet and the character tokenizer), :mod:`gmpo_tasks.models`
  (the tiny models), :mod:`gmpo_tasks.warm_start` (the supervised warm start and its settings);
- :mod:`gmpo_tasks.variants`: the loss variants (docs/recipes.md's recipes and the study's
  methods, by name);
- :mod:`gmpo_tasks.rules`: the collapse rule and the sign test (docs/study.md).
"""
