"""``python -m gmpo_trl.cli``: the ``gmpo`` command."""

from gmpo_trl.cli import main

if __name__ == "__main__":  # importing this module (a scan of the package) runs nothing
    raise SystemExit(main())
