"""``python -m benchmarks``."""

from __future__ import annotations

from benchmarks._cli import main

# Guarded: the concurrency workload's worker processes (multiprocessing "spawn") import this
# module as __mp_main__, and must not start a benchmark run of their own.
if __name__ == "__main__":
    raise SystemExit(main())
