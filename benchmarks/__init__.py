"""Benchmarks for graphexec, compared with LangGraph on the same workloads.

Run ``python -m benchmarks --help``. Results go to ``benchmarks/results/`` (not committed).
To add a workload, subclass :class:`Workload` in ``benchmarks/workloads.py`` and decorate it
with :func:`register`.
"""

from __future__ import annotations

from benchmarks import _concurrency, _growth, _workers, workloads
from benchmarks._core import REGISTRY, BenchmarkError, Metric, Sample, Workload, register

__all__ = [
    "REGISTRY",
    "BenchmarkError",
    "Metric",
    "Sample",
    "Workload",
    "_concurrency",
    "_growth",
    "_workers",
    "register",
    "workloads",
]
