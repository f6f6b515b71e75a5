"""How a run starts: with new input, the lease and the input's checkpoint are one storage call.

The engine guesses the thread's head without reading it: the settled head it cached when its
last run there ended, or none when it holds no values of the thread (most likely a new one).
Right, the run saves a round trip; wrong (another process, or another graph object, wrote the
thread), it must carry on exactly as the usual start would: input applied once, on the real
head, history unforked.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    Command,
    CompiledGraph,
    InMemoryCheckpointer,
    StateGraph,
    interrupt,
)
from graphexec._checkpoint import Checkpoint, CheckpointTuple, Lease
from graphexec.errors import InvalidUpdateError, ThreadBusyError, ThreadInterruptedError


class Log(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int


class Recording(SqliteCheckpointer):
    """A SQLite checkpointer that records which run-level calls the engine makes."""

    calls: list[str]

    async def acquire_lease_and_get(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("acquire_lease_and_get")
        return await super().acquire_lease_and_get(*args, **kwargs)

    async def acquire_lease_and_put(
        self, checkpoint: Checkpoint, **kwargs: Any
    ) -> tuple[Lease, CheckpointTuple | None, bool]:
        lease, tup, committed = await super().acquire_lease_and_put(checkpoint, **kwargs)
        self.calls.append(f"acquire_lease_and_put:{'committed' if committed else 'head'}")
        return lease, tup, committed

    async def put(self, checkpoint: Checkpoint, **kwargs: Any) -> None:
        self.calls.append("put")
        await super().put(checkpoint, **kwargs)

    async def put_final(self, checkpoint: Checkpoint, **kwargs: Any) -> None:
        self.calls.append("put_final")
        await super().put_final(checkpoint, **kwargs)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Recording]:
    async with Recording.open(tmp_path / "runs.db") as cp:
        cp.calls = []
        yield cp


def _chain(cp: Any, routed: list[str] | None = None) -> CompiledGraph[Any]:
    """``a`` then ``b``; with ``routed``, START goes to ``a`` through a routing function."""
    b = StateGraph(Log)
    b.add_node("a", lambda s: {"log": ["a"], "n": s["n"] + 1})
    b.add_node("b", lambda s: {"log": ["b"], "n": s["n"] + 1})
    if routed is None:
        b.add_edge(START, "a")
    else:

        def route(state: Log) -> str:
            routed.append("route")
            return "a"

        b.add_conditional_edges(START, route, ["a"])
    b.add_edge("a", "b")
    b.add_edge("b", END)
    return b.compile(checkpointer=cp)


async def test_a_new_thread_starts_with_one_storage_call(store: Recording) -> None:
    out = await _chain(store).ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    assert out == {"log": ["in", "a", "b"], "n": 2}
    assert store.calls == ["acquire_lease_and_put:committed", "put", "put_final"]
    # The lease went with the last commit: the thread is free.
    lease = await store.acquire_lease("t", owner="next", ttl=60)
    await store.release_lease(lease)
    history = [s.step for s in await _chain(store).aget_state_history("t")]
    assert history == [2, 1, 0]


async def test_a_settled_thread_continues_with_one_storage_call(store: Recording) -> None:
    """A run ended here: the process knows the head and its values, and starts from them."""
    graph = _chain(store)
    await graph.ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    store.calls.clear()
    out = await graph.ainvoke({"log": ["again"]}, thread_id="t")
    assert out == {"log": ["in", "a", "b", "again", "a", "b"], "n": 4}
    assert store.calls == ["acquire_lease_and_put:committed", "put", "put_final"]
    history = await graph.aget_state_history("t")
    assert [s.step for s in history] == [5, 4, 3, 2, 1, 0]
    assert all(s.parent_id == p.checkpoint_id for s, p in itertools.pairwise(history))


async def test_a_settled_head_that_moved_is_continued_from_the_new_head(
    store: Recording,
) -> None:
    """Another writer moved the head after this process cached it: the guess is refused."""
    graph, other = _chain(store), _chain(store)
    await graph.ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    await other.ainvoke({"log": ["other"]}, thread_id="t")
    store.calls.clear()
    out = await graph.ainvoke({"log": ["again"]}, thread_id="t")
    assert out == {"log": ["in", "a", "b", "other", "a", "b", "again", "a", "b"], "n": 6}
    assert store.calls == ["acquire_lease_and_put:head", "put", "put", "put_final"]
    assert len(await store.list_tips("t")) == 1


async def test_a_deleted_settled_thread_starts_afresh(store: Recording) -> None:
    graph = _chain(store)
    await graph.ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    await store.delete_thread("t")
    out = await graph.ainvoke({"log": ["new"], "n": 10}, thread_id="t")
    assert out == {"log": ["new", "a", "b"], "n": 12}
    assert [s.step for s in await graph.aget_state_history("t")] == [2, 1, 0]


async def test_an_interrupted_thread_starts_the_usual_way(store: Recording) -> None:
    """Cached mid-run (waiting on a human): new input is refused as always."""
    b = StateGraph(Log)
    b.add_node("ask", lambda s: {"log": [interrupt("ok?")]})
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    graph = b.compile(checkpointer=store)
    paused = await graph.arun({"log": [], "n": 0}, thread_id="t")
    assert paused.status == "interrupted"
    store.calls.clear()
    with pytest.raises(ThreadInterruptedError):
        await graph.ainvoke({"log": ["more"]}, thread_id="t")
    assert store.calls == ["acquire_lease_and_get"]
    done = await graph.ainvoke(Command(resume="yes"), thread_id="t")
    assert done["log"] == ["yes"]
    store.calls.clear()
    again = await graph.arun({"log": ["more"]}, thread_id="t")
    assert again.status == "interrupted"
    assert store.calls[0] == "acquire_lease_and_put:committed"


async def test_a_thread_written_elsewhere_is_continued_from_its_head(store: Recording) -> None:
    """A second graph object (no cached values, like another process) guesses wrong."""
    await _chain(store).ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    store.calls.clear()
    other = _chain(store)
    out = await other.ainvoke({"log": ["again"]}, thread_id="t")
    assert out == {"log": ["in", "a", "b", "again", "a", "b"], "n": 4}
    assert store.calls == ["acquire_lease_and_put:head", "put", "put", "put_final"]
    history = await other.aget_state_history("t")
    assert [s.step for s in history] == [5, 4, 3, 2, 1, 0]
    assert all(s.parent_id == p.checkpoint_id for s, p in itertools.pairwise(history))
    assert len(await store.list_tips("t")) == 1
    lease = await store.acquire_lease("t", owner="next", ttl=60)
    await store.release_lease(lease)


async def test_refused_input_on_a_new_thread_writes_nothing(store: Recording) -> None:
    with pytest.raises(InvalidUpdateError, match="n"):
        await _chain(store).ainvoke({"n": "not a number", "log": []}, thread_id="t")
    assert await store.get("t", "") is None
    lease = await store.acquire_lease("t", owner="next", ttl=60)
    await store.release_lease(lease)


async def test_a_busy_new_thread_raises_or_waits(store: Recording) -> None:
    held = await store.acquire_lease("t", owner="someone", ttl=60)
    graph = _chain(store)
    with pytest.raises(ThreadBusyError):
        await graph.ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    assert await store.get("t", "") is None

    async def release_soon() -> None:
        await asyncio.sleep(0.05)
        await store.release_lease(held)

    releaser = asyncio.create_task(release_soon())
    out = await graph.ainvoke({"log": ["in"], "n": 0}, thread_id="t", on_busy="wait")
    await releaser
    assert out == {"log": ["in", "a", "b"], "n": 2}


async def test_a_routing_function_at_start_runs_once(store: Recording) -> None:
    """The guess is not made when a wrong one would call user routing code twice."""
    routed: list[str] = []
    await _chain(store, routed).ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    await _chain(store, routed).ainvoke({"log": ["again"]}, thread_id="t")
    assert routed == ["route", "route"]
    assert "acquire_lease_and_put:head" not in store.calls


@pytest.mark.parametrize("durability", ["async", "exit"])
async def test_other_durability_modes(store: Recording, durability: Any) -> None:
    out = await _chain(store).ainvoke({"log": ["in"], "n": 0}, thread_id="t", durability=durability)
    assert out == {"log": ["in", "a", "b"], "n": 2}
    if durability == "exit":  # the input is committed with everything else, at the end
        assert store.calls == ["acquire_lease_and_get", "put_final"]
    else:
        assert store.calls == ["acquire_lease_and_put:committed", "put", "put_final"]


async def test_a_backend_without_the_one_call_start_keeps_the_usual_start() -> None:
    """In memory, the default acquire_lease_and_put would gain nothing: it is not used."""
    cp = InMemoryCheckpointer()
    out = await _chain(cp).ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    assert out == {"log": ["in", "a", "b"], "n": 2}
    assert len(await cp.list("t")) == 3


async def test_streams_see_the_same_parts(store: Recording) -> None:
    """A started-at-once run streams what a usual start streams: input values, then steps."""
    parts = [
        p
        async for p in _chain(store).astream(
            {"log": ["in"], "n": 0}, thread_id="t", mode=["values", "events"]
        )
    ]
    kinds = [(m, p["event"] if m == "events" else None) for m, p in parts]
    assert kinds[:2] == [("values", None), ("events", "checkpoint")]
    assert parts[0][1] == {"log": ["in"], "n": 0}
    assert [p for m, p in parts if m == "values"][-1] == {"log": ["in", "a", "b"], "n": 2}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["input", "delete", "update"])),
        min_size=1,
        max_size=8,
    )
)
def test_one_call_starts_are_equivalent_to_the_usual_start(
    ops: list[tuple[int, str]],
) -> None:
    """Three graph objects (three caches: three processes) interleave runs, updates and deletes
    on one thread; after every operation the state equals that of one in-memory graph doing the
    same (the in-memory backend always starts the usual way) and the history never forks."""

    async def scenario() -> None:
        reference = _chain(InMemoryCheckpointer())
        with tempfile.TemporaryDirectory() as tmp:
            async with SqliteCheckpointer.open(Path(tmp) / "runs.db") as cp:
                graphs = [_chain(cp) for _ in range(3)]
                for k, (who, op) in enumerate(ops):
                    outs = []
                    for graph in (reference, graphs[who]):
                        if op == "delete":
                            await graph.adelete_thread("t")
                        elif op == "update":
                            if await graph.aget_state("t") is not None:
                                await graph.aupdate_state("t", {"log": [f"u{k}"]}, as_node="b")
                        else:
                            outs.append(
                                await graph.ainvoke({"log": [f"i{k}"], "n": k}, thread_id="t")
                            )
                    assert not outs or outs[0] == outs[1]
                    want = await reference.aget_state("t")
                    got = await graphs[(who + 1) % 3].aget_state("t")
                    assert (want is None) == (got is None)
                    if want is not None and got is not None:
                        assert got.values == want.values and got.step == want.step
                        assert len(await cp.list_tips("t")) == 1

    asyncio.run(scenario())


async def test_a_thread_read_in_this_process_starts_in_one_call(store: Recording) -> None:
    """Reading a settled head (get_state) tells the process what a run writing it would."""
    await _chain(store).ainvoke({"log": ["in"], "n": 0}, thread_id="t")
    other = _chain(store)  # another process: nothing cached
    state = await other.aget_state("t")
    assert state is not None and state.next == ()
    store.calls.clear()
    out = await other.ainvoke({"log": ["again"]}, thread_id="t")
    assert out == {"log": ["in", "a", "b", "again", "a", "b"], "n": 4}
    assert store.calls == ["acquire_lease_and_put:committed", "put", "put_final"]
