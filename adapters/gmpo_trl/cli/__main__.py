"""``python -m gmpo_trl.cli``: the ``gmpo`` command."""

from gmpo_trl.cli import main

raise SystemExit(main())
