"""Broken connections: backends terminated (``pg_terminate_backend``) at chosen and random moments.

Whatever breaks, PostgreSQL rolls back what was not committed, the pool replaces the dead
connection, the operation is retried (or fails with ``StorageError`` naming it) and the next call
works. The state is always either the old one or the new one, never something in between.
"""

from __future__ import annotations

import asyncio
import operator
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, TypedDict

import pg_worker as worker
import pytest
from pg import admin_connection, fresh_schema, postgres_dsn

from checkpointers import PostgresCheckpointer, _pg_db
from checkpointers import _sql as sql
from checkpointers import postgres as pg_backend
from checkpointers._pg_db import Session
from graphexec import END, START, CompiledGraph, StateGraph, StorageError
from graphexec.testing import assert_eventually, make_checkpoint, put_chain

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


@pytest.fixture
def tag() -> str:
    """An ``application_name`` that identifies the backends of the store under test."""
    return f"gx-fault-{uuid.uuid4().hex[:10]}"


def tagged(tag: str) -> str:
    dsn = postgres_dsn()
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={tag}"


def terminate(*, tag: str | None = None, pid: int | None = None) -> int:
    """Terminate the server backends of ``tag`` (or one by pid); how many were terminated.

    Backends still logging in are spared: a connection attempt that fails makes the pool back
    off for seconds, which is its business, not the checkpointer's.
    """
    with admin_connection() as conn:
        if pid is not None:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return 1
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s "
            "AND backend_start < clock_timestamp() - interval '100 milliseconds'",
            (tag,),
        ).fetchall()
    return len(rows)


def dump(schema: str) -> dict[str, list[Any]]:
    """Every row of every table of the store (to compare before and after a failure)."""
    out = {}
    with admin_connection() as conn:
        for table in ("checkpoints", "channels", "heads", "writes", "leases", "threads"):
            rows = conn.execute(f'SELECT * FROM "{schema}".graphexec_{table}').fetchall()
            out[table] = sorted(rows, key=repr)
    return out


class KillSwitch:
    """Terminates a session's own backend around the statements ``matches`` selects.

    ``before``: the statement then runs on a dead connection. ``after``: it ran (and, in
    autocommit, committed), then the connection dies before the caller hears back -- a lost
    reply. ``times`` bounds how often (``None``: every time).
    """

    def __init__(self, matches: Callable[[str], bool], *, when: str, times: int | None) -> None:
        self.matches = matches
        self.when = when
        self.left = times
        self.fired = 0

    def armed(self, query: str) -> bool:
        if not self.matches(query) or self.left == 0:
            return False
        if self.left is not None:
            self.left -= 1
        self.fired += 1
        return True


@pytest.fixture
def kill_switch(monkeypatch: pytest.MonkeyPatch) -> Callable[..., KillSwitch]:
    original = Session.fetch

    def install(
        matches: Callable[[str], bool], *, when: str = "before", times: int | None = 1
    ) -> KillSwitch:
        switch = KillSwitch(matches, when=when, times=times)

        async def fetch(self: Session, query: str, params: Any = None) -> Any:
            if not switch.armed(query):
                return await original(self, query, params)
            pid = self.conn.info.backend_pid
            if switch.when == "before":
                await asyncio.to_thread(terminate, pid=pid)
                return await original(self, query, params)
            rows = await original(self, query, params)
            await asyncio.to_thread(terminate, pid=pid)
            await self.conn.execute("SELECT 1")  # the reply that never came
            return rows  # pragma: no cover - the line above raises

        monkeypatch.setattr(Session, "fetch", fetch)
        return switch

    return install


# -- chosen moments ------------------------------------------------------------------------------


async def test_idle_pooled_connections_terminated_are_replaced_without_errors(
    schema: str, tag: str
) -> None:
    async with PostgresCheckpointer.open(tagged(tag), schema=schema, pool_min=3) as cp:
        cps = await put_chain(cp, "t", 3)
        await assert_eventually(lambda: _expect(terminate(tag=tag) >= 1))
        # every pooled connection is dead now; each call notices, retries and succeeds
        more = await put_chain(cp, "t", 2, after=cps[-1])
        got = await cp.get("t")
        assert got is not None and got.checkpoint.checkpoint_id == more[-1].checkpoint_id
        assert len(await cp.list("t")) == 5
        terminate(tag=tag)
        lease = await cp.acquire_lease("t", owner="run", ttl=60)
        await cp.release_lease(lease)


async def _expect(condition: bool) -> None:
    assert condition


async def test_a_put_whose_reply_is_lost_after_commit_is_recognised_as_done(
    schema: str, kill_switch: Callable[..., KillSwitch]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="run", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        switch = kill_switch(lambda q: q == pg_backend._PUT, when="after")
        child = make_checkpoint("t", parent=head)
        await cp.put(child, expected_head=head.checkpoint_id, lease=lease)  # no error
        assert switch.fired == 1
        got = await cp.get("t")
        assert got is not None and got.checkpoint == child
        assert [c.checkpoint_id for c in await cp.list("t")] == [
            child.checkpoint_id,
            head.checkpoint_id,
        ]
    assert worker.integrity_problems(postgres_dsn(), schema) == []


async def test_a_pause_whose_reply_is_lost_after_commit_is_recognised_as_done(
    schema: str, kill_switch: Callable[..., KillSwitch]
) -> None:
    """put_with_writes_final committed (checkpoint, writes, release), then the reply was lost:
    the retry finds the lease released but the checkpoint its own, and reports success."""
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="run", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        switch = kill_switch(lambda q: q == pg_backend._PUT_WITH_WRITES_FINAL, when="after")
        child = make_checkpoint("t", parent=head)
        await cp.put_with_writes_final(
            child, "k", [("a", b"1")], expected_head=head.checkpoint_id, lease=lease
        )  # no error
        assert switch.fired == 1
        got = await cp.get("t")
        assert got is not None and got.checkpoint == child
        assert [(w.task_id, w.channel, w.data) for w in got.pending_writes] == [("k", "a", b"1")]
        again = await cp.acquire_lease("t", owner="next", ttl=60)  # released by the first try
        assert again.epoch == lease.epoch + 1
    assert worker.integrity_problems(postgres_dsn(), schema) == []


async def test_a_put_killed_before_it_ran_is_retried(
    schema: str, kill_switch: Callable[..., KillSwitch]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        [head] = await put_chain(cp, "t", 1)
        switch = kill_switch(lambda q: q == pg_backend._PUT, times=2)
        child = make_checkpoint("t", parent=head)
        await cp.put(child, expected_head=head.checkpoint_id)
        assert switch.fired == 2  # third time lucky
        got = await cp.get("t")
        assert got is not None and got.checkpoint == child


async def test_a_transaction_killed_midway_is_rolled_back_and_retried(
    schema: str, kill_switch: Callable[..., KillSwitch]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        cps = await put_chain(cp, "t", 12, snapshot_steps={0})
        await put_chain(cp, "t", 3, ns="sub")
        # killed after the rebase statements, before the doomed checkpoints are computed
        switch = kill_switch(lambda q: q == sql.PRUNE_DOOMED, times=1)
        deleted = await cp.prune(
            "t", keep_last=4, rebase=(cps[-4].checkpoint_id, {"counter": b"1", "notes": b""})
        )
        assert switch.fired == 1
        assert deleted == 8  # the retry saw the original rows: the rebase happened once
        assert len(await cp.list("t")) == 4
        oldest = await cp.get("t", "", cps[-4].checkpoint_id)
        assert oldest is not None and oldest.checkpoint.snapshot == {"counter": b"1", "notes": b""}
    assert worker.integrity_problems(postgres_dsn(), schema, pruned=True) == []


async def test_a_transaction_killed_every_time_raises_and_writes_nothing(
    schema: str, kill_switch: Callable[..., KillSwitch]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        cps = await put_chain(cp, "t", 12, snapshot_steps={0})
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task", [("x", b"1")])
        before = dump(schema)
        switch = kill_switch(lambda q: q == sql.PRUNE_DOOMED, times=None)
        with pytest.raises(
            StorageError, match=r"PostgreSQL prune on .* failed \(after 3 attempts\)"
        ):
            await cp.prune("t", keep_last=2, rebase=(cps[-2].checkpoint_id, {"counter": b"1"}))
        assert switch.fired == 3
        assert dump(schema) == before  # nothing half-written: no rebase, nothing deleted
        switch.left = 0  # the network is back
        assert await cp.prune("t", keep_last=2, rebase=(cps[-2].checkpoint_id, {})) == 10
        assert len(await cp.list("t")) == 2
        switch2 = kill_switch(lambda q: q == sql.DELETE_THREAD[2], times=None)
        with pytest.raises(StorageError, match="delete_thread"):
            await cp.delete_thread("t")
        assert switch2.fired == 3
        assert len(await cp.list("t")) == 2
        switch2.left = 0
        await cp.delete_thread("t")
        assert await cp.get("t") is None
    assert worker.integrity_problems(postgres_dsn(), schema, pruned=True) == []


async def test_a_put_waiting_for_a_lock_is_terminated_and_retried(schema: str, tag: str) -> None:
    async with PostgresCheckpointer.open(tagged(tag), schema=schema) as cp:
        [head] = await put_chain(cp, "t", 1)
        child = make_checkpoint("t", parent=head)
        with admin_connection() as blocker:
            with blocker.transaction():
                blocker.execute(
                    f'SELECT 1 FROM "{schema}".graphexec_heads WHERE thread_id = %s FOR UPDATE',
                    ("t",),
                )
                put = asyncio.create_task(cp.put(child, expected_head=head.checkpoint_id))

                async def waiting_on_the_lock() -> int:
                    with admin_connection() as conn:
                        row = conn.execute(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = %s "
                            "AND wait_event_type = 'Lock'",
                            (tag,),
                        ).fetchone()
                    assert row is not None and isinstance(row[0], int)
                    return row[0]

                pid = await assert_eventually(waiting_on_the_lock)
                terminate(pid=pid)  # mid-statement, holding the lease row's lock
                await asyncio.sleep(0.05)
            # the blocker commits; the retried put goes through
        await put
        got = await cp.get("t")
        assert got is not None and got.checkpoint == child
        assert len(await cp.list("t")) == 2
    assert worker.integrity_problems(postgres_dsn(), schema) == []


# -- random moments ------------------------------------------------------------------------------


class Steps(TypedDict):
    n: int
    log: Annotated[list[int], operator.add]


def steps_graph(cp: PostgresCheckpointer, steps: int) -> CompiledGraph[Any]:
    async def step(state: Steps) -> dict[str, Any]:
        await asyncio.sleep(random.uniform(0, 0.002))
        return {"n": state["n"] + 1, "log": [state["n"]]}

    b = StateGraph(Steps)
    b.add_node("step", step)
    b.add_edge(START, "step")
    b.add_conditional_edges("step", lambda s: "step" if s["n"] < steps else END)
    graph = b.compile(checkpointer=cp, recursion_limit=100)
    graph.lease_ttl = 1.0  # a run that failed mid-way frees its thread quickly
    return graph


@pytest.mark.parametrize("attempts", [1, _pg_db.ATTEMPTS], ids=["no-retry", "retry"])
async def test_backends_terminated_at_random_moments_during_runs(
    schema: str, tag: str, attempts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without retries most kills surface as failed runs, which must leave resumable threads.
    monkeypatch.setattr(_pg_db, "ATTEMPTS", attempts)
    steps, threads = 8, 16
    rng = random.Random(5)
    async with PostgresCheckpointer.open(tagged(tag), schema=schema, pool_max=4) as cp:
        graph = steps_graph(cp, steps)
        stop = asyncio.Event()
        kills = 0

        async def killer() -> None:
            nonlocal kills
            while not stop.is_set():
                await asyncio.sleep(rng.uniform(0.005, 0.04))
                kills += await asyncio.to_thread(terminate, tag=tag)

        async def run(i: int) -> str:
            try:
                await graph.ainvoke({"n": 0, "log": []}, thread_id=f"t{i}")
                return "done"
            except StorageError:
                return "storage error"

        chaos = asyncio.create_task(killer())
        outcomes: list[str] = []
        while len(outcomes) < threads or (kills < 10 and len(outcomes) < 4 * threads):
            outcomes.append(await run(len(outcomes)))
        stop.set()
        await chaos
        assert kills >= 10, "the killer hardly ran"
        assert set(outcomes) <= {"done", "storage error"}
        if attempts == 1:
            assert outcomes.count("storage error") >= 3, outcomes
        monkeypatch.undo()  # the network is back

        # Every thread is either untouched or resumable, and finishes like an uninterrupted run.
        for i in range(len(outcomes)):
            tid = f"t{i}"
            if await cp.get(tid) is None:  # failed before its first commit
                await graph.ainvoke({"n": 0, "log": []}, thread_id=tid, on_busy="wait")
            else:
                await graph.ainvoke(None, thread_id=tid, on_busy="wait")
            state = await graph.aget_state(tid)
            assert state is not None
            assert state.values == {"n": steps, "log": list(range(steps))}, tid
            assert len(await cp.list_tips(tid)) == 1, f"{tid}: history forked"
            history = [s.step for s in await graph.aget_state_history(tid)]
            assert history == sorted(set(history), reverse=True)
    assert worker.integrity_problems(postgres_dsn(), schema) == []
