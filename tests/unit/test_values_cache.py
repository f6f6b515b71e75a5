"""The compiled graph's head-values cache is never stale and never aliased.

Every read through a graph that has cached a thread's values is compared with a read through a
fresh graph on the same store (no cache): they must be equal whatever happened to the thread in
between -- another writer (a second graph object stands for a second process), update_state,
replays and branches, forks, prune, delete and re-create, TTL expiry, and callers or reducers
mutating what they were given.
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, StateGraph, add_messages


class S(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def _step(state: S) -> dict[str, Any]:
    return {"n": state["n"] + 1, "log": [f"step-{state['n']}"]}


def build(store: InMemoryCheckpointer) -> CompiledGraph[Any]:
    b = StateGraph(S)
    b.add_node("step", _step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    return b.compile(checkpointer=store)


async def assert_fresh(graph: CompiledGraph[Any], thread_id: str) -> dict[str, Any]:
    """``graph``'s (possibly cached) read equals a cache-free read; returns the values."""
    got = await graph.aget_state(thread_id)
    want = await graph.with_checkpointer(graph.checkpointer).aget_state(thread_id)
    assert (got is None) == (want is None)
    if got is None or want is None:
        return {}
    assert got.values == want.values
    assert got.checkpoint_id == want.checkpoint_id
    return got.values


async def test_reads_see_another_writers_commits() -> None:
    store = InMemoryCheckpointer()
    a, b = build(store), build(store)
    await a.ainvoke({"n": 0, "log": []}, thread_id="t")
    assert (await assert_fresh(a, "t"))["n"] == 1
    for _ in range(3):
        await b.ainvoke({"n": 10, "log": ["b"]}, thread_id="t")
    values = await assert_fresh(a, "t")
    assert values["n"] == 11 and values["log"].count("b") == 3
    out = await a.ainvoke({"n": 20, "log": ["a"]}, thread_id="t")
    assert out["log"] == values["log"] + ["a", "step-20"]
    await assert_fresh(a, "t")


async def test_update_state_and_branches_by_another_graph() -> None:
    store = InMemoryCheckpointer()
    a, b = build(store), build(store)
    for i in range(4):
        await a.ainvoke({"n": i, "log": [str(i)]}, thread_id="t")
    await assert_fresh(a, "t")
    await b.aupdate_state("t", {"log": ["edited"]})
    assert (await assert_fresh(a, "t"))["log"][-1] == "edited"
    history = await a.aget_state_history("t")
    old = history[3]
    await b.aupdate_state("t", {"n": 99}, checkpoint_id=old.checkpoint_id)
    values = await assert_fresh(a, "t")
    assert values["n"] == 99 and values["log"] == old.values["log"]
    # a replay from an older checkpoint by the cached graph itself moves the head to a branch
    await a.ainvoke(None, thread_id="t", checkpoint_id=history[5].checkpoint_id)
    await assert_fresh(a, "t")
    await assert_fresh(b, "t")


async def test_fork_prune_delete_and_recreate() -> None:
    store = InMemoryCheckpointer()
    a, b = build(store), build(store)
    for i in range(5):
        await a.ainvoke({"n": i, "log": [str(i)]}, thread_id="t")
    head = await a.aget_state("t")
    assert head is not None
    history = await a.aget_state_history("t")
    await b.afork("t", history[4].checkpoint_id, "t2")
    assert (await assert_fresh(a, "t2")) == history[4].values
    await a.ainvoke({"n": 0, "log": ["fork"]}, thread_id="t2")
    await assert_fresh(a, "t2")
    await assert_fresh(a, "t")

    await b.aprune("t", keep_last=1)
    await assert_fresh(a, "t")
    await a.ainvoke({"n": 7, "log": ["after-prune"]}, thread_id="t")
    assert (await assert_fresh(a, "t"))["log"][-2:] == ["after-prune", "step-7"]

    await b.adelete_thread("t")
    assert await a.aget_state("t") is None
    await b.ainvoke({"n": 100, "log": ["new"]}, thread_id="t")
    assert (await assert_fresh(a, "t"))["log"] == ["new", "step-100"]


async def test_ttl_expiry_then_recreate() -> None:
    store = InMemoryCheckpointer()
    a, b = build(store), build(store)
    await a.ainvoke({"n": 1, "log": ["old"]}, thread_id="t")
    await assert_fresh(a, "t")
    await store.set_ttl("t", 0)
    assert await store.expire() == 1
    assert await a.aget_state("t") is None
    await b.ainvoke({"n": 5, "log": ["new"]}, thread_id="t")
    assert (await assert_fresh(a, "t"))["log"] == ["new", "step-5"]
    out = await a.ainvoke({"n": 6, "log": []}, thread_id="t")
    assert out["log"] == ["new", "step-5", "step-6"]


async def test_mutating_results_does_not_change_later_reads() -> None:
    store = InMemoryCheckpointer()
    a = build(store)
    out = await a.ainvoke({"n": 0, "log": ["x"]}, thread_id="t")
    out["log"].append("mutated result")
    snap = await a.aget_state("t")
    assert snap is not None
    snap.values["log"].append("mutated snapshot")
    snap.values["n"] = -1
    values = await assert_fresh(a, "t")
    assert values == {"n": 1, "log": ["x", "step-0"]}
    again = await a.ainvoke({"n": 1, "log": []}, thread_id="t")
    assert again["log"] == ["x", "step-0", "step-1"]


def _extend_in_place(current: list[str], update: list[str]) -> list[str]:
    current.extend(update)  # a careless reducer: mutates the value it was given
    return current


class Careless(TypedDict):
    log: Annotated[list[str], _extend_in_place]


async def test_a_reducer_mutating_in_place_does_not_corrupt_the_cache() -> None:
    def node(state: Careless) -> dict[str, Any]:
        state["log"].append("node mutated its input")  # never stored: not an update
        return {"log": ["node"]}

    b = StateGraph(Careless)
    b.add_node("node", node)
    b.add_edge(START, "node")
    b.add_edge("node", END)
    store = InMemoryCheckpointer()
    graph = b.compile(checkpointer=store)
    for i in range(3):
        await graph.ainvoke({"log": [f"in-{i}"]}, thread_id="t")
        await assert_fresh(graph, "t")


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


async def test_message_history_through_the_cache() -> None:
    def reply(state: Chat) -> dict[str, Any]:
        return {"messages": [{"role": "assistant", "content": str(len(state["messages"]))}]}

    b = StateGraph(Chat)
    b.add_node("reply", reply)
    b.add_edge(START, "reply")
    b.add_edge("reply", END)
    store = InMemoryCheckpointer()
    graph = b.compile(checkpointer=store)
    other = b.compile(checkpointer=store)
    for turn in range(30):
        writer = other if turn % 7 == 3 else graph
        await writer.ainvoke({"messages": [{"role": "user", "content": "hi"}]}, thread_id="t")
        values = await assert_fresh(graph, "t")
        assert len(values["messages"]) == 2 * (turn + 1)
