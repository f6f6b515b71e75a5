"""Retention on PostgreSQL: TTL and expire(), prune through a real graph, concurrent sweeps."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pg_worker as worker
import pytest
from pg import admin_connection, fresh_schema, postgres_dsn
from test_sqlite_retention import loop_graph

from checkpointers import Encryption, PostgresCheckpointer
from graphexec import LeaseLostError, SnapshotPolicy
from graphexec.testing import assert_eventually, put_chain

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


def expires_at(schema: str, thread_id: str) -> float | None:
    with admin_connection() as conn:
        row = conn.execute(
            f'SELECT expires_at FROM "{schema}".graphexec_threads WHERE thread_id = %s',
            (thread_id,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])  # type: ignore[arg-type]


def open_store(
    schema: str, **options: Any
) -> contextlib.AbstractAsyncContextManager[PostgresCheckpointer]:
    return PostgresCheckpointer.open(postgres_dsn(), schema=schema, **options)


async def test_expire_deletes_threads_idle_longer_than_their_ttl(schema: str) -> None:
    async with open_store(schema) as cp:
        for thread in ("short", "long", "none"):
            await put_chain(cp, thread, 3)
        await cp.set_ttl("short", 0.05)
        await cp.set_ttl("long", 3600)

        async def short_is_gone() -> int:
            deleted = await cp.expire()
            assert await cp.get("short") is None
            return deleted

        assert await assert_eventually(short_is_gone) == 1
        assert await cp.expire() == 0
        assert {t.thread_id for t in await cp.list_threads()} == {"long", "none"}
    assert worker.integrity_problems(postgres_dsn(), schema) == []


async def test_default_ttl_applies_to_new_threads(schema: str) -> None:
    async with open_store(schema, default_ttl=0.05) as cp:
        await put_chain(cp, "a", 2)
        await put_chain(cp, "kept", 2)
        await cp.set_ttl("kept", None)  # opt out
        assert expires_at(schema, "kept") is None

        async def a_is_gone() -> None:
            await cp.expire()
            assert await cp.get("a") is None

        await assert_eventually(a_is_gone)
        assert await cp.get("kept") is not None
        await put_chain(cp, "a", 1)  # a thread id reused after expiry starts afresh
        assert len(await cp.list("a")) == 1


async def test_a_commit_pushes_expiry_back(schema: str) -> None:
    async with open_store(schema) as cp:
        [head] = await put_chain(cp, "t", 1)
        await cp.set_ttl("t", 1000)
        first = expires_at(schema, "t")
        assert first is not None and first == pytest.approx(head.created_at.timestamp() + 1000)
        await put_chain(cp, "t", 1, after=head)
        later = expires_at(schema, "t")
        assert later is not None and later > first
        await cp.set_ttl("never-written", 10)  # idle from now
        fresh = expires_at(schema, "never-written")
        assert fresh is not None and fresh > first - 1000


async def test_a_live_lease_postpones_expiry_and_stale_owners_stay_fenced(schema: str) -> None:
    async with open_store(schema) as cp:
        lease = await cp.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        await cp.set_ttl("t", 0)
        assert await cp.expire() == 0  # a run owns it
        await cp.release_lease(lease)
        assert await cp.expire() == 1
        # the epoch outlives the thread: the old owner can never write into its new life
        with pytest.raises(LeaseLostError):
            await put_chain(cp, "t", 1, lease=lease)
        fresh = await cp.acquire_lease("t", owner="run-2", ttl=60)
        assert fresh.epoch > lease.epoch
        assert head.checkpoint_id not in {c.checkpoint_id for c in await cp.list("t")}


async def test_set_ttl_validates(schema: str) -> None:
    async with open_store(schema) as cp:
        with pytest.raises(ValueError, match="ttl"):
            await cp.set_ttl("t", -1)


async def test_concurrent_sweeps_and_writers_neither_deadlock_nor_double_count(
    schema: str,
) -> None:
    threads = [f"t{i}" for i in range(250)]  # more than one batch
    async with open_store(schema) as a, open_store(schema) as b:
        await asyncio.gather(*(put_chain(a, t, 2) for t in threads))
        await asyncio.gather(*(a.set_ttl(t, 0) for t in threads[:-10]))
        await asyncio.gather(*(a.set_ttl(t, 3600) for t in threads[-10:]))
        # two sweepers, and writers committing to some of the doomed threads meanwhile
        writers = [put_chain(b, t, 1, after=(await b.list(t))[0]) for t in threads[:20]]
        results = await asyncio.gather(a.expire(), b.expire(), *writers, return_exceptions=True)
        sweeps = results[:2]
        assert all(isinstance(n, int) for n in sweeps), results
        remaining = {t.thread_id for t in await a.list_threads()}
        assert sum(sweeps) + len(remaining) == len(threads)  # type: ignore[arg-type]
        assert set(threads[-10:]) <= remaining
        assert await a.expire() + await b.expire() == len(remaining) - 10
    assert worker.integrity_problems(postgres_dsn(), schema) == []


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("via", ["graph", "store"])
async def test_prune_keeps_every_retained_state_readable(
    schema: str, via: str, encrypted: bool
) -> None:
    # Small snapshots so that retained checkpoints depend on older ones.
    policy = SnapshotPolicy(max_depth=6, ratio=100.0, min_bytes=1 << 30)
    encryption = Encryption(keys={"k": bytes(32)}, active="k") if encrypted else None
    async with open_store(schema, snapshot_policy=policy, encryption=encryption) as cp:
        graph = loop_graph(cp, 40)  # type: ignore[arg-type]  # (any checkpointer works)
        await graph.ainvoke({"n": 0, "log": [], "last": ""}, thread_id="t")
        await graph.ainvoke({"n": 0, "log": [], "last": ""}, thread_id="other")
        before = {s.checkpoint_id: s.values for s in await graph.aget_state_history("t")}
        assert len(before) == 41

        if via == "graph":
            deleted = await graph.aprune("t", keep_last=7)
            assert deleted == 41 - 7  # the oldest kept one got a snapshot: nothing older stays
        else:
            deleted = await cp.prune("t", keep_last=7)
            assert 41 - 7 - 6 <= deleted < 41 - 7  # kept back to the nearest snapshot

        history = await graph.aget_state_history("t")
        assert len(history) == 41 - deleted
        for snapshot in history:
            assert snapshot.values == before[snapshot.checkpoint_id]
            got = await graph.aget_state("t", checkpoint_id=snapshot.checkpoint_id)
            assert got is not None and got.values == snapshot.values
        assert len(await graph.aget_state_history("other")) == 41

        # The thread goes on from its head, and a replay from the oldest retained one works.
        final = await graph.ainvoke(None, thread_id="t")
        assert final == before[history[0].checkpoint_id]
        oldest = history[-1]
        replayed = await graph.ainvoke(None, thread_id="t", checkpoint_id=oldest.checkpoint_id)
        assert replayed["n"] == 40 and replayed["log"] == list(range(40))
    assert worker.integrity_problems(postgres_dsn(), schema, pruned=True) == []
