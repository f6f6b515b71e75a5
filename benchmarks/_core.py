"""Workload registry, the interleaved runner and the result records.

Adding a workload: subclass :class:`Workload`, set ``name``, ``summary`` and ``metrics``
(and ``backends`` / ``durabilities`` if it is not for every backend in ``sync`` mode),
implement ``params()`` and ``measure()``, and decorate the class with :func:`register`.
``measure()`` is written once against an :class:`~benchmarks._systems.Adapter` and an
:class:`~benchmarks._backends.Env` (the case: backend, durability) and runs on every system.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
import traceback
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast

from benchmarks._backends import NO_BACKEND, Env
from benchmarks._systems import BACKENDS, GRAPHEXEC, Adapter, Durability

__all__ = [
    "REGISTRY",
    "BenchmarkError",
    "Metric",
    "Sample",
    "SystemResult",
    "Timer",
    "Workload",
    "WorkloadResult",
    "cases",
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
        metrics: Values for the workload's :class:`Metric` keys; a metric that does not apply
            to the case (bytes on disk in memory) is left out.
        info: Facts about the run that are not timings (checkpoints per run, checks).
        series: Curves (equal-length lists, e.g. ``step`` and ``ms_per_step``) for plots.
    """

    metrics: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)


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
    """A named benchmark. One instance per CLI run; ``quick`` shrinks it for smoke tests.

    Class attributes besides ``name``, ``summary`` and ``metrics``:

    - ``backends``: the backends it runs on (``("none",)``: without a checkpointer);
    - ``durabilities``: the modes it is measured in, on persistent backends (in-memory
      stores always run ``sync``: there is nothing to be durable to);
    - ``warmup``: run an unmeasured batch first (pointless when every batch starts new
      processes);
    - ``max_rounds``: cap ``--repeat`` for long workloads;
    - ``in_quick``: part of the default selection with ``--quick``.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    metrics: ClassVar[tuple[Metric, ...]]
    backends: ClassVar[tuple[str, ...]] = BACKENDS
    durabilities: ClassVar[tuple[str, ...]] = ("sync",)
    warmup: ClassVar[bool] = True
    max_rounds: ClassVar[int | None] = None
    in_quick: ClassVar[bool] = True

    def __init__(self, *, quick: bool = False) -> None:
        self.quick = quick

    def unsupported(self, system: Adapter) -> str | None:
        """Why ``system`` cannot run this workload at all (``"unavailable: ..."``, shown as
        ``n/a``), or ``None`` when it can."""
        return None

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The sizes this instance runs with (recorded in the output)."""

    @abstractmethod
    async def measure(self, system: Adapter, env: Env) -> Sample:
        """Build a fresh graph and store (untimed), run one timed batch, check the results.

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

    def median(self, key: str) -> float | None:
        """Median of ``key`` over the rounds that measured it (``None`` if none did)."""
        values = [s.metrics[key] for s in self.samples if key in s.metrics]
        return statistics.median(values) if values else None

    def medians(self) -> dict[str, float]:
        keys = dict.fromkeys(k for s in self.samples for k in s.metrics)
        return {key: m for key in keys if (m := self.median(key)) is not None}

    def series(self) -> dict[str, list[float]]:
        """Each curve's point-by-point median over the rounds (rounds of equal length)."""
        out: dict[str, list[float]] = {}
        for key in self.samples[0].series:
            curves = [s.series[key] for s in self.samples if key in s.series]
            length = min(len(c) for c in curves)
            out[key] = [statistics.median(c[i] for c in curves) for i in range(length)]
        return out

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
    env: Env
    systems: dict[str, SystemResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    """System name -> why it has no figures (``failed: ...``, ``unavailable: ...``)."""

    @property
    def case(self) -> str:
        """``workload`` or ``workload/backend[/durability]``: the key in the JSON."""
        label = self.env.label
        return self.workload.name if label == "-" else f"{self.workload.name}/{label}"

    @property
    def failed(self) -> bool:
        """graphexec failed (as opposed to: its backend is unavailable here)."""
        return self.skipped.get(GRAPHEXEC, "").startswith("failed")

    def ratio(self, metric: Metric, other: str) -> float | None:
        """``other``'s median over graphexec's: above 1 means graphexec is faster."""
        if not metric.compare or GRAPHEXEC not in self.systems or other not in self.systems:
            return None
        base = self.systems[GRAPHEXEC].median(metric.key)
        theirs = self.systems[other].median(metric.key)
        if base is None or theirs is None or base <= 0:
            return None
        return theirs / base


def _one(workload: Workload, system: Adapter, env: Env) -> Sample:
    return asyncio.run(workload.measure(system, env))


def run_workload(
    workload: Workload,
    env: Env,
    systems: list[Adapter],
    *,
    repeat: int,
    progress: Callable[[str], None],
) -> WorkloadResult:
    """Warm up each system, then run rounds A B A B ... and collect the samples.

    A system that cannot run on the case's backend is reported as ``unavailable`` in
    ``skipped``; a failing system is dropped from the remaining rounds and reported there as
    ``failed``; the others carry on.
    """
    result = WorkloadResult(workload, env)
    name = result.case
    live: list[Adapter] = []
    for system in systems:
        reason = workload.unsupported(system)
        if reason is None and env.backend in BACKENDS:
            reason = system.unavailable(env.backend)
        if reason is not None:
            result.skipped[system.name] = reason
            progress(f"{name}: {system.name} {reason}")
            continue
        if workload.warmup:
            progress(f"{name}: warm-up on {system.name}")
            try:
                _one(workload, system, env)
            except Exception as e:
                result.skipped[system.name] = _failure(name, system, e, progress)
                continue
        live.append(system)
    samples: dict[str, list[Sample]] = {s.name: [] for s in live}
    rounds = min(repeat, workload.max_rounds or repeat)
    for round_no in range(1, rounds + 1):
        progress(f"{name}: round {round_no}/{rounds}")
        for system in list(live):
            try:
                samples[system.name].append(_one(workload, system, env))
            except Exception as e:
                result.skipped[system.name] = _failure(name, system, e, progress)
                live.remove(system)
                del samples[system.name]
    result.systems = {name: SystemResult(s) for name, s in samples.items()}
    return result


def _failure(case: str, system: Adapter, e: Exception, progress: Callable[[str], None]) -> str:
    progress(f"{case} failed on {system.name}:\n" + "".join(traceback.format_exception(e)).rstrip())
    return f"failed: {type(e).__name__}: {e}"


def cases(
    workload: Workload,
    backends: Sequence[str],
    durabilities: Sequence[str],
    *,
    tmp: Path,
    dsn: str | None = None,
    synchronous: str | None = None,
    prepare: bool = False,
) -> list[Env]:
    """The cases ``workload`` runs as: one per selected backend it supports and, on persistent
    backends, one per selected durability mode it is measured in.

    In-memory stores run ``sync`` only. A workload measured in ``sync`` only runs in ``sync``
    whatever modes are selected (its point is not the mode). Backends follow the workload's
    order, modes the selection's order.
    """
    out: list[Env] = []
    for backend in workload.backends:
        if backend == NO_BACKEND:
            out.append(Env(NO_BACKEND, "sync", tmp))
            continue
        if backend not in backends:
            continue
        if backend == "memory":
            out.append(Env(backend, "sync", tmp, dsn, synchronous, prepare))
            continue
        modes = [m for m in durabilities if m in workload.durabilities]
        if len(workload.durabilities) == 1:
            modes = list(workload.durabilities)
        for mode in modes:
            out.append(
                Env(
                    backend,
                    cast(Durability, mode),
                    tmp,
                    dsn,
                    synchronous,
                    prepare,
                    label_durability=True,
                )
            )
    return out
