"""Retention on SQLite: TTL and expire(), prune through a real graph, delete, VACUUM."""

from __future__ import annotations

import contextlib
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import END, START, CompiledGraph, LeaseLostError, SnapshotPolicy, StateGraph
from graphexec.testing import assert_eventually, put_chain


def expires_at(db: Path, thread_id: str) -> float | None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute(
            "SELECT expires_at FROM graphexec_threads WHERE thread_id = ?", (thread_id,)
        ).fetchone()
    return None if row is None else row[0]


async def test_expire_deletes_threads_idle_longer_than_their_ttl(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
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


async def test_default_ttl_applies_to_new_threads(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db, default_ttl=0.05) as cp:
        await put_chain(cp, "a", 2)
        await put_chain(cp, "kept", 2)
        await cp.set_ttl("kept", None)  # opt out
        assert expires_at(db, "kept") is None

        async def a_is_gone() -> None:
            await cp.expire()
            assert await cp.get("a") is None

        await assert_eventually(a_is_gone)
        assert await cp.get("kept") is not None
        await put_chain(cp, "a", 1)  # a thread id reused after expiry starts afresh
        assert len(await cp.list("a")) == 1


async def test_a_commit_pushes_expiry_back(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        [head] = await put_chain(cp, "t", 1)
        await cp.set_ttl("t", 1000)
        first = expires_at(db, "t")
        assert first is not None and first == pytest.approx(head.created_at.timestamp() + 1000)
        await put_chain(cp, "t", 1, after=head)
        later = expires_at(db, "t")
        assert later is not None and later > first


async def test_a_live_lease_postpones_expiry_and_stale_owners_stay_fenced(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
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


async def test_set_ttl_validates(tmp_path: Path) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
        with pytest.raises(ValueError, match="ttl"):
            await cp.set_ttl("t", -1)


# -- prune through a real graph -----------------------------------------------------------------


class Loop(TypedDict):
    n: int
    log: Annotated[list[int], operator.add]
    last: str


def loop_graph(cp: SqliteCheckpointer, rounds: int) -> CompiledGraph[Any]:
    async def tick(state: Loop) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [state["n"]], "last": f"tick {state['n']}"}

    b = StateGraph(Loop)
    b.add_node("tick", tick)
    b.add_edge(START, "tick")
    b.add_conditional_edges("tick", lambda s: "tick" if s["n"] < rounds else END)
    return b.compile(checkpointer=cp, recursion_limit=200)


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
@pytest.mark.parametrize("via", ["graph", "store"])
async def test_prune_keeps_every_retained_state_readable(
    tmp_path: Path, via: str, encrypted: bool
) -> None:
    db = tmp_path / "cp.db"
    # Small snapshots so that retained checkpoints depend on older ones.
    policy = SnapshotPolicy(max_depth=6, ratio=100.0, min_bytes=1 << 30)
    encryption = Encryption(keys={"k": bytes(32)}, active="k") if encrypted else None
    async with SqliteCheckpointer.open(db, snapshot_policy=policy, encryption=encryption) as cp:
        graph = loop_graph(cp, 40)
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

    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_vacuum_after_prune_shrinks_the_file_and_keeps_the_data(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db) as cp:
        graph = loop_graph(cp, 150)
        for thread in ("a", "b"):
            await graph.ainvoke({"n": 0, "log": [], "last": "x" * 2000}, thread_id=thread)
        await graph.adelete_thread("b")
        await graph.aprune("a", keep_last=2)
        kept = await graph.aget_state("a")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = db.stat().st_size
        conn.execute("VACUUM")
    assert db.stat().st_size < size / 2
    async with SqliteCheckpointer.open(db) as cp:
        again = await loop_graph(cp, 150).aget_state("a")
        assert again is not None and kept is not None and again.values == kept.values
        assert await cp.get("b") is None
