"""PostgreSQL round trips per run, and the two paths that save them.

Every round trip costs a run a network hop and (for a write) a commit, so the counts are pinned:
a run of ``n`` steps is ``n + 2`` statements (its lease and first read together, the input
checkpoint, one commit per step, the last one releasing the lease), and concurrent
``put_writes`` of one step share statements (group commit) without changing what each caller
sees.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncIterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from pg import fresh_schema, postgres_dsn

from checkpointers import PostgresCheckpointer
from graphexec import (
    END,
    START,
    CheckpointError,
    Command,
    LeaseLostError,
    PendingWrite,
    Send,
    StateGraph,
    ThreadBusyError,
    interrupt,
)
from graphexec.testing import make_checkpoint, put_chain

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement sent through ``AsyncConnection.execute`` from now on."""
    sent: list[str] = []
    original = psycopg.AsyncConnection.execute

    async def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
    return sent


class Chain(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


class Fan(TypedDict):
    results: Annotated[list[int], operator.add]


class Ask(TypedDict):
    question: str
    answer: str


def _ask(cp: PostgresCheckpointer) -> Any:
    """One node that asks a human (``interrupt``) and stores the answer."""
    b = StateGraph(Ask)
    b.add_node("ask", lambda s: {"answer": interrupt(s["question"])})
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=cp)


def _step(name: str) -> Any:
    return lambda s: {"n": s["n"] + 1, "log": [name]}


def _chain(cp: PostgresCheckpointer) -> tuple[Any, list[str]]:
    """A chain of 5 step nodes, compiled with ``cp``, and its node names."""
    b = StateGraph(Chain)
    names = [f"s{i}" for i in range(5)]
    for name in names:
        b.add_node(name, _step(name))
    b.add_sequence(names)
    b.add_edge(START, names[0])
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp), names


# -- runs ---------------------------------------------------------------------------------------


async def test_a_chain_run_is_one_round_trip_per_step_plus_one(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        graph, names = _chain(cp)
        statements.clear()
        out = await graph.ainvoke({"n": 0, "log": []}, thread_id="t")
        assert out == {"n": 5, "log": names}
        # a new thread: the lease with the input checkpoint, then one per step
        assert len(statements) == 5 + 1, statements
        assert "graphexec_acquire_put" in statements[0]
        statements.clear()
        again = await graph.ainvoke({"n": 0, "log": []}, thread_id="t")  # a settled thread
        assert again["n"] == 5 and len(again["log"]) == 10
        assert len(statements) == 5 + 1, statements
        assert "graphexec_acquire_put" in statements[0]
        statements.clear()
        # another process (no values cached) guesses "new" wrongly: one more
        other, _ = _chain(cp)
        fourth = await other.ainvoke({"n": 0, "log": []}, thread_id="t")
        assert fourth["n"] == 5 and len(fourth["log"]) == 15
        assert len(statements) == 5 + 2, statements
        statements.clear()
        # exit durability: lease + read, then one checkpoint that also releases the lease
        third = await graph.ainvoke({"n": 0, "log": []}, thread_id="t", durability="exit")
        assert third["n"] == 5 and len(third["log"]) == 20
        assert len(statements) == 2, statements


async def test_async_durability_flushes_only_the_last_commit_of_a_run(
    schema: str, statements: list[str]
) -> None:
    """Intermediate commits skip the WAL flush; the last one flushes them all before returning."""
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        graph, names = _chain(cp)
        for durability in ("sync", "exit"):
            statements.clear()
            await graph.ainvoke({"n": 0, "log": []}, thread_id=durability, durability=durability)
            assert not any("synchronous_commit" in q for q in statements), statements
        statements.clear()
        out = await graph.ainvoke({"n": 0, "log": []}, thread_id="a", durability="async")
        assert out == {"n": 5, "log": names}
        assert len(statements) == 5 + 1, statements
        relaxed = ["synchronous_commit" in q for q in statements]
        # the lease with the input checkpoint (flushed), 4 steps (not), the last (flushed)
        assert relaxed == [False, *[True] * 4, False], statements
        got = await cp.get("a")
        assert got is not None and got.checkpoint.step == 5


async def test_an_interrupt_round_trip_is_five_statements(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        graph = _ask(cp)
        statements.clear()
        paused = await graph.arun({"question": "q", "answer": ""}, thread_id="t")
        assert paused.status == "interrupted"
        # the lease with the input checkpoint, the interrupt with the lease's release
        assert len(statements) == 2, statements
        statements.clear()
        done = await graph.ainvoke(Command(resume="a"), thread_id="t")
        assert done["answer"] == "a"
        # lease + read, the answer, the last checkpoint (which releases the lease)
        assert len(statements) == 3, statements


async def test_a_fanout_shares_statements_and_keeps_every_result_in_send_order(
    schema: str, statements: list[str]
) -> None:
    sends = 32
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        b = StateGraph(Fan)
        b.add_node("fan", lambda s: {})
        b.add_node("worker", lambda i: {"results": [i * i]})
        b.add_node("join", lambda s: {})
        b.add_edge(START, "fan")
        b.add_conditional_edges("fan", lambda s: [Send("worker", i) for i in range(sends)])
        b.add_edge("worker", "join")
        b.add_edge("join", END)
        graph = b.compile(checkpointer=cp)
        for k in range(3):
            statements.clear()
            out = await graph.ainvoke({"results": []}, thread_id=f"t{k}")
            assert out["results"] == [i * i for i in range(sends)]
            assert len(statements) <= 5 + sends - 1, statements  # never more than before


# -- group commit of pending writes --------------------------------------------------------------


async def test_concurrent_put_writes_of_one_step_share_a_statement(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="run", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        cid = head.checkpoint_id
        statements.clear()
        await asyncio.gather(
            *(
                cp.put_writes(
                    "t", "", cid, f"task{i}", [("a", b"%d" % i), ("b", b"x")], lease=lease
                )
                for i in range(20)
            )
        )
        # the first goes at once; the 19 that arrive while it is in flight go together
        assert len(statements) == 2, statements
        got = await cp.get("t")
        assert got is not None
        assert got.pending_writes == tuple(
            w
            for i in range(20)
            for w in (PendingWrite(f"task{i}", "a", b"%d" % i), PendingWrite(f"task{i}", "b", b"x"))
        )


async def test_a_task_written_twice_in_one_batch_keeps_order_and_its_last_value(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        [head] = await put_chain(cp, "t", 1)
        cid = head.checkpoint_id
        statements.clear()
        await asyncio.gather(
            cp.put_writes("t", "", cid, "a", [("x", b"1")]),
            cp.put_writes("t", "", cid, "a", [("x", b"2")]),  # waits: same (task, channel)...
            cp.put_writes("t", "", cid, "b", [("y", b"3")]),
            cp.put_writes("t", "", cid, "a", [("x", b"4")]),  # ... and again
        )
        assert len(statements) == 3, statements  # [a1] [a2, b3] [a4]
        got = await cp.get("t")
        assert got is not None
        assert got.pending_writes == (PendingWrite("a", "x", b"4"), PendingWrite("b", "y", b"3"))


async def test_every_caller_of_a_fenced_batch_sees_the_lost_lease(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        old = await cp.acquire_lease("t", owner="old", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=old)
        await cp.release_lease(old)
        await cp.acquire_lease("t", owner="new", ttl=60)
        results = await asyncio.gather(
            *(
                cp.put_writes("t", "", head.checkpoint_id, f"k{i}", [("a", b"1")], lease=old)
                for i in range(5)
            ),
            return_exceptions=True,
        )
        assert all(isinstance(r, LeaseLostError) for r in results), results
        got = await cp.get("t")
        assert got is not None and got.pending_writes == ()


async def test_batches_of_different_steps_or_leases_stay_apart(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        [a] = await put_chain(cp, "a", 1)
        [b] = await put_chain(cp, "b", 1)
        lease = await cp.acquire_lease("b", owner="run", ttl=60)
        results = await asyncio.gather(
            cp.put_writes("a", "", a.checkpoint_id, "k", [("x", b"1")]),
            cp.put_writes("a", "", a.checkpoint_id, "k2", [("x", b"2")]),
            cp.put_writes("b", "", b.checkpoint_id, "k", [("x", b"3")], lease=lease),
            cp.put_writes("b", "", b.checkpoint_id, "k2", [("x", b"4")]),  # no lease: busy
            return_exceptions=True,
        )
        assert results[:3] == [None, None, None]
        assert isinstance(results[3], ThreadBusyError)
        got_a, got_b = await cp.get("a"), await cp.get("b")
        assert got_a is not None and got_b is not None
        assert [w.data for w in got_a.pending_writes] == [b"1", b"2"]
        assert [w.data for w in got_b.pending_writes] == [b"3"]


# -- a run's start ---------------------------------------------------------------------------------


async def test_acquire_lease_and_get_is_one_statement_and_reads_like_get(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        statements.clear()
        lease, tup = await cp.acquire_lease_and_get("new", owner="r1", ttl=60)
        assert len(statements) == 1 and tup is None and lease.epoch == 1
        cps = await put_chain(cp, "new", 5, lease=lease, snapshot_steps={2})
        await cp.put_writes("new", "", cps[-1].checkpoint_id, "k", [("a", b"1")], lease=lease)
        with pytest.raises(ThreadBusyError) as busy:
            await cp.acquire_lease_and_get("new", owner="r2", ttl=60)
        assert busy.value.owner == "r1"
        await cp.release_lease(lease)

        statements.clear()
        lease2, tup2 = await cp.acquire_lease_and_get("new", owner="r2", ttl=60)
        assert len(statements) == 1
        assert lease2.epoch == 2 and lease2.owner == "r2"
        assert tup2 == await cp.get("new")
        await cp.release_lease(lease2)

        lease3, older = await cp.acquire_lease_and_get(
            "new", owner="r3", ttl=60, checkpoint_id=cps[3].checkpoint_id
        )
        assert older == await cp.get("new", "", cps[3].checkpoint_id)
        await cp.release_lease(lease3)

        lease4, since = await cp.acquire_lease_and_get(
            "new", owner="r4", ttl=60, known=cps[3].checkpoint_id
        )
        assert since == await cp.get_since("new", "", None, known=cps[3].checkpoint_id)
        assert since is not None and since.chain == () and since.checkpoint == cps[4]
        assert lease4.epoch == 4


async def test_a_failed_read_leaves_no_lease(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        cps = await put_chain(cp, "t", 3)
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as conn:
            await conn.execute(
                f'DELETE FROM "{schema}".graphexec_checkpoints WHERE checkpoint_id = %s',
                (cps[0].checkpoint_id,),
            )
        with pytest.raises(Exception, match="is missing"):
            await cp.acquire_lease_and_get("t", owner="r1", ttl=60)
        lease = await cp.acquire_lease("t", owner="r2", ttl=60)  # not busy: r1 holds nothing
        assert lease.owner == "r2"


# -- a run that pauses --------------------------------------------------------------------------


async def test_put_writes_final_saves_and_releases_in_one_statement(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="r1", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        statements.clear()
        await cp.put_writes_final("t", "", head.checkpoint_id, "k", [("a", b"1")], lease=lease)
        assert len(statements) == 1, statements
        got = await cp.get("t")
        assert got is not None and got.pending_writes == (PendingWrite("k", "a", b"1"),)
        nxt = await cp.acquire_lease("t", owner="r2", ttl=60)  # free at once
        assert nxt.epoch == lease.epoch + 1
        with pytest.raises(LeaseLostError):
            await cp.put_writes("t", "", head.checkpoint_id, "k", [("a", b"2")], lease=lease)


async def test_put_with_writes_final_is_one_statement(schema: str, statements: list[str]) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="r1", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=lease)
        last = make_checkpoint("t", parent=head)
        statements.clear()
        await cp.put_with_writes_final(
            last, "k", [("a", b"1"), ("a", b"2")], expected_head=head.checkpoint_id, lease=lease
        )
        assert len(statements) == 1, statements
        got = await cp.get("t")
        assert got is not None and got.checkpoint.checkpoint_id == last.checkpoint_id
        assert got.pending_writes == (PendingWrite("k", "a", b"2"),)  # a channel's last write
        nxt = await cp.acquire_lease("t", owner="r2", ttl=60)  # free at once
        assert nxt.epoch == lease.epoch + 1


async def test_an_exit_durability_pause_is_one_statement(
    schema: str, statements: list[str]
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        graph = _ask(cp)
        statements.clear()
        paused = await graph.arun({"question": "ok?"}, thread_id="t", durability="exit")
        assert paused.status == "interrupted"
        assert len(statements) == 2, statements  # the lease with a read, then the pause
        statements.clear()
        done = await graph.arun(Command(resume="yes"), thread_id="t", durability="exit")
        assert done.values == {"question": "ok?", "answer": "yes"}
        assert len(statements) == 2, statements  # the lease with a read, then the last commit


async def test_a_failed_put_writes_final_releases_nothing(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        old = await cp.acquire_lease("t", owner="r1", ttl=60)
        [head] = await put_chain(cp, "t", 1, lease=old)
        with pytest.raises(CheckpointError, match="unknown checkpoint"):
            await cp.put_writes_final("t", "", "nope", "k", [("a", b"1")], lease=old)
        with pytest.raises(ThreadBusyError):  # still held by r1
            await cp.acquire_lease("t", owner="r2", ttl=60)
        await cp.release_lease(old)
        new = await cp.acquire_lease("t", owner="r2", ttl=60)
        with pytest.raises(LeaseLostError):
            await cp.put_writes_final("t", "", head.checkpoint_id, "k", [("a", b"1")], lease=old)
        with pytest.raises(ThreadBusyError):  # the new owner keeps its lease
            await cp.acquire_lease("t", owner="r3", ttl=60)
        await cp.put_writes("t", "", head.checkpoint_id, "k", [("a", b"2")], lease=new)
        got = await cp.get("t")
        assert got is not None and got.pending_writes == (PendingWrite("k", "a", b"2"),)
