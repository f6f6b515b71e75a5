"""The ``loop-growth`` workload and its plot: how a long thread's costs grow with its length.

The loop workload's graph runs in segments of ``every`` steps (the route ends the run when the
message count is a multiple of ``every``; the next invoke, with an empty update, continues the
thread). After each segment, untimed: the bytes on disk (SQLite: after
``wal_checkpoint(TRUNCATE)``) and the latest-state read time (median of 5 ``aget_state``). The
per-step time of a segment is the mean gap between consecutive node starts inside it, so the
invokes' own start-up is not in it.

:func:`write_growth` saves the curves as JSON and, when matplotlib imports, as a PNG.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._backends import Env
from benchmarks._core import Metric, Sample, Workload, WorkloadResult, register
from benchmarks._systems import Adapter
from benchmarks.workloads import (
    DISK_METRICS,
    PERSISTENT,
    build_loop,
    check,
    check_loop,
    median_ms,
    opened,
    thread_ids,
)

__all__ = ["LoopGrowthWorkload", "plot_growth", "write_growth"]


@register
class LoopGrowthWorkload(Workload):
    name = "loop-growth"
    summary = (
        "the loop workload in segments of 50 steps; after each: bytes on disk and "
        "latest-state read time; curves saved to loop_growth.json / .png"
    )
    metrics = (
        Metric("first_decile_ms", "ms / step, first decile"),
        Metric("last_decile_ms", "ms / step, last decile"),
        Metric("growth", "step growth (last / first decile)", compare=False, digits=2),
        Metric("read_first_ms", "aget_state ms, first decile"),
        Metric("read_last_ms", "aget_state ms, last decile"),
        Metric("read_growth", "read growth (last / first decile)", compare=False, digits=2),
        *DISK_METRICS,
    )
    backends = PERSISTENT
    max_rounds = 3
    every = 50
    payload = 200

    def params(self) -> dict[str, Any]:
        return {
            "steps": 200 if self.quick else 1000,
            "sample_every": self.every,
            "message_bytes": self.payload,
        }

    async def measure(self, system: Adapter, env: Env) -> Sample:
        steps = self.params()["steps"]
        every = self.every
        series: dict[str, list[float]] = {"step": [], "ms_per_step": [], "disk_bytes": []}
        series["read_ms"] = []
        gaps: list[float] = []
        async with opened(system, env, self.name) as (storage, store):
            graph, stamps = build_loop(system, store, steps, every=every, size=self.payload)
            (thread_id,) = thread_ids(1)

            async def read() -> None:
                await system.get_state(graph, thread_id)

            out: dict[str, Any] = {}
            for done in range(every, steps + 1, every):
                before = len(stamps)
                out = await system.ainvoke(
                    graph,
                    {"msgs": []},
                    thread_id=thread_id,
                    durability=env.durability,
                    recursion_limit=every + 10,
                )
                segment = [b - a for a, b in itertools.pairwise(stamps[before:])]
                check(system, len(segment) == every - 1, f"a segment ran {len(segment) + 1} steps")
                gaps += segment
                series["step"].append(float(done))
                series["ms_per_step"].append(statistics.mean(segment) * 1000)
                series["read_ms"].append(await median_ms(read, 5))
                size = await storage.bytes_on_disk()
                series["disk_bytes"].append(float(size or 0))
            check_loop(system, out, steps, self.payload)
        decile = max(1, len(gaps) // 10)
        first = statistics.mean(gaps[:decile]) * 1000
        last = statistics.mean(gaps[-decile:]) * 1000
        # Reads are sampled after every segment: a decile of the run is a tenth of the samples
        # (two of twenty), as for the step times, rather than one ~0.1 ms sample at each end.
        reads = series["read_ms"]
        sampled = max(1, len(reads) // 10)
        read_first = statistics.mean(reads[:sampled])
        read_last = statistics.mean(reads[-sampled:])
        raw = steps * self.payload
        return Sample(
            {
                "first_decile_ms": first,
                "last_decile_ms": last,
                "growth": last / first,
                "read_first_ms": read_first,
                "read_last_ms": read_last,
                "read_growth": read_last / read_first,
                "disk_kib": series["disk_bytes"][-1] / 1024,
                "disk_ratio": series["disk_bytes"][-1] / raw,
            },
            {"raw content KiB": round(raw / 1024)},
            series,
        )


def _curves(results: Sequence[WorkloadResult]) -> list[dict[str, Any]]:
    out = []
    for result in results:
        for system, r in result.systems.items():
            out.append(
                {
                    "system": system,
                    "backend": result.env.backend,
                    "durability": result.env.durability,
                    "rounds": len(r.samples),
                    **r.series(),
                }
            )
    return out


def write_growth(
    results: Sequence[WorkloadResult], directory: Path, meta: dict[str, Any]
) -> list[Path]:
    """Write ``loop_growth.json`` (and ``loop_growth.png`` if matplotlib imports).

    Returns:
        The files written (none when no ``loop-growth`` case ran).
    """
    growth = [r for r in results if r.workload.name == LoopGrowthWorkload.name and r.systems]
    if not growth:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    curves = _curves(growth)
    params = growth[0].workload.params()
    data = {"meta": meta, "params": params, "curves": curves}
    json_path = directory / "loop_growth.json"
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    written = [json_path]
    png = plot_growth(curves, params, directory / "loop_growth.png")
    if png is not None:
        written.append(png)
    return written


def plot_growth(curves: list[dict[str, Any]], params: dict[str, Any], path: Path) -> Path | None:
    """Three panels against step number: per-step time, bytes on disk, read time.

    Returns:
        ``path``, or ``None`` when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(3, 1, figsize=(9, 11), sharex=True)
    styles = {"graphexec": "-", "langgraph": "--"}
    for curve in curves:
        label = f"{curve['system']} ({curve['backend']}, {curve['durability']})"
        style = styles.get(curve["system"], ":")
        steps = curve["step"]
        axes[0].plot(steps, curve["ms_per_step"], style, marker="o", ms=3, label=label)
        mib = [b / 2**20 for b in curve["disk_bytes"]]
        axes[1].plot(steps, mib, style, marker="o", ms=3, label=label)
        axes[2].plot(steps, curve["read_ms"], style, marker="o", ms=3, label=label)
    if curves:
        steps = curves[0]["step"]
        raw = [s * params["message_bytes"] / 2**20 for s in steps]
        axes[1].plot(steps, raw, ":", color="grey", label="raw content written")
    # Log scales: the systems differ by an order of magnitude or more, and on a log scale a
    # flat curve is flat and equal growth factors look alike for both.
    axes[0].set_ylabel("ms per step (log)\nmean of the 50 steps before")
    axes[1].set_ylabel("MiB on disk (log)")
    axes[2].set_ylabel("latest-state read, ms (log)\nmedian of 5 aget_state")
    axes[2].set_xlabel("step (messages in the thread)")
    for ax in axes:
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"loop: one ~{params['message_bytes']}-byte message appended per step, "
        f"{params['steps']} steps, sampled every {params['sample_every']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
