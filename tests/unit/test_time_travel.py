"""Reading history, editing state, replaying, forking, and retention."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    CheckpointError,
    CheckpointNotFoundError,
    CompiledGraph,
    GraphExecError,
    GraphVersionError,
    InMemoryCheckpointer,
    InvalidUpdateError,
    RemoveMessage,
    SnapshotPolicy,
    StateGraph,
    ThreadNotFoundError,
    add_messages,
)


class S(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def step(name: str) -> Any:
    def fn(state: S) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [name]}

    return fn


def build(store: InMemoryCheckpointer | None = None, *, extra: bool = False) -> CompiledGraph:
    b = StateGraph(S)
    names = ["a", "b", "c", "d"] + (["e"] if extra else [])
    for name in names:
        b.add_node(name, step(name))
    b.add_edge(START, "a")
    b.add_sequence(names)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=store or InMemoryCheckpointer())


async def test_get_state_and_history_paging() -> None:
    g = build()
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    state = await g.aget_state("t")
    assert state is not None
    assert state.values == {"n": 4, "log": ["a", "b", "c", "d"]}
    assert state.next == () and state.step == 4 and state.thread_id == "t"
    full = await g.aget_state_history("t")
    assert [h.values["n"] for h in full] == [4, 3, 2, 1, 0]
    assert [h.parent_id for h in full[:-1]] == [h.checkpoint_id for h in full[1:]]
    page1 = await g.aget_state_history("t", limit=2)
    page2 = await g.aget_state_history("t", limit=2, before=page1[-1].checkpoint_id)
    assert [h.values["n"] for h in page1 + page2] == [4, 3, 2, 1]
    assert page1[0].metadata["writes"] == {"d": ["n", "log"]}
    assert await g.aget_state("missing") is None
    assert await g.aget_state("t", checkpoint_id="nope") is None
    assert await g.aget_state_history("missing") == []


async def test_history_reads_across_snapshots() -> None:
    """With a tiny snapshot interval, every checkpoint still reads back exactly."""
    store = InMemoryCheckpointer(snapshot_policy=SnapshotPolicy(max_depth=2, min_bytes=1))
    g = build(store)
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    cps = await store.list("t")
    assert any(c.snapshot is not None for c in cps[:-1])  # snapshots beyond the first
    assert any(c.snapshot is None for c in cps)  # and deltas in between
    history = await g.aget_state_history("t")
    assert [h.values["log"] for h in history] == [
        ["a", "b", "c", "d"],
        ["a", "b", "c"],
        ["a", "b"],
        ["a"],
        [],
    ]
    for h in history:
        again = await g.aget_state("t", checkpoint_id=h.checkpoint_id)
        assert again is not None and again.values == h.values


async def test_checkpoints_store_deltas_not_whole_state() -> None:
    store = InMemoryCheckpointer()
    g = build(store)
    await g.ainvoke({"n": 0, "log": ["x" * 1000]}, thread_id="t")
    cps = await store.list("t")
    head = cps[0]
    assert head.snapshot is None
    assert head.deltas["log"].op == "fold"
    # the reducer channel stored only the update, not the 1 KB list
    assert sum(len(b) for b in head.deltas["log"].blobs) < 20
    assert head.deltas["n"].op == "set"


async def test_update_state_as_node_moves_the_thread_on() -> None:
    g = build()
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    history = await g.aget_state_history("t")
    after_b = next(h for h in history if h.next == ("c",))
    new_id = await g.aupdate_state(
        "t", {"n": 100, "log": ["edited"]}, as_node="c", checkpoint_id=after_b.checkpoint_id
    )
    state = await g.aget_state("t")
    assert state is not None and state.checkpoint_id == new_id
    assert state.values == {"n": 100, "log": ["a", "b", "edited"]}
    assert state.next == ("d",)  # as if c had run
    assert state.metadata["source"] == "update" and state.parent_id == after_b.checkpoint_id
    out = await g.ainvoke(None, thread_id="t")
    assert out == {"n": 101, "log": ["a", "b", "edited", "d"]}
    branches = await g.alist_branches("t")
    assert len(branches) == 2 and sum(b.is_head for b in branches) == 1


async def test_update_state_without_as_node_keeps_next_and_end_finishes() -> None:
    g = build()
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    history = await g.aget_state_history("t")
    mid = next(h for h in history if h.next == ("b",))
    await g.aupdate_state("t", {"n": 50}, checkpoint_id=mid.checkpoint_id)
    state = await g.aget_state("t")
    assert state is not None and state.next == ("b",) and state.values["n"] == 50
    await g.aupdate_state("t", {"log": ["stop"]}, as_node=END)
    state = await g.aget_state("t")
    assert state is not None and state.next == ()
    assert await g.ainvoke(None, thread_id="t") == state.values  # nothing left to run


async def test_update_state_validates() -> None:
    g = build()
    with pytest.raises(ThreadNotFoundError):
        await g.aupdate_state("nope", {"n": 1})
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    with pytest.raises(InvalidUpdateError) as err:
        await g.aupdate_state("t", {"n": "x"})
    assert err.value.key == "n"
    with pytest.raises(GraphExecError, match="no such node"):
        await g.aupdate_state("t", {"n": 1}, as_node="zzz")
    with pytest.raises(CheckpointNotFoundError):
        await g.aupdate_state("t", {"n": 1}, checkpoint_id="nope")


async def test_replay_from_checkpoint_reruns_only_later_steps() -> None:
    calls: list[str] = []

    def tracked(name: str) -> Any:
        def fn(state: S) -> dict[str, Any]:
            calls.append(name)
            return {"n": state["n"] + 1, "log": [name]}

        return fn

    b = StateGraph(S)
    for name in "abcd":
        b.add_node(name, tracked(name))
    b.add_edge(START, "a")
    b.add_sequence(list("abcd"))
    b.add_edge("d", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    history = await g.aget_state_history("t")
    before_c = next(h for h in history if h.next == ("c",))
    calls.clear()
    out = await g.ainvoke(None, thread_id="t", checkpoint_id=before_c.checkpoint_id)
    assert calls == ["c", "d"]
    assert out == {"n": 4, "log": ["a", "b", "c", "d"]}
    new_history = await g.aget_state_history("t")
    assert new_history[2].checkpoint_id == before_c.checkpoint_id  # branch parent is c
    assert new_history[0].checkpoint_id != history[0].checkpoint_id
    with pytest.raises(CheckpointNotFoundError):
        await g.ainvoke(None, thread_id="t", checkpoint_id="missing")


async def test_fork_copies_state_and_leaves_source_alone() -> None:
    g = build()
    await g.ainvoke({"n": 0, "log": []}, thread_id="src")
    history = await g.aget_state_history("src")
    mid = next(h for h in history if h.next == ("c",))
    first = await g.afork("src", mid.checkpoint_id, "copy")
    forked = await g.aget_state("copy")
    assert forked is not None and forked.checkpoint_id == first
    assert forked.values == mid.values and forked.next == ("c",)
    assert forked.metadata["forked_from"] == {
        "thread_id": "src",
        "checkpoint_id": mid.checkpoint_id,
    }
    await g.aupdate_state("copy", {"log": ["fork"]})
    out = await g.ainvoke(None, thread_id="copy")
    assert out["log"] == ["a", "b", "fork", "c", "d"]
    assert [h.checkpoint_id for h in await g.aget_state_history("src")] == [
        h.checkpoint_id for h in history
    ]
    with pytest.raises(CheckpointError, match="already exists"):
        await g.afork("src", mid.checkpoint_id, "copy")
    with pytest.raises(CheckpointNotFoundError):
        await g.afork("src", "nope", "copy2")
    threads = {t.thread_id for t in await g.alist_threads()}
    assert threads == {"src", "copy"}


async def test_prune_and_delete() -> None:
    store = InMemoryCheckpointer(snapshot_policy=SnapshotPolicy(max_depth=3, min_bytes=10**9))
    g = build(store)
    await g.ainvoke({"n": 0, "log": []}, thread_id="t")
    await g.ainvoke({"n": 10, "log": []}, thread_id="t")
    before = await g.aget_state_history("t")
    deleted = await g.aprune("t", keep_last=2)
    assert deleted > 0
    after = await g.aget_state_history("t")
    assert len(after) >= 2 and len(after) < len(before)
    for kept in after:
        again = await g.aget_state("t", checkpoint_id=kept.checkpoint_id)
        match = next(b for b in before if b.checkpoint_id == kept.checkpoint_id)
        assert again is not None and again.values == match.values
    assert (await g.ainvoke({"n": 0, "log": []}, thread_id="t"))["n"] == 4  # still usable
    await g.adelete_thread("t")
    assert await g.aget_state("t") is None


async def test_graph_version_change_with_missing_node_refuses_resume() -> None:
    store = InMemoryCheckpointer()
    g_old = build(store, extra=True)
    await g_old.ainvoke({"n": 0, "log": []}, thread_id="t")
    # move the thread back so that "e" is next, then resume with a graph without "e"
    history = await g_old.aget_state_history("t")
    before_e = next(h for h in history if h.next == ("e",))
    await g_old.aupdate_state("t", {"n": 0}, checkpoint_id=before_e.checkpoint_id)
    g_new = build(store)
    assert g_new.version != g_old.version
    with pytest.raises(GraphVersionError) as err:
        await g_new.ainvoke(None, thread_id="t")
    assert err.value.missing_nodes == ("e",)
    # the same change is fine when the pending nodes still exist
    before_d = next(h for h in history if h.next == ("d",))
    await g_old.aupdate_state("t", {"n": 0}, checkpoint_id=before_d.checkpoint_id)
    assert (await g_new.ainvoke(None, thread_id="t"))["log"][-1] == "d"


async def test_new_input_on_unfinished_thread_starts_over_from_start() -> None:
    fail = {"on": True}

    def c(state: S) -> dict[str, Any]:
        if fail["on"]:
            raise RuntimeError("c broke")
        return {"n": state["n"] + 1, "log": ["c"]}

    b = StateGraph(S)
    b.add_node("a", step("a"))
    b.add_node("c", c)
    b.add_edge(START, "a")
    b.add_edge("a", "c")
    b.add_edge("c", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    assert (await g.arun({"n": 0, "log": []}, thread_id="t")).status == "failed"
    fail["on"] = False
    out = await g.ainvoke({"n": 0, "log": ["again"]}, thread_id="t")
    assert out == {"n": 2, "log": ["a", "again", "a", "c"]}


class Chat(TypedDict):
    messages: Annotated[list[dict[str, Any]], add_messages]
    log: Annotated[list[str], operator.add]
    n: int


async def test_batched_folds_read_back_exactly() -> None:
    """Reads fold concatenating reducers in one call; the result must equal step-by-step."""

    def turn(state: Chat) -> dict[str, Any]:
        n = state["n"] + 1
        update: list[Any] = [{"role": "user", "content": f"q{n}", "id": f"u{n}"}]
        if n % 3 == 0:
            update.append({"role": "user", "content": f"edited q{n - 1}", "id": f"u{n - 1}"})
        if n % 5 == 0:
            update.append(RemoveMessage(id=f"u{n - 2}"))
        return {"messages": update, "log": [f"t{n}"], "n": n}

    b = StateGraph(Chat)
    b.add_node("turn", turn)
    b.add_edge(START, "turn")
    b.add_conditional_edges("turn", lambda s: END if s["n"] >= 40 else "turn", ["turn", END])
    store = InMemoryCheckpointer(snapshot_policy=SnapshotPolicy(max_depth=1000, min_bytes=10**9))
    g = b.compile(checkpointer=store, recursion_limit=100)
    out = await g.ainvoke({"messages": [], "log": [], "n": 0}, thread_id="t")
    state = await g.aget_state("t")
    assert state is not None and state.values == out
    # every historical state also matches a step-by-step fold of the same deltas
    history = await g.aget_state_history("t")
    assert [h.values["n"] for h in history] == list(range(40, -1, -1))
    for h in history[::7]:
        again = await g.aget_state("t", checkpoint_id=h.checkpoint_id)
        assert again is not None and again.values == h.values
