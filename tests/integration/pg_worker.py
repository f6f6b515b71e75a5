"""Subprocess side of the PostgreSQL multi-process tests (not a test module).

    python pg_worker.py migrate DSN SCHEMA GATE INDEX      open a fresh schema with the others
    python pg_worker.py runs DSN SCHEMA GATE INDEX COUNT   COUNT runs, each on its own thread
    python pg_worker.py race DSN SCHEMA GATE INDEX         resume one interrupted thread, racing
    python pg_worker.py crash DSN SCHEMA LOG PLAN_JSON     run the crash workflow (parent kills it)
    python pg_worker.py resume DSN SCHEMA LOG              resume the crash workflow to the end
    python pg_worker.py measure DSN SCHEMA [RUNS]          print per-step timings (by hand)

The graphs and the gate protocol are ``sqlite_worker``'s: ``GATE`` is a directory used as a
barrier (each worker creates ``ready-INDEX`` and waits for ``go``), results are JSON lines on
stdout, and the crash workflow prints ``COMMIT <step>`` after each checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psycopg
import sqlite_worker as base

from checkpointers import PostgresCheckpointer
from graphexec import Command, InMemoryCheckpointer, ThreadBusyError

THREAD = base.THREAD


def open_store(dsn: str, schema: str, **options: Any) -> Any:
    return PostgresCheckpointer.open(dsn, schema=schema, **options)


async def migrate(dsn: str, schema: str, gate: Path, index: int) -> None:
    base._wait_at_gate(gate, index)
    async with open_store(dsn, schema, pool_min=0):
        pass
    print(json.dumps({"ok": True}), flush=True)


async def runs(dsn: str, schema: str, gate: Path, index: int, count: int) -> None:
    errors: list[str] = []
    done = 0
    async with open_store(dsn, schema) as cp:
        graph = base.build_count_graph(cp)
        base._wait_at_gate(gate, index)
        for i in range(count):
            try:
                out = await graph.ainvoke({"n": 0, "log": []}, thread_id=f"p{index}-t{i}")
                assert out["n"] == 3, out
                done += 1
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
    print(json.dumps({"done": done, "errors": errors}), flush=True)


async def race(dsn: str, schema: str, gate: Path, index: int) -> None:
    async with open_store(dsn, schema) as cp:
        graph = base.build_review_graph(cp)
        await cp.get("review")  # connect before the gate, so that all start together
        base._wait_at_gate(gate, index)
        try:
            result = await graph.arun(Command(resume=f"yes from {index}"), thread_id="review")
            outcome: dict[str, str | None] = {"outcome": "ran", "status": result.status}
        except ThreadBusyError as e:
            outcome = {"outcome": "busy", "owner": e.owner}
        except Exception as e:
            outcome = {"outcome": "error", "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(outcome), flush=True)


def integrity_problems(dsn: str, schema: str, *, pruned: bool = False) -> list[str]:
    """Rows that no complete commit would leave behind (orphans, dangling heads, parents).

    After a prune the oldest retained checkpoints' parents are gone by design (``pruned``).
    """
    s = f'"{schema}"'
    checks = {
        "channel rows without a checkpoint": f"""SELECT count(*) FROM {s}.graphexec_channels AS b
            WHERE NOT EXISTS (SELECT 1 FROM {s}.graphexec_checkpoints AS c
                              WHERE c.cp_seq = b.cp_seq)""",
        "pending writes without a checkpoint": f"""SELECT count(*) FROM {s}.graphexec_writes AS w
            WHERE NOT EXISTS (SELECT 1 FROM {s}.graphexec_checkpoints AS c
                              WHERE c.cp_seq = w.cp_seq)""",
        "heads pointing nowhere": f"""SELECT count(*) FROM {s}.graphexec_heads AS h
            WHERE NOT EXISTS (SELECT 1 FROM {s}.graphexec_checkpoints AS c
                WHERE c.cp_seq = h.head_seq AND c.checkpoint_id = h.head_id
                  AND c.thread_id = h.thread_id AND c.checkpoint_ns = h.checkpoint_ns)""",
        "checkpoints whose parent is missing": f"""SELECT count(*)
            FROM {s}.graphexec_checkpoints AS c WHERE c.parent_id IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM {s}.graphexec_checkpoints AS p
                  WHERE p.thread_id = c.thread_id AND p.checkpoint_ns = c.checkpoint_ns
                    AND p.checkpoint_id = c.parent_id)""",
    }
    if pruned:
        del checks["checkpoints whose parent is missing"]
    problems = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for what, query in checks.items():
            row = conn.execute(query).fetchone()
            if row is not None and row[0]:
                problems.append(f"{row[0]} {what}")
    return problems


# -- crash and resume -----------------------------------------------------------------------------


def _arm_kill(calls: int, delay: float) -> None:
    """SIGKILL this process ``delay`` seconds after sending its ``calls``-th next statement.

    The statement is already on its way to the server (or not, with a zero delay), so the kill
    lands before it is sent, while the server runs it, or after it committed but before the
    process heard back.
    """
    original = psycopg.AsyncConnection.execute
    seen = 0

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal seen
        seen += 1
        if seen < calls:
            return await original(self, *args, **kwargs)
        pending = asyncio.ensure_future(original(self, *args, **kwargs))
        if delay:
            time.sleep(delay)  # block the loop: nothing else of ours runs before the kill
            await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGKILL)
        return await pending  # pragma: no cover - killed above

    psycopg.AsyncConnection.execute = execute  # type: ignore[method-assign]


async def crash(dsn: str, schema: str, log: Path, plan: dict[str, Any]) -> None:
    async with open_store(dsn, schema) as cp:
        graph = base.build_crash_graph(cp, log)
        print("READY", flush=True)
        async for event in graph.astream(base.INPUT, thread_id=THREAD, mode="events"):
            if event["event"] == "checkpoint" and event["ns"] == "":
                print(f"COMMIT {event['step']}", flush=True)
                if plan.get("arm_after") == event["step"]:
                    _arm_kill(int(plan["calls"]), float(plan["delay"]))
                    print("ARMED", flush=True)
            elif event["event"] == "task_end":
                print(f"END {event['node']}", flush=True)
        print("DONE", flush=True)


async def resume(dsn: str, schema: str, log: Path) -> None:
    async with open_store(dsn, schema) as cp:
        graph = base.build_crash_graph(cp, log)
        # Killed before the input was committed: the thread does not exist yet, start it again.
        first = await cp.get(THREAD) is None
        await graph.ainvoke(base.INPUT if first else None, thread_id=THREAD, on_busy="wait")
        print(json.dumps({"restarted": first}), flush=True)


# -- measurements (run by hand) -------------------------------------------------------------------


async def _floor(dsn: str, schema: str, payload: int, rounds: int) -> float:
    """One round trip and commit of ``payload`` bytes with plain psycopg (no graphexec)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=None
    ) as conn:
        table = f'"{schema}".floor'
        await conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, data BYTEA)")
        blob = os.urandom(payload)
        start = time.perf_counter()
        for _ in range(rounds):
            await conn.execute(f"INSERT INTO {table} (data) VALUES (%s)", (blob,))
        return (time.perf_counter() - start) / rounds


async def measure(dsn: str, schema: str, runs: int) -> dict[str, Any]:
    """Per-node-step time of a 10-node chain on PostgreSQL next to InMemory, and the floor."""
    from sqlite_measure import chain_graph, per_step

    out: dict[str, Any] = {}
    memory = chain_graph(InMemoryCheckpointer())
    out["InMemoryCheckpointer sync"] = statistics.median(
        [await per_step(memory, "sync", runs) for _ in range(5)]
    )
    cp_bytes = 0
    for prepare in (False, True):
        async with open_store(dsn, schema, prepare=prepare) as cp:
            graph = chain_graph(cp)
            for durability in ("sync", "async", "exit"):
                samples = [await per_step(graph, durability, runs) for _ in range(5)]
                label = f"PostgresCheckpointer{' prepare=True' if prepare else ''} {durability}"
                out[label] = statistics.median(samples)
            # the bytes one put of this chain stores: a step's deltas and frontier, on average
            thread = (await cp.list_threads())[0].thread_id
            steps = [c for c in await cp.list(thread) if c.source == "loop"]
            cp_bytes = sum(
                len(c.frontier) + sum(d.nbytes for d in c.deltas.values()) for c in steps
            ) // len(steps)
    out["floor: 1 round trip + commit (plain psycopg)"] = await _floor(dsn, schema, cp_bytes, 2000)
    out["payload bytes per checkpoint"] = cp_bytes
    return out


def main(argv: list[str]) -> None:
    command, dsn, schema = argv[0], argv[1], argv[2]
    if command == "migrate":
        asyncio.run(migrate(dsn, schema, Path(argv[3]), int(argv[4])))
    elif command == "runs":
        asyncio.run(runs(dsn, schema, Path(argv[3]), int(argv[4]), int(argv[5])))
    elif command == "race":
        asyncio.run(race(dsn, schema, Path(argv[3]), int(argv[4])))
    elif command == "crash":
        asyncio.run(crash(dsn, schema, Path(argv[3]), json.loads(argv[4])))
    elif command == "resume":
        asyncio.run(resume(dsn, schema, Path(argv[3])))
    elif command == "measure":
        try:
            result = asyncio.run(measure(dsn, schema, int(argv[3]) if len(argv) > 3 else 200))
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        memory = result["InMemoryCheckpointer sync"]
        for label, value in result.items():
            if isinstance(value, float):
                print(f"{label:46} {value * 1e6:8.0f} us   ({value / memory:4.1f}x memory)")
            else:
                print(f"{label:46} {value}")
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    random.seed()
    try:
        main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
