"""The ``workers`` workload: draining graphexec's PostgreSQL run queue with worker processes.

Each batch gets a new database, enqueues ``runs`` runs of a 3-node chain (sync nodes, no I/O)
on distinct threads through :class:`checkpointers.queue.RunQueue`, then starts ``K`` worker
processes (``graphexec worker --concurrency 4``, so process start-up and import time are
inside the figure) and times from their start until every run is ``done``, counted by polling
the queue table. It is repeated for each ``K`` in :data:`PROCESSES`, each on its own database;
the scaling ratio is runs/s at ``K`` over runs/s at ``K = 1`` of the same round. A run that
failed or took more than one attempt (a lease expired, a run was handed back) fails the batch.

LangGraph has no equivalent here (its run queue lives in the LangGraph Platform server), so
its column shows ``n/a``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Annotated, Any, TypedDict

from benchmarks._backends import Env
from benchmarks._core import BenchmarkError, Metric, Sample, Workload, register
from benchmarks._systems import GRAPHEXEC, Adapter

__all__ = ["GRAPH_NAME", "WorkersWorkload", "chain_graph"]

GRAPH_NAME = "bench_queue_chain"
PROCESSES = (1, 2, 4)
CONCURRENCY = 4
NODES = 3
_ROOT = Path(__file__).resolve().parents[1]
_POLL = 0.01  # seconds between counts of finished runs
_RUN_TIMEOUT = 600.0
_STOP_TIMEOUT = 15.0


class QueueChainState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def _node(label: str) -> Any:
    def node(state: QueueChainState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [label]}

    return node


def chain_graph() -> Any:
    """The graph the worker processes serve (``benchmarks._workers:chain_graph``).

    Compiled without a checkpointer: the worker gives it a ``PostgresCheckpointer`` on its DSN.
    """
    from graphexec import END, START, StateGraph

    builder = StateGraph(QueueChainState)
    names = [f"step_{i}" for i in range(NODES)]
    for name in names:
        builder.add_node(name, _node(name))
    builder.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], END)
    return builder.compile(name=GRAPH_NAME)


def _spawn(dsn: str, index: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "graphexec.cli",
        "worker",
        f"{GRAPH_NAME}=benchmarks._workers:chain_graph",
        "--dsn",
        dsn,
        "--concurrency",
        str(CONCURRENCY),
        "--worker-id",
        f"bench-{index}",
    ]
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen(
        command,
        cwd=_ROOT,
        env={**os.environ, "PYTHONPATH": path},
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C at the terminal does not reach them directly
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every worker still running, wait, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_TIMEOUT
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


def _tail(log: IO[bytes], limit: int = 600) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    return " ".join(text[-limit:].split())


_COUNT = "SELECT status, count(*) FROM graphexec_runs GROUP BY status"
_TERMINAL = ("done", "interrupted", "rejected", "failed", "cancelled")
_CHECK = """
SELECT count(*),
       count(*) FILTER (WHERE status <> 'done'),
       count(*) FILTER (WHERE attempts > 1),
       count(DISTINCT worker_id),
       extract(epoch FROM max(finished_at) - min(started_at))
FROM graphexec_runs
"""


async def _drain(dsn: str, processes: int, runs: int) -> dict[str, Any]:
    """Enqueue ``runs`` runs, start ``processes`` workers, time until all are done (checked)."""
    import psycopg

    from checkpointers.queue import RunQueue

    queue = RunQueue(dsn)
    try:
        prefix = os.urandom(4).hex()
        for i in range(runs):
            await queue.enqueue(GRAPH_NAME, {"n": 0, "log": []}, thread_id=f"{prefix}-{i}")
    finally:
        await queue.aclose()

    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryFile() as log:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            try:
                start = time.perf_counter()
                procs = [_spawn(dsn, i, log) for i in range(processes)]
                counts: dict[str, int] = {}
                while True:
                    cur = await conn.execute(_COUNT)
                    counts = {str(s): int(n) for s, n in await cur.fetchall()}
                    if sum(counts.get(s, 0) for s in _TERMINAL) >= runs:
                        wall = time.perf_counter() - start
                        break
                    dead = [p.returncode for p in procs if p.poll() is not None]
                    if dead:
                        raise BenchmarkError(
                            f"a worker process exited early (status {dead[0]}): {_tail(log)}"
                        )
                    if time.perf_counter() - start > _RUN_TIMEOUT:
                        raise BenchmarkError(
                            f"{processes} worker(s) did not finish {runs} runs in "
                            f"{_RUN_TIMEOUT:.0f} s: {counts}"
                        )
                    await asyncio.sleep(_POLL)
            finally:
                await asyncio.to_thread(_stop, procs)
            cur = await conn.execute(_CHECK)
            row = await cur.fetchone()
    assert row is not None
    total, not_done, retried, workers, busy = row
    if total != runs or not_done or retried:
        raise BenchmarkError(
            f"{processes} worker(s): {total} runs recorded (expected {runs}), {not_done} not "
            f"done, {retried} with attempts > 1; statuses {counts}"
        )
    await _check_result(dsn, f"{prefix}-{runs - 1}")
    return {"wall": wall, "workers": int(workers), "busy": float(busy)}


async def _check_result(dsn: str, thread_id: str) -> None:
    from checkpointers.postgres import PostgresCheckpointer

    store = PostgresCheckpointer(dsn)
    try:
        snap = await chain_graph().with_checkpointer(store).aget_state(thread_id)
    finally:
        await store.aclose()
    values = {} if snap is None else snap.values
    if values.get("n") != NODES or len(values.get("log", ())) != NODES:
        raise BenchmarkError(f"thread {thread_id} ended with {values!r}")


@register
class WorkersWorkload(Workload):
    name = "workers"
    summary = (
        "PostgreSQL run queue: N queued runs of a 3-node chain (sync nodes, no I/O) on distinct "
        "threads, drained by K = 1, 2, 4 worker processes (graphexec worker --concurrency 4): "
        "wall time from process start until all are done, runs/s, scaling vs K = 1; graphexec "
        "only (LangGraph's queue is in its paid server)"
    )
    metrics = tuple(
        m
        for k in PROCESSES
        for m in (
            Metric(f"wall_s_k{k}", f"K={k}: wall s, start to all done", compare=False, digits=2),
            Metric(f"runs_per_s_k{k}", f"K={k}: runs / s", compare=False, digits=1),
            *(
                ()
                if k == 1
                else (
                    Metric(f"scaling_k{k}", f"K={k}: runs/s vs K=1 (x)", compare=False, digits=2),
                )
            ),
        )
    )
    backends = ("postgres",)
    warmup = False  # every batch starts new processes on a new database

    def params(self) -> dict[str, Any]:
        return {
            "runs": 40 if self.quick else 200,
            "processes": list(PROCESSES),
            "concurrency per process": CONCURRENCY,
            "nodes": NODES,
        }

    def unsupported(self, system: Adapter) -> str | None:
        if system.name == GRAPHEXEC:
            return None
        return "unavailable: no equivalent (LangGraph's run queue is in LangGraph Platform)"

    async def measure(self, system: Adapter, env: Env) -> Sample:
        runs = self.params()["runs"]
        metrics: dict[str, float] = {}
        info: dict[str, Any] = {}
        for k in PROCESSES:
            async with env.storage(f"{self.name}-k{k}") as storage:
                assert storage.where.dsn is not None
                done = await _drain(storage.where.dsn, k, runs)
            metrics[f"wall_s_k{k}"] = done["wall"]
            metrics[f"runs_per_s_k{k}"] = runs / done["wall"]
            if k > 1:
                metrics[f"scaling_k{k}"] = metrics[f"runs_per_s_k{k}"] / metrics["runs_per_s_k1"]
            info[f"K={k}: runs/s, first start to last finish"] = round(runs / done["busy"], 1)
            info[f"K={k}: processes that ran runs"] = done["workers"]
        info["failed or retried runs"] = 0
        return Sample(metrics, info)
