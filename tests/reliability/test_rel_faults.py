"""Fault injection: fail the n-th storage call of a run, for n = 1, 2, ... through its last.

SQLite: the statement proxy of ``rel_support`` raises ``disk I/O error``, ``database or disk is
full`` or ``database is locked`` on the n-th statement a run sends (``BEGIN IMMEDIATE``,
``COMMIT``, ``ROLLBACK`` and reads included). PostgreSQL: the n-th statement's backend is
terminated before it runs, or right after it ran and committed (the reply is lost), or the
statement fails with ``disk full`` / ``I/O error``; and transactions (``prune``,
``delete_thread``) lose their backend right after ``COMMIT``.

After each fault: the run did not hang; it either succeeded (retried) or failed with
:class:`~graphexec.StorageError`; the stored thread is exactly some checkpoint of a crash-free
run (old or new, nothing in between); no write lock is left held; the thread resumes to the
crash-free result; and once the store is closed no file descriptor (and, on PostgreSQL, no
server connection) is left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import operator
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from rel_backends import Backend, make_backend
from rel_support import LONG, SEED, SQLITE_FAULTS, STATS, fd_count

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    BaseCheckpointer,
    CompiledGraph,
    InMemoryCheckpointer,
    Send,
    StateGraph,
    StorageError,
)


class S(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


INPUT: S = {"log": [], "n": 0}


def small_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    """``a`` -> two parallel ``p`` -> ``b``: puts, pending writes of parallel tasks, a join."""

    def a(state: S) -> dict[str, Any]:
        return {"log": ["a"], "n": 1}

    async def p(i: int) -> dict[str, Any]:
        await asyncio.sleep(0.001 * i)
        return {"log": [f"p{i}"]}

    def b(state: S) -> dict[str, Any]:
        return {"log": ["b"], "n": state["n"] + len(state["log"])}

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("p", p)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_conditional_edges("a", lambda s: [Send("p", i) for i in range(2)])
    g.add_edge("p", "b")
    g.add_edge("b", END)
    graph = g.compile(checkpointer=cp)
    graph.lease_ttl = 0.3  # a failed release frees the thread quickly
    return graph


async def reference_steps() -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    graph = small_graph(InMemoryCheckpointer())
    final = await graph.ainvoke(INPUT, thread_id="ref")
    by_step = {s.step: dict(s.values) for s in await graph.aget_state_history("ref")}
    return by_step, final


async def check_old_or_new(
    graph: CompiledGraph[Any], thread: str, by_step: dict[int, dict[str, Any]]
) -> str | None:
    state = await graph.aget_state(thread)
    if state is None:
        return None
    if dict(state.values) != by_step.get(state.step):
        return f"after the fault the head (step {state.step}) holds {state.values}"
    steps = [s.step for s in await graph.aget_state_history(thread)]
    if steps[0] != state.step or steps != sorted(set(steps), reverse=True):
        return f"after the fault the history is {steps}"
    return None


async def resume_to_end(
    graph: CompiledGraph[Any], thread: str, final: dict[str, Any]
) -> str | None:
    start = INPUT if await graph.aget_state(thread) is None else None
    done = await asyncio.wait_for(
        graph.ainvoke(start, thread_id=thread, on_busy="wait"), timeout=30
    )
    if done != final:
        return f"resumed to {done}, a fault-free run ends with {final}"
    assert graph.checkpointer is not None
    if len(await graph.checkpointer.list_tips(thread)) != 1:
        return "history forked"
    return None


async def run_with_fault(graph: CompiledGraph[Any], thread: str, durability: str) -> str:
    """Run once; 'done', or 'failed' when a StorageError surfaced (anything else propagates)."""
    try:
        result = await asyncio.wait_for(
            graph.arun(INPUT, thread_id=thread, durability=durability),  # type: ignore[arg-type]
            timeout=30,
        )
    except StorageError:
        return "failed"
    if result.status == "done":
        return "done"
    assert result.status == "failed", result
    error = result.error
    while error is not None and not isinstance(error, StorageError):
        error = error.__cause__  # type: ignore[assignment]
    assert isinstance(error, StorageError), f"failed with {result.error!r}, not a StorageError"
    return "failed"


# -- SQLite ----

SQLITE_ERRORS: dict[str, Callable[[], Exception]] = {
    "io-error": lambda: sqlite3.OperationalError("disk I/O error"),
    "disk-full": lambda: sqlite3.OperationalError("database or disk is full"),
    "locked": lambda: sqlite3.OperationalError("database is locked"),
}


def write_lock_free(db: Path) -> bool:
    with contextlib.closing(sqlite3.connect(db, timeout=0, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        conn.execute("ROLLBACK")
    return True


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize("error", sorted(SQLITE_ERRORS))
async def test_sqlite_nth_statement_fails(tmp_path: Path, error: str, durability: str) -> None:
    by_step, final = await reference_steps()
    db = tmp_path / "faults.db"
    async with SqliteCheckpointer.open(db) as cp:  # schema, and the fault-free statement count
        SQLITE_FAULTS.arm(None, None)
        await small_graph(cp).ainvoke(INPUT, thread_id="count", durability=durability)  # type: ignore[arg-type]
        total = SQLITE_FAULTS.calls
    assert total >= 10
    problems: list[str] = []
    outcomes: dict[str, int] = {"done": 0, "failed": 0}
    for n in range(1, total + 2):
        thread = f"t{n}"
        fds = fd_count()
        cp = SqliteCheckpointer(db)
        try:
            graph = small_graph(cp)
            await cp.setup()
            SQLITE_FAULTS.arm(n, SQLITE_FAULTS_ERRORS[error])
            try:
                outcome = await run_with_fault(graph, thread, durability)
            finally:
                fired = len(SQLITE_FAULTS.fired)
                SQLITE_FAULTS.disarm()
            outcomes[outcome] += 1
            STATS.add("faults", fired, kind=f"faults sqlite {error}")
            if n <= total - 2 and fired != 1:
                problems.append(f"n={n}: the fault did not fire")
            if error == "locked" and outcome != "done":
                problems.append(f"n={n}: a locked database was not retried")
            if not write_lock_free(db):
                problems.append(f"n={n}: the write lock is still held after the fault")
            for p in (
                await check_old_or_new(graph, thread, by_step),
                await resume_to_end(graph, thread, final),
            ):
                if p is not None:
                    problems.append(f"n={n}: {p}")
        finally:
            await cp.aclose()
        if fd_count() != fds:
            problems.append(f"n={n}: {fd_count() - fds} file descriptors leaked")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert not problems, f"seed {SEED}:\n" + "\n".join(problems)
    if error != "locked":
        assert outcomes["failed"] >= total // 3, outcomes  # most faults surfaced as errors


SQLITE_FAULTS_ERRORS = SQLITE_ERRORS


# -- PostgreSQL ----


class PgFaults:
    """Counts the statements stores send through ``Session``; fails the ``fail_at``-th one."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_at: int | None = None
        self.kind = ""
        self.fired = 0

    def arm(self, fail_at: int | None, kind: str) -> None:
        self.calls, self.fail_at, self.kind, self.fired = 0, fail_at, kind, 0

    def hit(self) -> bool:
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            self.fired += 1
            return True
        return False


def terminate(pid: int) -> None:
    from pg import admin_connection

    with admin_connection() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def pg_faults(monkeypatch: pytest.MonkeyPatch) -> PgFaults:
    import psycopg

    from checkpointers._pg_db import Session

    faults = PgFaults()
    original_fetch = Session.fetch
    original_many = Session.execute_many

    async def inject(self: Session, call: Callable[[], Any]) -> Any:
        if not faults.hit():
            return await call()
        kind = faults.kind
        if kind == "disk-full":
            raise psycopg.errors.DiskFull("could not extend file: No space left on device")
        if kind == "io-error":
            raise psycopg.errors.IoError("could not read block 0: read only 0 of 8192 bytes")
        pid = self.conn.info.backend_pid
        if kind == "terminate-before":
            await asyncio.to_thread(terminate, pid)
            return await call()
        rows = await call()  # autocommit: ran and committed; now the reply is lost
        await asyncio.to_thread(terminate, pid)
        await self.conn.execute("SELECT 1")
        return rows  # pragma: no cover - the line above raises

    async def fetch(self: Session, query: str, params: Any = None) -> Any:
        return await inject(self, lambda: original_fetch(self, query, params))

    async def execute_many(self: Session, query: str, params: Any) -> Any:
        return await inject(self, lambda: original_many(self, query, params))

    monkeypatch.setattr(Session, "fetch", fetch)
    monkeypatch.setattr(Session, "execute_many", execute_many)
    return faults


def pg_connections(tag: str, *, settle: float = 5.0) -> int:
    """Server connections of ``tag`` (a terminated backend may linger for a moment: wait)."""
    import time

    from pg import admin_connection

    deadline = time.monotonic() + settle
    while True:
        with admin_connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
            ).fetchone()
        count = int(row[0]) if row else 0
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.02)


def row_locks_free(backend: Backend, thread: str) -> bool:
    """Whether the thread's head and lease rows can be locked (within 2 s: a terminated
    backend releases its locks when its process has exited, a moment after the kill)."""
    from pg import admin_connection

    schema = backend.spec["schema"]
    with admin_connection() as conn:
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '2s'")
                for table in ("heads", "leases"):
                    conn.execute(
                        f'SELECT 1 FROM "{schema}".graphexec_{table} WHERE thread_id = %s '
                        "FOR UPDATE",
                        (thread,),
                    )
        except Exception:
            return False
    return True


@contextlib.asynccontextmanager
async def tagged_store(backend: Backend, tag: str) -> AsyncIterator[BaseCheckpointer]:
    from checkpointers import PostgresCheckpointer

    dsn = backend.spec["dsn"]
    dsn += ("&" if "?" in dsn else "?") + f"application_name={tag}"
    async with PostgresCheckpointer.open(dsn, schema=backend.spec["schema"], pool_min=1) as cp:
        yield cp


PG_CASES = [
    ("terminate-before", "retry"),
    ("terminate-before", "no-retry"),
    ("terminate-after-commit", "retry"),
    ("terminate-after-commit", "no-retry"),
    ("disk-full", "never retried"),
    ("io-error", "never retried"),
]


@pytest.mark.postgres
@pytest.mark.parametrize(("kind", "retries"), PG_CASES)
async def test_postgres_nth_statement_fails(
    tmp_path: Path,
    kind: str,
    retries: str,
    pg_faults: PgFaults,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from checkpointers import _pg_db

    if retries == "no-retry":  # a broken connection surfaces as StorageError
        monkeypatch.setattr(_pg_db, "ATTEMPTS", 1)
    by_step, final = await reference_steps()
    durabilities = ["sync", "async", "exit"] if LONG else ["sync"]
    problems: list[str] = []
    async with make_backend("postgres", tmp_path) as backend:
        for durability in durabilities:
            tag = f"gx-rel-{uuid.uuid4().hex[:10]}"
            async with tagged_store(backend, tag) as cp:
                pg_faults.arm(None, kind)
                await small_graph(cp).ainvoke(INPUT, thread_id=f"count-{durability}")
                total = pg_faults.calls
            assert total >= 5  # the lease with the input, then the steps and pending writes
            for n in range(1, total + 2):
                thread = f"{durability}-t{n}"
                fds = fd_count()
                async with tagged_store(backend, tag) as cp:
                    graph = small_graph(cp)
                    await cp.get("warm-up")  # the pool's first connection, outside the count
                    pg_faults.arm(n, kind)
                    try:
                        outcome = await run_with_fault(graph, thread, durability)
                    finally:
                        fired = pg_faults.fired
                        pg_faults.arm(None, kind)
                    STATS.add("faults", fired, kind=f"faults postgres {kind}")
                    retried = retries == "retry" and kind.startswith("terminate")
                    if retried and outcome != "done":
                        problems.append(f"{durability} n={n}: a broken connection was not retried")
                    if fired and kind in ("disk-full", "io-error") and outcome != "failed":
                        problems.append(f"{durability} n={n}: a {kind} fault was not reported")
                    if not row_locks_free(backend, thread):
                        problems.append(f"{durability} n={n}: a row lock is still held")
                    for p in (
                        await check_old_or_new(graph, thread, by_step),
                        await resume_to_end(graph, thread, final),
                    ):
                        if p is not None:
                            problems.append(f"{durability} n={n}: {p}")
                if fd_count() != fds:
                    problems.append(f"{durability} n={n}: {fd_count() - fds} fds leaked")
                if await asyncio.to_thread(pg_connections, tag):
                    problems.append(f"{durability} n={n}: server connections left open")
        problems += backend.integrity_problems()
    assert not problems, f"seed {SEED}:\n" + "\n".join(problems)


@pytest.mark.postgres
@pytest.mark.parametrize(
    "op",
    ["prune", "delete_thread"],
)
async def test_postgres_transaction_loses_its_backend_right_after_commit(
    tmp_path: Path, op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    fired = 0
    original_exit = psycopg.AsyncTransaction.__aexit__

    async def aexit(self: Any, exc_type: Any, exc: Any, tb: Any) -> Any:
        nonlocal fired
        result = await original_exit(self, exc_type, exc, tb)
        if exc_type is None and fired == 0:
            fired += 1
            conn = self.connection
            await asyncio.to_thread(terminate, conn.info.backend_pid)
            await conn.execute("SELECT 1")  # the COMMIT's reply never came
        return result

    by_step, final = await reference_steps()
    async with make_backend("postgres", tmp_path) as backend:
        tag = f"gx-rel-{uuid.uuid4().hex[:10]}"
        fds = fd_count()
        async with tagged_store(backend, tag) as cp:
            graph = small_graph(cp)
            for i in range(3):
                await graph.ainvoke(INPUT, thread_id=f"t{i}")
            monkeypatch.setattr(psycopg.AsyncTransaction, "__aexit__", aexit)
            if op == "prune":
                deleted = await graph.aprune("t0", keep_last=1)
                assert deleted == len(by_step) - 1  # counted once, though the body ran twice
                state = await graph.aget_state("t0")
                assert state is not None and dict(state.values) == final
            else:
                await graph.adelete_thread("t0")
                assert await graph.aget_state("t0") is None
            monkeypatch.undo()
            assert fired == 1
            STATS.add("faults", fired, kind="faults postgres lost COMMIT reply")
            for i in (1, 2):  # the other threads are untouched
                assert (await graph.aget_state(f"t{i}")).values == final  # type: ignore[union-attr]
        assert fd_count() == fds
        assert await asyncio.to_thread(pg_connections, tag) == 0
        assert backend.integrity_problems() == [] or op == "prune"
