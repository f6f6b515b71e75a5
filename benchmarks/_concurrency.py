"""The ``concurrency`` workload: several processes on one SQLite file or PostgreSQL database.

Each batch starts ``workers`` fresh processes (``spawn``), each builds its system's adapter and
then waits at a barrier; the clock starts when the barrier opens. Then every process opens its
checkpointer on the same brand-new file or database (a cold start: the schema does not exist
yet, so the processes race to create it) and runs the 10-node chain ``runs`` times, each on its
own thread. A failed run is recorded, not raised: errors are data here (LangGraph's SQLite saver
is expected to hit "database is locked").
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import threading
import time
from collections import Counter
from typing import Any

from benchmarks._backends import Env
from benchmarks._core import BenchmarkError, Metric, Sample, Workload, register
from benchmarks._systems import Adapter, Location, adapter_by_name, error_text
from benchmarks.workloads import PERSISTENT, build_chain

__all__ = ["ConcurrencyWorkload"]

_LOCKED = "database is locked"
_START_TIMEOUT = 120.0
_RUN_TIMEOUT = 900.0


async def _work(system: Adapter, where: Location, runs: int, index: int) -> dict[str, Any]:
    ok = 0
    errors: list[str] = []
    try:
        async with system.open_store(where) as store:
            graph = build_chain(system, store)
            for i in range(runs):
                try:
                    out = await system.ainvoke(
                        graph, {"n": 0, "log": []}, thread_id=f"w{index}-{i}"
                    )
                except Exception as e:
                    errors.append(error_text(e))
                else:
                    if out.get("n") == 10:
                        ok += 1
                    else:
                        errors.append(f"wrong result: n={out.get('n')!r}")
    except Exception as e:  # opening or closing the store failed
        text = "store: " + error_text(e)
        errors += [text] * max(0, runs - ok - len(errors))
        if not errors:
            errors.append(text)
    return {"ok": ok, "errors": errors}


def worker_main(
    system_name: str,
    where: Location,
    runs: int,
    index: int,
    barrier: threading.Barrier,
    results: multiprocessing.Queue[dict[str, Any]],
) -> None:
    """Body of one worker process (module level, so ``spawn`` can import it)."""
    try:
        system = adapter_by_name(system_name)
        barrier.wait(_START_TIMEOUT)
        outcome = asyncio.run(_work(system, where, runs, index))
    except BaseException as e:
        outcome = {"ok": 0, "errors": ["worker: " + error_text(e)] * runs}
    outcome["end"] = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    results.put(outcome)


def _run_processes(system: Adapter, where: Location, workers: int, runs: int) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    results: multiprocessing.Queue[dict[str, Any]] = ctx.Queue()
    procs = [
        ctx.Process(
            target=worker_main,
            args=(system.name, where, runs, i, barrier, results),
            name=f"bench-{system.name}-{i}",
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        barrier.wait(_START_TIMEOUT)
        start = time.perf_counter()
        outcomes = [results.get(timeout=_RUN_TIMEOUT) for _ in procs]
    except (threading.BrokenBarrierError, queue.Empty) as e:
        raise BenchmarkError(
            f"{system.name}: worker processes did not start or finish: {e!r}"
        ) from e
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return {
        "wall": max(o["end"] for o in outcomes) - start,
        "ok": sum(o["ok"] for o in outcomes),
        "errors": [e for o in outcomes for e in o["errors"]],
    }


@register
class ConcurrencyWorkload(Workload):
    name = "concurrency"
    summary = (
        "4 processes start at once on one new SQLite file / PostgreSQL database (cold start), "
        "each running the 10-node chain 25 times on its own threads; errors are counted"
    )
    metrics = (
        Metric("wall_s", "wall s, all processes", digits=2),
        Metric("runs_per_s", "successful runs / s", compare=False, digits=1),
        Metric("errors", "failed runs", compare=False, digits=0),
        Metric("locked", 'failed with "database is locked"', compare=False, digits=0),
    )
    backends = PERSISTENT
    warmup = False  # every batch starts new processes: there is nothing to warm up
    workers = 4

    def params(self) -> dict[str, Any]:
        return {"processes": self.workers, "runs_per_process": 5 if self.quick else 25}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        runs = self.params()["runs_per_process"]
        async with env.storage(self.name) as storage:
            done = await asyncio.to_thread(
                _run_processes, system, storage.where, self.workers, runs
            )
        errors: list[str] = done["errors"]
        kinds = Counter(" ".join(e.split())[:300] for e in errors)
        info: dict[str, Any] = {"successful runs": f"{done['ok']}/{self.workers * runs}"}
        if kinds:
            info["errors seen"] = "; ".join(f"{n}x {text}" for text, n in kinds.most_common(3))
        return Sample(
            {
                "wall_s": done["wall"],
                "runs_per_s": done["ok"] / done["wall"],
                "errors": float(len(errors)),
                "locked": float(sum(_LOCKED in e.lower() for e in errors)),
            },
            info,
        )
