"""Subprocess side of the SQLite multi-process tests (not a test module).

    python sqlite_worker.py migrate DB GATE INDEX       open a fresh file at the same time as others
    python sqlite_worker.py crash DB LOG PLAN_JSON      run the crash workflow (parent kills it)
    python sqlite_worker.py resume DB LOG               resume the crash workflow to the end
    python sqlite_worker.py runs DB GATE INDEX COUNT    COUNT runs, each on its own thread
    python sqlite_worker.py race DB GATE INDEX          resume one interrupted thread, racing others

``GATE`` is a directory used as a barrier: each worker creates ``ready-INDEX`` and waits for
``go`` so that all of them hit the database at the same moment. Results are printed as lines on
stdout (``COMMIT <step>`` after every checkpoint of the crash workflow, a JSON line at the end
of the others).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import operator
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Any, TypedDict

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    NodeContext,
    Send,
    StateGraph,
    ThreadBusyError,
    interrupt,
)

THREAD = "crash-thread"
CHAIN = [f"s{i}" for i in range(12)]
FAN_AFTER = 5  # the fan-out step runs after s5
PARTS = 4
BLOB_BYTES = 256 * 1024
LEASE_TTL = 0.5


# -- the crash workflow: a 12-step chain with a big value, and a parallel fan-out step -----------


class CrashState(TypedDict):
    log: Annotated[list[str], operator.add]
    fan: Annotated[list[int], operator.add]
    blob: str


INPUT: CrashState = {"log": [], "fan": [], "blob": ""}


def _blob(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()
    return digest * (BLOB_BYTES // len(digest))


def _record(log: Path, ctx: NodeContext) -> None:
    # One O_APPEND write per execution: survives SIGKILL of the writer.
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {ctx.step} {ctx.task_id} {ctx.node}\n")


def build_crash_graph(cp: BaseCheckpointer, log: Path) -> CompiledGraph[Any]:
    """The workflow whose executions are recorded in ``log`` (one line per node execution)."""
    rng = random.Random()

    def chain_node(name: str) -> Any:
        def node(state: CrashState, ctx: NodeContext) -> dict[str, Any]:
            _record(log, ctx)
            time.sleep(rng.uniform(0.001, 0.008))
            return {"log": [name], "blob": _blob(name)}

        return node

    async def part(i: int, ctx: NodeContext) -> dict[str, Any]:
        _record(log, ctx)
        await asyncio.sleep(0.01 + 0.04 * i)
        return {"fan": [i], "log": [f"part{i}"]}

    b = StateGraph(CrashState)
    for name in CHAIN:
        b.add_node(name, chain_node(name))
    b.add_node("part", part)
    b.add_edge(START, CHAIN[0])
    for i, (a, c) in enumerate(itertools.pairwise(CHAIN)):
        if i == FAN_AFTER:
            b.add_conditional_edges(a, lambda s: [Send("part", j) for j in range(PARTS)])
            b.add_edge("part", c)
        else:
            b.add_edge(a, c)
    b.add_edge(CHAIN[-1], END)
    graph = b.compile(checkpointer=cp)
    graph.lease_ttl = LEASE_TTL  # a killed run's lease expires quickly, so resumes can take over
    return graph


async def _arm_kill(cp: SqliteCheckpointer, every: int) -> None:
    """SIGKILL this process after ``every`` VM steps of the next statement on a writer.

    The writer connections only run write transactions, so the kill lands inside one: in
    BEGIN IMMEDIATE, a check, an insert of a big blob, the head move or the commit. Both the
    writer's thread and the loop's own connection (small writes) are armed.
    """
    conns = await cp._db._connections()

    def handler() -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    await conns.writer.set_progress_handler(handler, every)
    if conns.direct is not None:
        conns.direct.set_progress_handler(handler, every)


async def crash(db: Path, log: Path, plan: dict[str, Any]) -> None:
    async with SqliteCheckpointer.open(db) as cp:
        graph = build_crash_graph(cp, log)
        print("READY", flush=True)
        async for event in graph.astream(INPUT, thread_id=THREAD, mode="events"):
            if event["event"] == "checkpoint" and event["ns"] == "":
                print(f"COMMIT {event['step']}", flush=True)
                if plan.get("arm_after") == event["step"]:
                    await _arm_kill(cp, int(plan["every"]))
                    print("ARMED", flush=True)
            elif event["event"] == "task_end":
                print(f"END {event['node']}", flush=True)
        print("DONE", flush=True)


async def resume(db: Path, log: Path) -> None:
    async with SqliteCheckpointer.open(db) as cp:
        graph = build_crash_graph(cp, log)
        # Killed before the input was committed: the thread does not exist yet, start it again.
        first = await cp.get(THREAD) is None
        await graph.ainvoke(INPUT if first else None, thread_id=THREAD, on_busy="wait")
        print(json.dumps({"restarted": first}), flush=True)


# -- many runs, and racing resumes --------------------------------------------------------------


class CountState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def build_count_graph(cp: BaseCheckpointer, steps: int = 3) -> CompiledGraph[Any]:
    def step(name: str) -> Any:
        async def node(state: CountState) -> dict[str, Any]:
            return {"n": state["n"] + 1, "log": [name]}

        return node

    names = [f"c{i}" for i in range(steps)]
    b = StateGraph(CountState)
    for name in names:
        b.add_node(name, step(name))
    b.add_edge(START, names[0])
    for a, c in itertools.pairwise(names):
        b.add_edge(a, c)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp)


class ReviewState(TypedDict):
    draft: str
    approvals: Annotated[list[str], operator.add]
    published: Annotated[list[str], operator.add]


def build_review_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    """``ask`` waits for a human; ``publish`` is slow, so racing resumes overlap."""

    def ask(state: ReviewState) -> dict[str, Any]:
        answer = interrupt({"question": "publish?", "draft": state["draft"]})
        return {"approvals": [str(answer)]}

    async def publish(state: ReviewState) -> dict[str, Any]:
        await asyncio.sleep(1.5)
        return {"published": [f"{state['draft']} by pid {os.getpid()}"]}

    b = StateGraph(ReviewState)
    b.add_node("ask", ask)
    b.add_node("publish", publish)
    b.add_edge(START, "ask")
    b.add_edge("ask", "publish")
    b.add_edge("publish", END)
    return b.compile(checkpointer=cp)


def _wait_at_gate(gate: Path, index: int) -> None:
    (gate / f"ready-{index}").touch()
    deadline = time.monotonic() + 60
    while not (gate / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("the parent never opened the gate")
        time.sleep(0.002)


async def migrate(db: Path, gate: Path, index: int) -> None:
    _wait_at_gate(gate, index)
    async with SqliteCheckpointer.open(db):
        pass
    print(json.dumps({"ok": True}), flush=True)


async def runs(db: Path, gate: Path, index: int, count: int) -> None:
    errors: list[str] = []
    done = 0
    async with SqliteCheckpointer.open(db) as cp:
        graph = build_count_graph(cp)
        _wait_at_gate(gate, index)
        for i in range(count):
            try:
                out = await graph.ainvoke({"n": 0, "log": []}, thread_id=f"p{index}-t{i}")
                assert out["n"] == 3, out
                done += 1
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")
    print(json.dumps({"done": done, "errors": errors}), flush=True)


async def race(db: Path, gate: Path, index: int) -> None:
    async with SqliteCheckpointer.open(db) as cp:
        graph = build_review_graph(cp)
        _wait_at_gate(gate, index)
        try:
            result = await graph.arun(Command(resume=f"yes from {index}"), thread_id="review")
            outcome: dict[str, str | None] = {"outcome": "ran", "status": result.status}
        except ThreadBusyError as e:
            outcome = {"outcome": "busy", "owner": e.owner}
        except Exception as e:
            outcome = {"outcome": "error", "error": f"{type(e).__name__}: {e}"}
    print(json.dumps(outcome), flush=True)


def main(argv: list[str]) -> None:
    command, db = argv[0], Path(argv[1])
    if command == "crash":
        asyncio.run(crash(db, Path(argv[2]), json.loads(argv[3])))
    elif command == "resume":
        asyncio.run(resume(db, Path(argv[2])))
    elif command == "migrate":
        asyncio.run(migrate(db, Path(argv[2]), int(argv[3])))
    elif command == "runs":
        asyncio.run(runs(db, Path(argv[2]), int(argv[3]), int(argv[4])))
    elif command == "race":
        asyncio.run(race(db, Path(argv[2]), int(argv[3])))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
