"""The off-policy study (docs/offpolicy_plan.md): GMPO against TRL's default loss where the clip
acts, on SmolLM2-135M-Instruct through TRL and on the tiny model's ``chain_sum``.

- :mod:`~studies.offpolicy.design`: the plan's fixed settings and rules (seeds, rates, the rate
  rule, the minimum detectable difference, the verdict);
- :mod:`~studies.offpolicy.budget`: each part's estimated cost and the cumulative budget rule;
- :mod:`~studies.offpolicy.one`: one run on the real model, in a process of its own, and its
  record;
- :mod:`~studies.offpolicy.real`: the real model's pilot, rates, grid and 1-update arm;
- :mod:`~studies.offpolicy.tiny`: the tiny model's ``chain_sum`` part;
- :mod:`~studies.offpolicy.analyze`: the planned analysis;
- ``python -m studies.offpolicy STEP``: each step (``--dry-run`` prints its commands only).
"""
