"""verl 0.9.1 on a CPU-only machine: what examples/verl/smoke_test_cpu.sh, tests/verl/ and
``make figures-verl`` share (README.md beside this file). Not part of the installed package;
imported from the repository root. A top-level name of its own: verl installs a top-level
``scripts`` package, which shadows a ``scripts/`` folder without an ``__init__``."""
