"""SQLite-specific behaviour: migrations, reopening, transactions, locking, event loops, leaks."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import operator
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import aiosqlite
import pytest
import sqlite_worker as worker

from checkpointers import SqliteCheckpointer, _pg_sql, _rows
from checkpointers import _sql as sql
from checkpointers import _sqlite_sql as lite
from graphexec import (
    END,
    START,
    CheckpointError,
    CompiledGraph,
    PendingWrite,
    StateGraph,
    StorageError,
    ThreadBusyError,
)
from graphexec.testing import assert_eventually, make_checkpoint, put_chain

WORKER = Path(worker.__file__)


@contextlib.contextmanager
def raw(db: Path) -> Iterator[sqlite3.Connection]:
    """A plain sqlite3 connection (autocommit) to poke at the file behind the backend's back."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def dump(db: Path) -> list[str]:
    with raw(db) as conn:
        return list(conn.iterdump())


# -- migrations --------------------------------------------------------------------------------


async def test_migrations_run_once_and_reopening_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        await cp.setup()  # idempotent
    with raw(db) as conn:
        first = conn.execute("SELECT version, applied_at FROM graphexec_migrations").fetchall()
        assert [v for v, _ in first] == list(range(len(sql.MIGRATIONS)))
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    async with SqliteCheckpointer.open(db):
        pass
    with raw(db) as conn:
        assert conn.execute("SELECT version, applied_at FROM graphexec_migrations").fetchall() == (
            first
        )


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db):
        pass
    with raw(db) as conn:
        conn.execute("INSERT INTO graphexec_migrations VALUES (?, 0)", (len(sql.MIGRATIONS),))
    with pytest.raises(StorageError, match="newer than this graphexec"):
        async with SqliteCheckpointer.open(db):
            pass


def test_four_processes_opening_a_fresh_file_at_once_migrate_it_once(tmp_path: Path) -> None:
    for round_ in range(3):
        db, gate = tmp_path / f"fresh-{round_}.db", tmp_path / f"gate-{round_}"
        gate.mkdir()
        procs = [
            subprocess.Popen(
                [sys.executable, str(WORKER), "migrate", str(db), str(gate), str(i)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        while len(list(gate.glob("ready-*"))) < 4:
            assert all(p.poll() is None for p in procs)
            time.sleep(0.005)
        (gate / "go").touch()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            assert '"ok": true' in out
        with raw(db) as conn:
            versions = [v for (v,) in conn.execute("SELECT version FROM graphexec_migrations")]
            assert versions == list(range(len(sql.MIGRATIONS)))
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_migrations_are_valid_for_both_dialect_templates() -> None:
    for dialect in (sql.SQLITE, _pg_sql.POSTGRES):
        statements = sql.migrations(dialect)
        assert len(statements) == len(sql.MIGRATIONS)
        assert all("{" not in s for s in statements)
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for name, fn in lite.FUNCTIONS.items():
            conn.create_function(name, 1, fn, deterministic=True)
        for statement in sql.migrations(sql.SQLITE):
            conn.execute(statement)


def test_every_query_path_uses_an_index() -> None:
    params = {
        "thread_id": "t",
        "checkpoint_ns": "",
        "checkpoint_id": "c",
        "parent_id": "p",
        "known": None,
        "before": None,
        "limit": 5,
        "keep_last": 3,
        "now": 1.0,
        "cp_seq": 1,
    }
    queries = {
        "get": lite.GET_CHECKPOINT,
        "list": lite.LIST_CHECKPOINTS,
        "tips": lite.LIST_TIPS,
        "put check": sql.PUT_CHECK,
        "writes check": sql.WRITES_CHECK,
        "prune": lite.PRUNE_PLAN,
        "detach parent": lite.DETACH_PARENT,
        "expire": sql.EXPIRED_THREADS,
        "last commit": sql.LAST_COMMIT,
        "rebase": lite.REBASE_TARGET,
        "manifest": lite.CHANNEL_MANIFEST,
        "delete channels": lite.DELETE_CHANNELS_OF,
        "threads": sql.LIST_THREADS,
        **{f"delete {i}": q for i, q in enumerate(lite.DELETE_THREAD)},
    }
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for name, fn in lite.FUNCTIONS.items():
            conn.create_function(name, 1, fn, deterministic=True)
        for statement in sql.migrations(sql.SQLITE):
            conn.execute(statement)
        for name, query in queries.items():
            for known in (None, "k"):  # get_since: the same statement, stopping at :known
                bound = dict(params, known=known)
                plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, bound)]
                scans = [step for step in plan if step.startswith("SCAN graphexec_")]
                assert not scans, (name, known, plan)


# -- durability of what was written --------------------------------------------------------------


async def test_reopen_reads_everything_back(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        lease = await cp.acquire_lease("t", owner="run-1", ttl=60)
        cps = await put_chain(cp, "t", 6, snapshot_steps={3}, lease=lease)
        sub = await put_chain(cp, "t", 2, ns="sub", lease=lease)
        fork = make_checkpoint("t", parent=cps[1], metadata={"fork": ["ü", 1.5, None]})
        await cp.put(fork, expected_head=cps[-1].checkpoint_id, lease=lease)
        await cp.put_writes("t", "", fork.checkpoint_id, "task", [("x", b"\x00\xff")], lease=lease)
        before = (
            await cp.get("t"),
            await cp.get("t", "", cps[4].checkpoint_id),
            await cp.get("t", "sub"),
            await cp.list("t"),
            await cp.list_tips("t"),
            await cp.list_threads(),
        )
    async with SqliteCheckpointer.open(db) as again:
        after = (
            await again.get("t"),
            await again.get("t", "", cps[4].checkpoint_id),
            await again.get("t", "sub"),
            await again.list("t"),
            await again.list_tips("t"),
            await again.list_threads(),
        )
        assert after == before
        head = after[0]
        assert head is not None
        assert head.pending_writes == (PendingWrite("task", "x", b"\x00\xff"),)
        assert head.checkpoint.metadata == {"fork": ["ü", 1.5, None]}
        assert after[2] is not None and after[2].checkpoint.checkpoint_id == sub[-1].checkpoint_id
        with pytest.raises(ThreadBusyError):  # the lease survived too
            await again.acquire_lease("t", owner="run-2", ttl=60)
        await again.release_lease(lease)
        newer = await again.acquire_lease("t", owner="run-2", ttl=60)
        assert newer.epoch == lease.epoch + 1


async def test_a_failed_transaction_leaves_the_file_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        cps = await put_chain(cp, "t", 3)
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task", [("x", b"1")])
        # Make the head move, late in put's transaction, fail inside SQLite.
        with raw(db) as conn:
            conn.execute(
                "CREATE TRIGGER fail_head BEFORE UPDATE ON graphexec_heads "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        before = dump(db)
        child = make_checkpoint("t", parent=cps[-1], snapshot=True)
        with pytest.raises(StorageError, match="injected failure") as info:
            await cp.put(child, expected_head=cps[-1].checkpoint_id)
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert str(db) in str(info.value) and "put" in str(info.value)
        assert dump(db) == before
        assert await cp.get("t", "", child.checkpoint_id) is None
        # ... and the connection is usable afterwards.
        with raw(db) as conn:
            conn.execute("DROP TRIGGER fail_head")
        await cp.put(child, expected_head=cps[-1].checkpoint_id)
        got = await cp.get("t")
        assert got is not None and got.checkpoint.checkpoint_id == child.checkpoint_id


class _HeldLock:
    """Holds the file's write lock from another connection for ``seconds``."""

    def __init__(self, db: Path, seconds: float) -> None:
        self.taken = threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(db, seconds))

    def _hold(self, db: Path, seconds: float) -> None:
        with raw(db) as conn:
            conn.execute("BEGIN IMMEDIATE")
            self.taken.set()
            time.sleep(seconds)
            conn.execute("ROLLBACK")

    def __enter__(self) -> _HeldLock:
        self._thread.start()
        self.taken.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join()


async def test_a_locked_database_is_waited_for_and_the_write_retried(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db, busy_timeout=0.02) as cp:
        [head] = await put_chain(cp, "t", 1)
        with _HeldLock(db, 0.15):
            start = time.monotonic()
            [child] = await put_chain(cp, "t", 1, after=head)
            waited = time.monotonic() - start
        # busy_timeout alone (20 ms) cannot cover 150 ms: the transaction was retried.
        assert waited > 0.1
        got = await cp.get("t")
        assert got is not None and got.checkpoint.checkpoint_id == child.checkpoint_id


async def test_a_lock_held_too_long_raises_storage_error_and_writes_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db, busy_timeout=0.01) as cp:
        [head] = await put_chain(cp, "t", 1)
        before = dump(db)
        late = make_checkpoint("t", parent=head)
        with _HeldLock(db, 2.0), pytest.raises(StorageError) as info:
            await cp.put(late, expected_head=head.checkpoint_id)
        message = str(info.value)
        assert str(db) in message and "put" in message and "locked" in message
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert dump(db) == before


async def test_cancelled_writes_commit_whole_or_not_at_all(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        [head] = await put_chain(cp, "t", 1)
        children = [make_checkpoint(f"t{i}", snapshot=True) for i in range(40)]
        tasks = [asyncio.create_task(cp.put(c, expected_head=None)) for c in children]
        await asyncio.sleep(0)
        for task in tasks[::2]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for child in children:
            got = await cp.get(child.thread_id)
            assert got is None or got.checkpoint == child
        # no transaction was left open on the writer
        await put_chain(cp, "t", 1, after=head)


# -- event loops and lifecycle ------------------------------------------------------------------


class Count(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def count_graph(cp: SqliteCheckpointer) -> CompiledGraph[Any]:
    async def inc(state: Count) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": ["inc"]}

    def double(state: Count) -> dict[str, Any]:
        return {"n": state["n"] * 2, "log": ["double"]}

    b = StateGraph(Count)
    b.add_node("inc", inc)
    b.add_node("double", double)
    b.add_edge(START, "inc")
    b.add_edge("inc", "double")
    b.add_edge("double", END)
    return b.compile(checkpointer=cp)


def test_sync_facade_and_asyncio_run_share_one_checkpointer(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "cp.db")  # no setup: the schema is created on first use
    graph = count_graph(cp)
    assert graph.invoke({"n": 1, "log": []}, thread_id="a") == {"n": 4, "log": ["inc", "double"]}
    out = asyncio.run(graph.ainvoke({"n": 1, "log": []}, thread_id="b"))
    assert out == {"n": 4, "log": ["inc", "double"]}
    again = graph.invoke({"n": 0, "log": []}, thread_id="b")
    assert again == {"n": 2, "log": ["inc", "double", "inc", "double"]}
    state = graph.get_state("a")
    assert state is not None and state.values["n"] == 4
    assert len(graph.get_state_history("b")) == 6
    asyncio.run(cp.aclose())  # closes the background loop's connections too
    with pytest.raises(StorageError, match="closed"):
        graph.invoke({"n": 1, "log": []}, thread_id="c")


async def test_sync_and_async_callers_at_the_same_time(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        graph = count_graph(cp)

        def sync_side() -> None:
            for i in range(15):
                graph.invoke({"n": i, "log": []}, thread_id=f"sync-{i}")

        async def async_side() -> None:
            for i in range(15):
                await graph.ainvoke({"n": i, "log": []}, thread_id=f"async-{i}")

        await asyncio.gather(asyncio.to_thread(sync_side), async_side())
        threads = await cp.list_threads()
        assert len(threads) == 30
        for prefix in ("sync", "async"):
            state = await graph.aget_state(f"{prefix}-7")
            assert state is not None and state.values["n"] == 16


async def test_memory_database_works_and_is_shared_by_loops() -> None:
    async with SqliteCheckpointer.open(":memory:") as cp:
        assert cp.path is None
        cps = await put_chain(cp, "t", 3)

        def from_another_loop() -> str | None:
            got = asyncio.run(cp.get("t"))
            return None if got is None else got.checkpoint.checkpoint_id

        assert await asyncio.to_thread(from_another_loop) == cps[-1].checkpoint_id


async def test_a_leaked_checkpointer_warns(tmp_path: Path) -> None:
    threads_before = threading.active_count()
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    await put_chain(cp, "t", 1)
    assert threading.active_count() > threads_before
    with pytest.warns(ResourceWarning, match="garbage-collected with open connections"):
        del cp
        gc.collect()

    async def connections_stopped() -> None:
        assert threading.active_count() == threads_before

    await assert_eventually(connections_stopped)


async def test_a_closed_checkpointer_refuses_work(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "cp.db")
    async with cp:
        await put_chain(cp, "t", 1)
    await cp.aclose()  # closing twice is fine
    with pytest.raises(StorageError, match="closed"):
        await cp.get("t")


async def test_an_unopenable_file_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="cannot open SQLite database"):
        async with SqliteCheckpointer.open(tmp_path / "missing" / "dir" / "cp.db"):
            pass


def test_options_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        SqliteCheckpointer(tmp_path / "a.db", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="busy_timeout"):
        SqliteCheckpointer(tmp_path / "a.db", busy_timeout=-1)
    with pytest.raises(ValueError, match="default_ttl"):
        SqliteCheckpointer(tmp_path / "a.db", default_ttl=-1)


async def test_synchronous_full_is_applied(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db", synchronous="FULL") as cp:
        await put_chain(cp, "t", 2)
        conns = await cp._db._connections()
        rows = await conns.writer.execute_fetchall("PRAGMA synchronous")
        assert list(rows) == [(2,)]


async def test_get_is_one_statement_whatever_the_chain_length(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        await put_chain(cp, "short", 2)
        await put_chain(cp, "long", 300)
        await put_chain(cp, "long", 3, ns="sub")
        conns = await cp._db._connections()
        statements: list[str] = []
        await conns.reader.set_trace_callback(statements.append)
        for thread in ("short", "long"):
            statements.clear()
            got = await cp.get(thread)
            assert got is not None
            assert len(statements) == 1, statements
            statements.clear()
            assert len(await cp.list(thread)) in (2, 300)
            assert len(statements) == 1
        got = await cp.get("long")
        assert got is not None and len(got.chain) == 299
        await conns.reader.set_trace_callback(None)


def test_the_aiosqlite_internals_it_relies_on_exist() -> None:
    # checkpointers._sqlite_db runs whole transactions through these; fail loudly if they move.
    assert callable(aiosqlite.Connection._execute)
    assert isinstance(aiosqlite.Connection.__dict__["_conn"], property)


async def test_missing_history_fails_loudly_instead_of_returning_empty_state(
    tmp_path: Path,
) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        cps = await put_chain(cp, "t", 5)
        with raw(db) as conn:
            conn.execute(
                "DELETE FROM graphexec_checkpoints WHERE checkpoint_id = ?",
                (_rows.id_key(cps[1].checkpoint_id),),
            )
        with pytest.raises(CheckpointError, match="is missing"):
            await cp.get("t")
        with raw(db) as conn:
            conn.execute("UPDATE graphexec_checkpoints SET has_snapshot = 0")
            conn.execute("DELETE FROM graphexec_channels WHERE role = 's'")
        with pytest.raises(CheckpointError, match="no snapshot"):
            await cp.get("t", "", cps[0].checkpoint_id)
