"""Scaling out on PostgreSQL: a run queue served by two worker processes, one of them killed.

What it shows:

- ``RunQueue(dsn).enqueue("tickets", input, thread_id=...)`` accepts runs durably; any number of
  ``graphexec worker tickets=MODULE:graph --dsn ...`` processes, on any machines, claim and run
  them (``FOR UPDATE SKIP LOCKED``), checkpointing every step to the same database.
- One worker is killed with SIGKILL in the middle of its runs. Its leases lapse (2 s here) and
  the other worker takes its runs over, resuming each from its last checkpoint: no run is
  lost, finished steps are not repeated.
- The ``notify`` node calls a (fake) external service inside ``ctx.effect`` with the task's
  idempotency key, so a run that changes hands after ``notify`` reuses the recorded result:
  each customer is notified once. (Only a kill inside the call itself, before its result is
  recorded, could repeat it, with the same key, for a real service to drop.)

Needs a PostgreSQL server: set ``GRAPHEXEC_DSN=postgresql://user:pass@host/db`` (the test suite's
``GRAPHEXEC_TEST_POSTGRES_DSN`` works too). Without one it prints why and exits successfully.
Everything happens in a fresh schema that is dropped at the end.

Run it::

    GRAPHEXEC_DSN=postgresql://... python examples/08_postgres_workers.py
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

from graphexec import END, START, CompiledGraph, NodeContext, StateGraph

RUNS = 12
HERE = Path(__file__).resolve().parent


class Ticket(TypedDict, total=False):
    ticket_id: str
    log: Annotated[list[str], operator.add]


def _step(name: str) -> Any:
    def node(state: Ticket) -> dict[str, Any]:
        time.sleep(0.05)  # some work, so that the kill lands mid-run
        return {"log": [name]}

    return node


def _notify(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
    def send() -> str:  # the external service: records what it was asked to send
        with open(os.environ["GRAPHEXEC_EXAMPLE_OUTBOX"], "a", encoding="utf-8") as f:
            f.write(f"{state['ticket_id']} {ctx.idempotency_key}\n")
        return "sent"

    return {"log": [f"notify: {ctx.effect('notify', send)}"]}


def graph() -> CompiledGraph[Ticket]:
    """The ticket graph, classify -> research -> notify -> close (workers load it by name)."""
    b = StateGraph(Ticket)
    for name in ("classify", "research", "close"):
        b.add_node(name, _step(name))
    b.add_node("notify", _notify)
    b.add_edge(START, "classify")
    b.add_sequence(["classify", "research", "notify", "close"])
    b.add_edge("close", END)
    return b.compile(name="tickets", lease_ttl=2.0)


def _server() -> str | None:
    dsn = os.environ.get("GRAPHEXEC_DSN") or os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN")
    if not dsn:
        print("skipped: no PostgreSQL server (set GRAPHEXEC_DSN=postgresql://...)")
        return None
    import psycopg

    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as e:
        print(f"skipped: PostgreSQL at GRAPHEXEC_DSN does not answer ({type(e).__name__})")
        return None
    return dsn


def _worker(dsn: str, name: str, outbox: Path) -> subprocess.Popen[bytes]:
    spec = f"tickets={Path(__file__).stem}:graph"
    command = [
        sys.executable,
        "-m",
        "graphexec.cli",
        "worker",
        spec,
        "--dsn",
        dsn,
        "--concurrency",
        "2",
        "--lease-ttl",
        "2",
        "--grace",
        "5",
        "--worker-id",
        name,
    ]
    env = {**os.environ, "GRAPHEXEC_EXAMPLE_OUTBOX": str(outbox)}
    return subprocess.Popen(command, cwd=HERE, env=env, stderr=subprocess.DEVNULL)


async def main(dsn: str) -> None:
    import psycopg
    from psycopg import sql

    from checkpointers.queue import RunQueue

    schema = f"graphexec_example_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    if "://" in dsn:  # a URL, or a key=value DSN
        scoped = f"{dsn}{'&' if '?' in dsn else '?'}options=-csearch_path%3D{schema}"
    else:
        scoped = f"{dsn} options=-csearch_path={schema}"
    queue = RunQueue(scoped)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            outbox = Path(tmp) / "outbox.txt"
            ids = [
                await queue.enqueue(
                    "tickets", {"ticket_id": f"T{i:02}", "log": []}, thread_id=f"T{i:02}"
                )
                for i in range(RUNS)
            ]
            print(f"enqueued {RUNS} runs of graph 'tickets'")
            workers = [_worker(scoped, "worker-a", outbox), _worker(scoped, "worker-b", outbox)]
            print("started two worker processes: worker-a and worker-b")
            while True:  # kill worker-a once it has finished two runs and is inside another
                mine = [r for r in await queue.list() if r.worker_id == "worker-a"]
                done = sum(r.status == "done" for r in mine)
                if done >= 2 and any(r.status == "running" for r in mine):
                    break
                await asyncio.sleep(0.02)
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            print("killed worker-a (SIGKILL) in the middle of its runs")
            finished = [await queue.wait(run_id, timeout=90) for run_id in ids]
            workers[1].send_signal(signal.SIGTERM)
            workers[1].wait(timeout=30)
            statuses = Counter(r.status for r in finished)
            taken_over = [r for r in finished if r.attempts > 1]
            print(f"all {RUNS} runs finished: {dict(statuses)}")
            print(
                f"worker-a's interrupted runs were finished by worker-b: "
                f"{bool(taken_over) and all(r.worker_id == 'worker-b' for r in taken_over)}"
            )
            sent = outbox.read_text().splitlines()
            tickets = Counter(line.split()[0] for line in sent)
            once = len(tickets) == RUNS and all(n == 1 for n in tickets.values())
            print(f"customers notified: {len(tickets)}, each exactly once: {once}")
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        await queue.aclose()
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    server = _server()
    if server is not None:
        asyncio.run(main(server))
