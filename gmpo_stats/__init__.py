"""gmpo_stats: how runs are judged and compared, in the standard library only. The stability
study's tables, its planned analyses and ``gmpo compare``'s summary read these rules.

- :mod:`gmpo_stats.outcome`: a run's final and peak reward, the collapse rule and the failure
  rule;
- :mod:`gmpo_stats.paired`: paired comparisons on the same seeds: the exact sign test, Holm's
  adjustment.
"""
