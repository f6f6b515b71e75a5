"""Measure the SQLite checkpointer (a script run by hand, not a test).

    python tests/integration/sqlite_measure.py [--quick]

Prints:

1. Per-node-step time of a 10-node chain, SqliteCheckpointer (durability sync / async / exit,
   plain and encrypted) next to InMemoryCheckpointer, in the same process.
2. Bytes on disk for a 200-turn chat (``messages: Annotated[list[dict], add_messages]``, each
   turn a user and an assistant message of ~1 KB each) after ``PRAGMA wal_checkpoint(TRUNCATE)``,
   against the raw content bytes.
3. Per-step time and latest-state read time at turn 500 against turn 10 of one chat thread.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import operator
import os
import random
import sqlite3
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import (
    END,
    START,
    BaseCheckpointer,
    CompiledGraph,
    Durability,
    InMemoryCheckpointer,
    SnapshotPolicy,
    StateGraph,
    add_messages,
)

# -- 10-node chain --------------------------------------------------------------------------------


class ChainState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def _chain_node(name: str) -> Callable[[ChainState], Awaitable[dict[str, Any]]]:
    async def node(state: ChainState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [name]}

    return node


def chain_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    b = StateGraph(ChainState)
    names = [f"n{i}" for i in range(10)]
    for name in names:
        b.add_node(name, _chain_node(name))
    b.add_edge(START, names[0])
    for a, c in itertools.pairwise(names):
        b.add_edge(a, c)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp)


async def per_step(graph: CompiledGraph[Any], durability: Durability, runs: int) -> float:
    """Mean seconds per node step over ``runs`` invocations on fresh threads."""
    prefix = os.urandom(4).hex()
    for i in range(max(10, runs // 10)):  # warm up
        await graph.ainvoke({"n": 0, "log": []}, thread_id=f"w{prefix}{i}", durability=durability)
    start = time.perf_counter()
    for i in range(runs):
        await graph.ainvoke({"n": 0, "log": []}, thread_id=f"{prefix}{i}", durability=durability)
    return (time.perf_counter() - start) / (runs * 10)


async def langgraph_per_step(tmp: Path, runs: int) -> dict[str, float]:
    """The same chain on LangGraph (memory and SQLite savers), when the bench extra is installed."""
    try:
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.graph import END as LG_END
        from langgraph.graph import START as LG_START
        from langgraph.graph import StateGraph as LGStateGraph
    except ImportError:
        return {}

    def build(saver: Any) -> Any:
        b: Any = LGStateGraph(ChainState)
        names = [f"n{i}" for i in range(10)]
        for name in names:
            b.add_node(name, _chain_node(name))
        b.add_edge(LG_START, names[0])
        for a, c in itertools.pairwise(names):
            b.add_edge(a, c)
        b.add_edge(names[-1], LG_END)
        return b.compile(checkpointer=saver)

    async def run(graph: Any) -> float:
        def config(t: str) -> Any:
            return {"configurable": {"thread_id": t}}

        for i in range(3):
            await graph.ainvoke({"n": 0, "log": []}, config(f"w{i}"))
        start = time.perf_counter()
        for i in range(runs):
            await graph.ainvoke({"n": 0, "log": []}, config(f"t{i}"))
        return (time.perf_counter() - start) / (runs * 10)

    out = {"LangGraph InMemorySaver": await run(build(InMemorySaver()))}
    async with AsyncSqliteSaver.from_conn_string(str(tmp / "langgraph.db")) as saver:
        out["LangGraph AsyncSqliteSaver"] = await run(build(saver))
    return out


async def measure_chain(tmp: Path, runs: int) -> None:
    print(f"\n1. 10-node chain: time per node step (mean of {runs} runs x 10 steps)")
    key = Encryption(keys={"k": os.urandom(32)}, active="k")
    memory = await per_step(chain_graph(InMemoryCheckpointer()), "sync", runs)
    print(f"   {'InMemoryCheckpointer':38} sync   {memory * 1e6:8.0f} us")
    for label, enc, sync in (
        ("SqliteCheckpointer", None, "NORMAL"),
        ("SqliteCheckpointer (encrypted)", key, "NORMAL"),
        ("SqliteCheckpointer (synchronous=FULL)", None, "FULL"),
    ):
        modes: tuple[Durability, ...] = ("sync", "async", "exit")
        for durability in modes:
            if sync == "FULL" and durability != "sync":
                continue
            path = tmp / f"chain-{os.urandom(4).hex()}.db"
            async with SqliteCheckpointer.open(path, encryption=enc, synchronous=sync) as cp:  # type: ignore[arg-type]
                t = await per_step(chain_graph(cp), durability, runs)
            print(f"   {label:38} {durability:6} {t * 1e6:8.0f} us   ({t / memory:4.1f}x memory)")
    for label, t in (await langgraph_per_step(tmp, runs)).items():
        print(f"   {label:38} sync   {t * 1e6:8.0f} us")


# -- chat -----------------------------------------------------------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list[dict[str, Any]], add_messages]


_rng = random.Random(7)
_ALPHABET = string.ascii_letters + string.digits + " " * 10


def text(n: int) -> str:
    return "".join(_rng.choices(_ALPHABET, k=n))


def chat_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    async def assistant(state: ChatState) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": text(1000)}]}

    b = StateGraph(ChatState)
    b.add_node("assistant", assistant)
    b.add_edge(START, "assistant")
    b.add_edge("assistant", END)
    return b.compile(checkpointer=cp)


def raw_content(values: dict[str, Any]) -> int:
    return sum(len(m["content"].encode()) for m in values["messages"])


def file_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def table_bytes(path: Path) -> dict[str, int]:
    try:
        with sqlite3.connect(path) as db:
            rows = db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
    except sqlite3.Error:
        return {}
    return {name: size for name, size in rows}


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


class TimedSqlite(SqliteCheckpointer):
    """Adds up the time spent in storage calls, to separate storage from the engine.

    ``put_seconds``: every call that commits a checkpoint (a run's first one comes with its
    lease, its last one with the release); ``get_seconds``: every call that reads one.
    """

    put_seconds = 0.0
    get_seconds = 0.0

    async def _timed_put(self, call: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await call
        finally:
            self.put_seconds += time.perf_counter() - start

    async def _timed_get(self, call: Awaitable[Any]) -> Any:
        start = time.perf_counter()
        try:
            return await call
        finally:
            self.get_seconds += time.perf_counter() - start

    async def put(self, checkpoint: Any, **kwargs: Any) -> None:
        await self._timed_put(super().put(checkpoint, **kwargs))

    async def put_final(self, checkpoint: Any, **kwargs: Any) -> None:
        await self._timed_put(super().put_final(checkpoint, **kwargs))

    async def acquire_lease_and_put(self, checkpoint: Any, **kwargs: Any) -> Any:
        return await self._timed_put(super().acquire_lease_and_put(checkpoint, **kwargs))

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed_get(super().get(*args, **kwargs))

    async def get_since(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed_get(super().get_since(*args, **kwargs))

    async def acquire_lease_and_get(self, *args: Any, **kwargs: Any) -> Any:
        return await self._timed_get(super().acquire_lease_and_get(*args, **kwargs))


CORE_DEFAULT = SnapshotPolicy()
POLICIES = {"SqliteCheckpointer": SqliteCheckpointer.snapshot_policy, "core default": CORE_DEFAULT}


async def measure_chat_storage(tmp: Path, turns: int, name: str, policy: SnapshotPolicy) -> None:
    path = tmp / f"chat-{os.urandom(4).hex()}.db"
    sizes: list[str] = []
    async with SqliteCheckpointer.open(path, snapshot_policy=policy) as cp:
        graph = chat_graph(cp)
        for turn in range(1, turns + 1):
            msg = {"role": "user", "content": text(1000)}
            await graph.ainvoke({"messages": [msg]}, thread_id="chat")
            if turn % 50 == 0 or turn == turns:
                state = await graph.aget_state("chat")
                assert state is not None
                raw = raw_content(state.values)
                sizes.append(f"{turn}:{file_bytes(path) / raw:.2f}x")
        n_cps = len(await cp.list("chat"))
    size = file_bytes(path)
    print(
        f"   {name} {policy}:\n      {turns} turns, {n_cps} checkpoints: file "
        f"{size / 1024:.0f} KiB, raw content {raw / 1024:.0f} KiB -> {size / raw:4.2f}x"
    )
    print(f"      ratio every 50 turns: {' '.join(sizes)}")
    tables = table_bytes(path)
    if tables:
        parts = ", ".join(
            f"{k.removeprefix('graphexec_')} {v / 1024:.0f}"
            for k, v in sorted(tables.items(), key=lambda kv: -kv[1])[:5]
        )
        print(f"      KiB by table/index: {parts}")


async def measure_chat_scaling(
    tmp: Path, turns: int, window: int, name: str, policy: SnapshotPolicy
) -> None:
    path = tmp / f"scale-{os.urandom(4).hex()}.db"
    early = 10
    marks: dict[int, dict[str, float]] = {}
    async with TimedSqlite.open(path, snapshot_policy=policy) as cp:
        graph = chat_graph(cp)
        for turn in range(1, turns + 1):
            msg = {"role": "user", "content": text(1000)}
            if turn in (early - window + 1, turns - window + 1):
                start, puts, gets = time.perf_counter(), cp.put_seconds, cp.get_seconds
            await graph.ainvoke({"messages": [msg]}, thread_id="chat")
            if turn in (early, turns):
                steps = 2 * window  # two checkpoints (input + assistant step) per turn
                mark = {
                    "step": (time.perf_counter() - start) / steps,
                    "put": (cp.put_seconds - puts) / steps,
                    "load": (cp.get_seconds - gets) / window,
                }
                reads = [await timed(lambda: graph.aget_state("chat")) for _ in range(11)]
                raw = [await timed(lambda: cp.get("chat")) for _ in range(11)]
                tup = await cp.get("chat")
                assert tup is not None
                mark.update(
                    state=statistics.median(reads), get=statistics.median(raw), chain=len(tup.chain)
                )
                marks[turn] = mark
    a, b = marks[early], marks[turns]

    def row(label: str, key: str) -> str:
        growth = f"x{b[key] / a[key]:5.2f}" if a[key] else "     -"
        return (
            f"      {label:44} turn {early}: {a[key] * 1e3:6.2f} ms   turn {turns}: "
            f"{b[key] * 1e3:6.2f} ms   {growth}"
        )

    print(f"   {name} {policy} (mean of {window} turns; reads: median of 11)")
    print(row("per step (invoke time / 2 checkpoints)", "step"))
    print(row("  of which storage writes (commits)", "put"))
    print(row("  of which storage reads", "load"))
    print(row("latest-state read: graph.aget_state()", "state"))
    print(row("  of which cp.get() (storage read)", "get"))
    print(f"      delta chain folded by a read: {a['chain']:.0f} -> {b['chain']:.0f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and turns")
    args = parser.parse_args()
    runs = 30 if args.quick else 200
    turns = 100 if args.quick else 500
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        await measure_chain(tmp, runs)
        print("\n2. chat storage: file after wal_checkpoint(TRUNCATE) vs raw message content")
        for name, policy in POLICIES.items():
            await measure_chat_storage(tmp, 50 if args.quick else 200, name, policy)
        print(f"\n3. chat scaling: turn {turns} vs turn 10")
        for name, policy in POLICIES.items():
            await measure_chat_scaling(tmp, turns, 7, name, policy)


if __name__ == "__main__":
    asyncio.run(main())
