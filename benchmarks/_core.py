"""Workload registry, the interleaved runner and the result records.

Adding a workload: subclass :class:`Workload`, set ``name``, ``summary`` and ``metrics``,
implement ``params()`` and ``measure()``, and decorate the class with :func:`register`.
``measure()`` is written once against an :class:`~benchmarks._systems.Adapter` and runs on
every system.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from benchmarks._systems import GRAPHEXEC, Adapter

__all__ = [
    "REGISTRY",
    "BenchmarkError",
    "Metric",
    "Sample",
    "SystemResult",
    "Timer",
    "Workload",
    "WorkloadResult",
    "register",
    "run_workload",
]


class BenchmarkError(Exception):
    """A workload produced a wrong result, so its timing means nothing."""


@dataclass(frozen=True, slots=True)
class Metric:
    """A measured number; the table shows each system's median over the rounds.

    Attributes:
        key: Key in :attr:`Sample.metrics` and in the JSON.
        label: Human label, with its unit.
        compare: Show the ratio LangGraph/graphexec (all metrics are lower-is-better).
        digits: Decimals to print.
    """

    key: str
    label: str
    compare: bool = True
    digits: int = 3


@dataclass(slots=True)
class Sample:
    """One measured batch on one system.

    Attributes:
        metrics: Values for the workload's :class:`Metric` keys.
        info: Facts about the run that are not timings (checkpoints per run, checks).
    """

    metrics: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)


class Timer:
    """``perf_counter`` around a block, after a full collection so earlier garbage is not billed."""

    def __init__(self) -> None:
        self.start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Timer:
        gc.collect()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


class Workload(ABC):
    """A named benchmark. One instance per CLI run; ``quick`` shrinks it for smoke tests."""

    name: ClassVar[str]
    summary: ClassVar[str]
    metrics: ClassVar[tuple[Metric, ...]]

    def __init__(self, *, quick: bool = False) -> None:
        self.quick = quick

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The sizes this instance runs with (recorded in the output)."""

    @abstractmethod
    async def measure(self, system: Adapter) -> Sample:
        """Build a fresh graph (untimed), run one timed batch, and check the results.

        Raises:
            BenchmarkError: the system returned a wrong result.
        """


REGISTRY: dict[str, type[Workload]] = {}

W = TypeVar("W", bound=type[Workload])


def register(cls: W) -> W:
    """Class decorator adding a workload to :data:`REGISTRY` under its ``name``."""
    if cls.name in REGISTRY:
        raise ValueError(f"workload {cls.name!r} is registered twice")
    REGISTRY[cls.name] = cls
    return cls


@dataclass(slots=True)
class SystemResult:
    """All rounds of one workload on one system."""

    samples: list[Sample]

    def median(self, key: str) -> float:
        return statistics.median(s.metrics[key] for s in self.samples)

    def medians(self) -> dict[str, float]:
        return {key: self.median(key) for key in self.samples[0].metrics}

    def info(self) -> dict[str, Any]:
        """Facts from the rounds: the value when all rounds agree, else every round's value."""
        out: dict[str, Any] = {}
        for key in self.samples[-1].info:
            values = [s.info.get(key) for s in self.samples]
            out[key] = values[0] if all(v == values[0] for v in values) else values
        return out


@dataclass(slots=True)
class WorkloadResult:
    """One workload across systems."""

    workload: Workload
    systems: dict[str, SystemResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """System name -> why it has no figures."""

    @property
    def failed(self) -> bool:
        return GRAPHEXEC not in self.systems

    def ratio(self, metric: Metric, other: str) -> float | None:
        """``other``'s median over graphexec's: above 1 means graphexec is faster."""
        if not metric.compare or GRAPHEXEC not in self.systems or other not in self.systems:
            return None
        base = self.systems[GRAPHEXEC].median(metric.key)
        if base <= 0:
            return None
        return self.systems[other].median(metric.key) / base


def _one(workload: Workload, system: Adapter) -> Sample:
    return asyncio.run(workload.measure(system))


def run_workload(
    workload: Workload,
    systems: list[Adapter],
    *,
    repeat: int,
    progress: Callable[[str], None],
) -> WorkloadResult:
    """Warm up each system, then run rounds A B A B ... and collect the samples.

    A failing system is dropped from the remaining rounds and reported in ``skipped``;
    the others carry on.
    """
    result = WorkloadResult(workload)
    live: list[Adapter] = []
    for system in systems:
        progress(f"{workload.name}: warm-up on {system.name}")
        try:
            _one(workload, system)
        except Exception as e:
            result.skipped[system.name] = _failure(workload, system, e, progress)
        else:
            live.append(system)
    samples: dict[str, list[Sample]] = {s.name: [] for s in live}
    for round_no in range(1, repeat + 1):
        progress(f"{workload.name}: round {round_no}/{repeat}")
        for system in list(live):
            try:
                samples[system.name].append(_one(workload, system))
            except Exception as e:
                result.skipped[system.name] = _failure(workload, system, e, progress)
                live.remove(system)
                del samples[system.name]
    result.systems = {name: SystemResult(s) for name, s in samples.items()}
    return result


def _failure(
    workload: Workload, system: Adapter, e: Exception, progress: Callable[[str], None]
) -> str:
    progress(
        f"{workload.name} failed on {system.name}:\n"
        + "".join(traceback.format_exception(e)).rstrip()
    )
    return f"failed: {type(e).__name__}: {e}"
