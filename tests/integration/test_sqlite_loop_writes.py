"""Small SQLite writes on the event loop's own thread (``SqliteDatabase.write(..., size=...)``).

Real files throughout. Where a transaction ran is observed, not assumed: each body records the
thread it ran on. The rules under test (see :mod:`checkpointers._sqlite_db`): a write of known,
small size runs on the loop's thread unless the file is locked (then on the writer's thread,
waiting there, never on the loop), every ``DIRECT_RUN``-th such write goes to the writer's
thread so SQLite's autocheckpoint keeps the WAL bounded, and ``synchronous=FULL``,
``":memory:"`` and ``loop_writes=False`` never write on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import operator
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from checkpointers import SqliteCheckpointer
from checkpointers import _sqlite_db as sqlite_db
from checkpointers._sqlite_db import DIRECT_MAX_BYTES, DIRECT_RUN, SqliteDatabase
from graphexec import END, START, StateGraph
from graphexec.errors import StorageError
from memory import Block, SqliteBlockStore, SqliteFactStore, SqliteMemory, SqliteSession

MIGRATIONS = [
    "CREATE TABLE IF NOT EXISTS versions (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)",
    "CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
]


def database(path: Path | str, **kwargs: Any) -> SqliteDatabase:
    return SqliteDatabase(
        path, owner="Test(db)", migrations=MIGRATIONS, version_table="versions", **kwargs
    )


async def write_row(db: SqliteDatabase, size: int | None = 100, body_bytes: int = 100) -> int:
    """Insert one row of ``body_bytes``, declaring ``size``; return the body's thread ident."""
    where: list[int] = []

    def body(c: sqlite3.Connection) -> None:
        where.append(threading.get_ident())
        c.execute("INSERT INTO rows (body) VALUES (randomblob(?))", (body_bytes,))

    await db.write("insert", body, size=size)
    return where[-1]


def count_rows(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        [(n,)] = conn.execute("SELECT count(*) FROM rows").fetchall()
    return int(n)


async def test_small_writes_run_on_the_loop_thread_others_on_the_writer(tmp_path: Path) -> None:
    db = database(tmp_path / "db.sqlite")
    try:
        await db.open()
        here = threading.get_ident()
        assert db.loop_writes
        direct = (await db._connections()).direct
        assert direct is not None
        # It never checkpoints (see test_the_wal_stays_bounded...), nor waits for a lock.
        assert direct.execute("PRAGMA wal_autocheckpoint").fetchall() == [(0,)]
        assert direct.execute("PRAGMA busy_timeout").fetchall() == [(0,)]
        assert await write_row(db, size=0) == here
        assert await write_row(db, size=DIRECT_MAX_BYTES) == here
        assert await write_row(db, size=DIRECT_MAX_BYTES + 1) != here  # too big
        assert await write_row(db, size=None) != here  # size unknown
    finally:
        await db.aclose()
    assert count_rows(tmp_path / "db.sqlite") == 4


async def test_every_direct_run_th_small_write_goes_to_the_writer_thread(tmp_path: Path) -> None:
    db = database(tmp_path / "db.sqlite")
    try:
        here = threading.get_ident()
        on_writer = [i for i in range(2 * DIRECT_RUN + 2) if await write_row(db) != here]
    finally:
        await db.aclose()
    assert on_writer == [DIRECT_RUN, 2 * DIRECT_RUN + 1]


async def test_the_wal_stays_bounded_by_sqlite_s_own_checkpoints(tmp_path: Path) -> None:
    """The loop's connection never checkpoints; the writer's commits do, often enough.

    3,000 commits of ~2 pages each would leave a WAL of ~6,000 frames if nothing checkpointed
    (the loop's connection has ``wal_autocheckpoint=0``). SQLite's default autocheckpoint
    (1,000 pages) runs on the writer's thread at most ``DIRECT_RUN`` commits late.
    """
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        for _ in range(3000):
            await write_row(db, size=4000, body_bytes=4000)
        # Before closing: the last connection to close checkpoints and deletes the WAL.
        assert path.stat().st_size > 2000 * 4000  # checkpoints copied rows into the file
        wal = path.with_name(path.name + "-wal")
        frames = (wal.stat().st_size - 32) // (4096 + 24)  # the most it ever held
        assert frames < 1000 + DIRECT_RUN * 4, f"the WAL reached {frames} frames"
    finally:
        await db.aclose()


async def test_a_locked_file_sends_the_write_to_the_writer_without_blocking_the_loop(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path, busy_timeout=10.0)
    try:
        await db.open()
        here = threading.get_ident()
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.005)

        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another connection holds the write lock
            ticking = asyncio.create_task(ticker())
            write = asyncio.create_task(write_row(db))
            await asyncio.sleep(0.3)
            assert not write.done()  # waiting for the lock, on the writer's thread
            before = ticks
            other.execute("COMMIT")
            thread = await write
            stop.set()
            await ticking
        assert thread != here
        assert before >= 20  # the loop kept running while the write waited (~60 ticks)
        assert await write_row(db) == here  # unlocked again: back on the loop
    finally:
        await db.aclose()
    assert count_rows(path) == 2


@pytest.mark.parametrize(
    ("target", "kwargs"),
    [
        ("file", {"synchronous": "FULL"}),
        ("file", {"loop_writes": False}),
        (":memory:", {}),
    ],
    ids=["synchronous-FULL", "loop_writes-False", "memory"],
)
async def test_these_never_write_on_the_loop(
    tmp_path: Path, target: str, kwargs: dict[str, Any]
) -> None:
    db = database(tmp_path / "db.sqlite" if target == "file" else target, **kwargs)
    try:
        assert not db.loop_writes
        here = threading.get_ident()
        assert all([await write_row(db, size=0) != here for _ in range(3)])
        conns = await db._connections()
        assert conns.direct is None
    finally:
        await db.aclose()


async def test_a_failed_write_on_the_loop_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        await write_row(db)

        def duplicate(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO rows (id, body) VALUES (1000, x'00')")
            c.execute("INSERT INTO rows (id, body) VALUES (1000, x'00')")  # IntegrityError

        with pytest.raises(StorageError, match=r"SQLite insert on .*db\.sqlite failed"):
            await db.write("insert", duplicate, size=2)

        def refuse(c: sqlite3.Connection) -> None:
            c.execute("INSERT INTO rows (id, body) VALUES (1001, x'00')")
            raise ValueError("refused by the body")

        with pytest.raises(ValueError, match="refused by the body"):
            await db.write("insert", refuse, size=1)
        assert await write_row(db) == threading.get_ident()  # the connection is usable
    finally:
        await db.aclose()
    assert count_rows(path) == 2


async def test_a_body_can_move_itself_to_the_writer_thread(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    ran: list[tuple[int, bool]] = []
    try:

        def body(c: sqlite3.Connection) -> str:
            ran.append((threading.get_ident(), sqlite_db.on_loop(c)))
            c.execute("INSERT INTO rows (body) VALUES (x'01')")
            if sqlite_db.on_loop(c):
                raise sqlite_db.OffTheLoop
            return "stored"

        assert await db.write("insert", body, size=1) == "stored"
    finally:
        await db.aclose()
    here = threading.get_ident()
    assert [(t == here, flag) for t, flag in ran] == [(True, True), (False, False)]
    assert count_rows(path) == 1  # the attempt on the loop was rolled back


async def test_a_write_cut_short_before_its_rollback_is_rolled_back_first(tmp_path: Path) -> None:
    """A signal can land between a body and its rollback on the loop's thread; the next write
    must not find the connection stuck inside that transaction."""
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        conns = await db._connections()
        assert conns.direct is not None
        conns.direct.execute("BEGIN IMMEDIATE")
        conns.direct.execute("INSERT INTO rows (body) VALUES (x'ff')")  # never committed
        assert await write_row(db) == threading.get_ident()
    finally:
        await db.aclose()
    assert count_rows(path) == 1


async def test_aclose_closes_the_loop_s_connection(tmp_path: Path) -> None:
    db = database(tmp_path / "db.sqlite")
    conns = await db._connections()
    direct = conns.direct
    assert direct is not None
    await db.aclose()
    assert conns.direct is None
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        direct.execute("SELECT 1")


async def test_a_closed_loop_s_connection_is_closed_by_the_next_loop(tmp_path: Path) -> None:
    db = database(tmp_path / "db.sqlite")
    # Another event loop, on another thread, opens its connections and ends.
    first = await asyncio.to_thread(lambda: asyncio.run(db._connections()))
    direct = first.direct
    assert direct is not None
    try:
        await write_row(db)  # a new loop: its own connections; the dead loop's are closed
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            direct.execute("SELECT 1")
    finally:
        await db.aclose()


# -- the checkpointer -----------------------------------------------------------------------


class Chain(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def chain_node(name: str) -> Callable[[Chain], dict[str, Any]]:
    def node(state: Chain) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [name]}

    return node


def chain_graph(cp: SqliteCheckpointer) -> Any:
    b = StateGraph(Chain)
    names = [f"s{i}" for i in range(5)]
    for name in names:
        b.add_node(name, chain_node(name))
    b.add_edge(START, names[0])
    for a, c in itertools.pairwise(names):
        b.add_edge(a, c)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp)


def count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"loop": 0, "thread": 0}
    on_loop, on_thread = sqlite_db._on_loop, sqlite_db._on_thread

    def loop_call(db: Any, fn: Callable[[Any], Any]) -> Any:
        calls["loop"] += 1
        return on_loop(db, fn)

    async def thread_call(conn: Any, fn: Callable[[Any], Any]) -> Any:
        calls["thread"] += 1
        return await on_thread(conn, fn)

    monkeypatch.setattr(sqlite_db, "_on_loop", loop_call)
    monkeypatch.setattr(sqlite_db, "_on_thread", thread_call)
    return calls


@pytest.mark.parametrize("loop_writes", [True, False])
async def test_a_run_commits_its_steps_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loop_writes: bool
) -> None:
    """A 5-node run on a new thread: its start (lease and input checkpoint) and its 5 step
    commits (the last one releasing the lease) on the loop; with ``loop_writes=False`` all
    on the writer's thread. The stored history is the same."""
    async with SqliteCheckpointer.open(tmp_path / "cp.db", loop_writes=loop_writes) as cp:
        graph = chain_graph(cp)
        await graph.ainvoke({"n": 0, "log": []}, thread_id="warm")  # connections, schema
        calls = count_calls(monkeypatch)
        out = await graph.ainvoke({"n": 0, "log": []}, thread_id="t")
        used = dict(calls)
        assert out == {"n": 5, "log": ["s0", "s1", "s2", "s3", "s4"]}
        history = [s.values for s in await graph.aget_state_history(thread_id="t")]
    assert used == ({"loop": 6, "thread": 0} if loop_writes else {"loop": 0, "thread": 6})
    assert [v["n"] for v in history] == [5, 4, 3, 2, 1, 0]


async def test_a_run_reads_a_thread_it_does_not_hold_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starting a run reads the thread's head in the lease's transaction. A graph that holds
    a checkpoint of the thread reads on the loop (from that checkpoint on); one that holds
    none (another graph object, another process) must read and fold the whole head: that
    transaction runs on the writer's thread, whether the run resumes (``None``) or brings
    input (its start on the loop finds the head moved and hands itself over)."""
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        await chain_graph(cp).ainvoke({"n": 0, "log": []}, thread_id="t")
        calls = count_calls(monkeypatch)

        warm = chain_graph(cp)
        await warm.ainvoke({"n": 10, "log": []}, thread_id="t")
        await warm.ainvoke({"n": 20, "log": []}, thread_id="t")  # holds t's head now
        calls.update(loop=0, thread=0)
        assert (await warm.ainvoke(None, thread_id="t"))["n"] == 25  # nothing left to run
        assert calls == {"loop": 2, "thread": 0}  # lease and read, release

        calls.update(loop=0, thread=0)
        assert (await chain_graph(cp).ainvoke(None, thread_id="t"))["n"] == 25
        assert calls == {"loop": 1, "thread": 1}  # lease and read on the thread, release

        calls.update(loop=0, thread=0)
        out = await chain_graph(cp).ainvoke({"n": 30, "log": []}, thread_id="t")
        assert calls == {"loop": 7, "thread": 1}  # tried on the loop, read on the thread
        assert out["n"] == 35 and len(out["log"]) == 20


async def test_a_graph_whose_thread_moved_on_reads_it_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph that holds a checkpoint of the thread, after another graph object ran it on:
    the read from the held checkpoint to the new head may fold a long delta chain, so the
    run's start goes to the writer's thread, with or without input. The state read is the
    other graph's."""
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        mine, other = chain_graph(cp), chain_graph(cp)
        await mine.ainvoke({"n": 0, "log": []}, thread_id="t")  # mine holds t's head
        for start in (100, 200, 300):  # 18 checkpoints past it
            await other.ainvoke({"n": start, "log": []}, thread_id="t")
        calls = count_calls(monkeypatch)

        assert (await mine.ainvoke(None, thread_id="t"))["n"] == 305  # nothing left to run
        assert calls == {"loop": 2, "thread": 1}  # tried on the loop, read on the thread

        await other.ainvoke({"n": 400, "log": []}, thread_id="t")
        calls.update(loop=0, thread=0)
        out = await mine.ainvoke({"n": 500, "log": []}, thread_id="t")
        assert calls == {"loop": 7, "thread": 1}  # tried on the loop, read on the thread
        assert out["n"] == 505 and len(out["log"]) == 30

        calls.update(loop=0, thread=0)  # mine holds the head again: all on the loop
        assert (await mine.ainvoke(None, thread_id="t"))["n"] == 505
        assert calls == {"loop": 2, "thread": 0}


async def test_a_big_checkpoint_is_written_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Big(TypedDict):
        blob: bytes

    b = StateGraph(Big)
    b.add_node("grow", lambda s: {"blob": bytes(DIRECT_MAX_BYTES + 1)})
    b.add_node("shrink", lambda s: {"blob": b"small"})
    b.add_edge(START, "grow")
    b.add_edge("grow", "shrink")
    b.add_edge("shrink", END)
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        graph = b.compile(checkpointer=cp)
        await graph.ainvoke({"blob": b""}, thread_id="warm")
        calls = count_calls(monkeypatch)
        out = await graph.ainvoke({"blob": b""}, thread_id="t")
    assert out == {"blob": b"small"}
    # start (loop), grow's checkpoint (> DIRECT_MAX_BYTES: thread), shrink's (loop)
    assert calls == {"loop": 2, "thread": 1}


async def test_memory_stores_write_small_changes_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Session items, facts and new blocks: on the loop when small, else on the writer."""
    async with SqliteMemory.open(tmp_path / "memory.db") as mem:
        session = mem.session("s1")
        await session.add_items([{"role": "user", "content": "warm"}])  # connections, schema
        calls = count_calls(monkeypatch)
        await session.add_items([{"role": "user", "content": "I'm vegetarian."}])
        await mem.facts.put(("user", "42"), "diet", "vegetarian")
        await mem.blocks.create(Block("human", "Name: Ada", limit=2000))
        assert calls == {"loop": 3, "thread": 0}
        calls.update(loop=0, thread=0)
        await session.add_items([{"role": "user", "content": "x" * DIRECT_MAX_BYTES}])
        await mem.facts.put(("user", "42"), "essay", "y" * DIRECT_MAX_BYTES)
        assert calls == {"loop": 0, "thread": 2}
        items = await session.get_items()
        assert [i["content"][:15] for i in items] == ["warm", "I'm vegetarian.", "x" * 15]
        fact = await mem.facts.get(("user", "42"), "diet")
        assert fact is not None and fact.value == "vegetarian"


async def test_memory_stores_can_keep_every_write_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteMemory.open(tmp_path / "memory.db", loop_writes=False) as mem:
        session = mem.session("s1")
        await session.add_items([{"role": "user", "content": "warm"}])
        calls = count_calls(monkeypatch)
        await session.add_items([{"role": "user", "content": "I'm vegetarian."}])
        await mem.facts.put(("user", "42"), "diet", "vegetarian")
        await mem.blocks.create(Block("human", "Name: Ada", limit=2000))
        assert calls == {"loop": 0, "thread": 3}
    for store in (
        SqliteSession("s", tmp_path / "a.db", loop_writes=False),
        SqliteFactStore(tmp_path / "b.db", loop_writes=False),
        SqliteBlockStore(tmp_path / "c.db", loop_writes=False),
    ):
        try:
            assert not store._db.loop_writes
        finally:
            await store.aclose()
