"""The SQLite files ``test_sqlite_upgrade.py`` upgrades, and what the old version read from them.

``fixtures/schema15.db`` and ``fixtures/schema15_encrypted.db`` were written by graphexec at
commit a78547b (schema version 15: text checkpoint ids, ``parent_id`` text columns, metadata
with ``source``/``step``/``run_id`` inside), and ``fixtures/schema15_reads.json`` holds every
read that version returned from them. Regenerate only from that commit::

    git worktree add /tmp/old a78547b && cd /tmp/old
    cp <this file> tests/integration/ && python -m tests.integration.sqlite_upgrade_fixture

The data covers what the upgrade must carry over: delta chains and snapshots, a branch made by
``update_state`` on an old checkpoint, a subgraph namespace, a fork, a pruned thread (whose
oldest kept checkpoint's parent is gone), pending writes, a TTL, a released lease, checkpoint
ids that are not canonical UUIDs, user metadata, and an encrypted file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import operator
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgpack  # type: ignore[import-untyped]

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import END, START, CompiledGraph, SnapshotPolicy, StateGraph
from graphexec.testing import make_checkpoint, put_chain

FIXTURES = Path(__file__).parent / "fixtures"
PLAIN = FIXTURES / "schema15.db"
ENCRYPTED = FIXTURES / "schema15_encrypted.db"
READS = FIXTURES / "schema15_reads.json"
KEY = Encryption(keys={"k1": bytes(range(32))}, active="k1")
POLICY = SnapshotPolicy(max_depth=6, ratio=1.0, min_bytes=0)
NAMESPACES = {"loop": ("", "sub:1"), "custom": ("",)}
"""Namespaces other than the root that hold checkpoints (every other thread: root only)."""


class State(TypedDict):
    msgs: Annotated[list[str], operator.add]
    n: int


def graph(cp: SqliteCheckpointer, steps: int) -> CompiledGraph[State]:
    """``steps`` supersteps, each appending one message (a fold) and setting ``n`` (a set)."""

    def step(s: State) -> dict[str, Any]:
        return {"msgs": [f"message {s['n']:03d} " + "x" * (s["n"] % 7)], "n": s["n"] + 1}

    def route(s: State) -> str:
        return END if s["n"] >= steps else "step"

    b = StateGraph(State)
    b.add_node("step", step)
    b.add_edge(START, "step")
    b.add_conditional_edges("step", route, ["step", END])
    return b.compile(checkpointer=cp)


async def dump(cp: SqliteCheckpointer) -> dict[str, str]:
    """Every read of every thread: threads, histories, tips and each checkpoint's ``get``."""
    out: dict[str, str] = {"threads": repr(await cp.list_threads())}
    for info in await cp.list_threads():
        thread = info.thread_id
        for ns in NAMESPACES.get(thread, ("",)):
            history = await cp.list(thread, ns)
            tips = await cp.list_tips(thread, ns)
            out[f"{thread}|{ns}|list"] = repr(history)
            out[f"{thread}|{ns}|tips"] = repr(tips)
            if len(history) > 2:
                below = history[1].checkpoint_id
                out[f"{thread}|{ns}|page"] = repr(await cp.list(thread, ns, limit=2, before=below))
            ids = sorted({c.checkpoint_id for c in (*history, *tips)})
            out[f"{thread}|{ns}|head"] = repr(await cp.get(thread, ns))
            for cid in ids:
                out[f"{thread}|{ns}|get|{cid}"] = repr(await cp.get(thread, ns, cid))
            if len(history) > 3:
                # a reader that already holds an older checkpoint's values
                known = history[3].checkpoint_id
                since = await cp.get_since(thread, ns, None, known=known)
                out[f"{thread}|{ns}|since"] = repr(since)
    return out


async def build_plain(path: Path) -> None:
    async with SqliteCheckpointer.open(path, snapshot_policy=POLICY) as cp:
        g = graph(cp, 20)
        await g.ainvoke({"msgs": [], "n": 0}, thread_id="loop")
        history = await g.aget_state_history("loop")
        # a branch: update an old checkpoint, then run on from it
        old = history[8].checkpoint_id
        assert old is not None
        await g.aupdate_state("loop", {"msgs": ["edited"]}, as_node="step", checkpoint_id=old)
        await graph(cp, 16).ainvoke(None, thread_id="loop")
        head = await cp.get("loop")
        assert head is not None
        head_id = head.checkpoint.checkpoint_id
        await cp.put_writes("loop", "", head_id, "task-a", [("msgs", msgpack.packb(["w1"]))])
        await cp.put_writes(
            "loop", "", head_id, "task-b", [("n", msgpack.packb(5)), ("msgs", b"\x90")]
        )
        await put_chain(cp, "loop", 7, ns="sub:1", snapshot_steps={4})
        await g.afork("loop", history[4].checkpoint_id or "", "forked")
        await graph(cp, 25).ainvoke(None, thread_id="forked")
        await graph(cp, 22).ainvoke({"msgs": [], "n": 0}, thread_id="pruned")
        await graph(cp, 22).aprune("pruned", keep_last=4)
        await cp.set_ttl("pruned", 3600.0)
        lease = await cp.acquire_lease("forked", owner="someone", ttl=60)
        await cp.release_lease(lease)
        # ids that are not canonical UUIDs stay text
        when = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        first = make_checkpoint(
            "custom",
            checkpoint_id="first",
            created_at=when,
            metadata={"source": "input", "step": 0, "run_id": "0" * 32, "user": {"k": [1]}},
        )
        upper = make_checkpoint(
            "custom",
            parent=first,
            checkpoint_id="01A22AC4-FB18-7001-B9EF-40CB1DC16E14",
            created_at=when.replace(second=6),
            metadata={"step": 1, "source": "loop", "run_id": "f" * 32},
        )
        third = make_checkpoint(
            "custom",
            parent=upper,
            checkpoint_id="01a22ac4-fb18-7001-b9ef-40cb1dc16e15",
            created_at=when.replace(second=7),
            metadata={"source": "loop", "step": 2, "run_id": "not hex"},
        )
        fourth = make_checkpoint(
            "custom", parent=third, checkpoint_id="z" * 40, created_at=when.replace(second=8)
        )
        expected: str | None = None
        for c in (first, upper, third, fourth):
            await cp.put(c, expected_head=expected)
            expected = c.checkpoint_id


async def build_encrypted(path: Path) -> None:
    async with SqliteCheckpointer.open(path, snapshot_policy=POLICY, encryption=KEY) as cp:
        await graph(cp, 14).ainvoke({"msgs": [], "n": 0}, thread_id="enc")
        await graph(cp, 14).aprune("enc", keep_last=5)
        head = await cp.get("enc")
        assert head is not None
        await cp.put_writes(
            "enc", "", head.checkpoint.checkpoint_id, "task-a", [("msgs", msgpack.packb(["w"]))]
        )
        await graph(cp, 9).ainvoke({"msgs": ["start"], "n": 0}, thread_id="enc2")


async def main() -> None:
    FIXTURES.mkdir(exist_ok=True)
    for path in (PLAIN, ENCRYPTED):
        path.unlink(missing_ok=True)
    await build_plain(PLAIN)
    await build_encrypted(ENCRYPTED)
    reads: dict[str, dict[str, str]] = {}
    async with SqliteCheckpointer.open(PLAIN) as cp:
        reads["plain"] = await dump(cp)
    async with SqliteCheckpointer.open(ENCRYPTED, encryption=KEY) as cp:
        reads["encrypted"] = await dump(cp)
    READS.write_text(json.dumps(reads, indent=1, ensure_ascii=False) + "\n")
    for path in (PLAIN, ENCRYPTED):
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA journal_mode=DELETE")
    print(f"wrote {PLAIN}, {ENCRYPTED} and {READS}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
