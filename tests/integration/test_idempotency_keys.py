"""``ctx.idempotency_key``: the same for the same task across crashes, distinct for new work.

A key is derived from the run's anchor (the checkpoint a run's input landed on plus the input's
bytes, carried in every checkpoint's frontier) and the task's step and place. These tests pin
both halves of the contract: a lost run started again with the same input -- modelled by running
on a byte-for-byte copy of the database taken before the first run -- sees the same keys in every
durability mode; replays, ``update_state`` branches, forks, later runs and runs without a
checkpointer never reuse a key.
"""

from __future__ import annotations

import operator
import shutil
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    NodeContext,
    Send,
    StateGraph,
    interrupt,
)


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    topic: str


KeyLog = list[tuple[str, str]]


def chain(store: BaseCheckpointer | None, keys: KeyLog) -> CompiledGraph[S]:
    """``a -> fan out to w (x3) -> b``, recording ``(node:arg, key)`` for every task run."""

    def a(state: S, ctx: NodeContext) -> Command:
        keys.append(("a", ctx.idempotency_key))
        return Command(update={"log": ["a"]}, goto=[Send("w", i) for i in range(3)])

    def w(i: int, ctx: NodeContext) -> dict[str, Any]:
        keys.append((f"w{i}", ctx.idempotency_key))
        return {"log": [f"w{i}"]}

    def b(state: S, ctx: NodeContext) -> dict[str, Any]:
        keys.append(("b", ctx.idempotency_key))
        return {"log": ["b"]}

    g = StateGraph(S)
    g.add_node("a", a, destinations=["w"])
    g.add_node("w", w)
    g.add_node("b", b)
    g.add_edge(START, "a")
    g.add_edge("w", "b")
    g.add_edge("b", END)
    return g.compile(checkpointer=store)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_a_lost_run_started_again_gets_the_same_keys(tmp_path: Path, durability: Any) -> None:
    db = tmp_path / "a.db"
    keys: KeyLog = []
    async with SqliteCheckpointer.open(db) as cp:
        await chain(cp, keys).ainvoke({"log": ["earlier"]}, thread_id="t")
    shutil.copy(db, tmp_path / "b.db")  # the thread as it was when the lost run began
    runs: list[KeyLog] = []
    for name in ("a.db", "b.db"):
        keys = []
        async with SqliteCheckpointer.open(tmp_path / name) as cp:
            out = await chain(cp, keys).ainvoke(
                {"log": ["again"]}, thread_id="t", durability=durability
            )
        assert out["log"][-1] == "b"
        runs.append(sorted(keys))
    assert runs[0] == runs[1]
    assert len({k for _, k in runs[0]}) == 5  # and every task of the run has its own key


async def test_other_input_or_another_thread_gets_other_keys(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    async with SqliteCheckpointer.open(db) as cp:
        await chain(cp, []).ainvoke({"log": ["earlier"]}, thread_id="t")
    shutil.copy(db, tmp_path / "b.db")
    first: KeyLog = []
    second: KeyLog = []
    async with SqliteCheckpointer.open(db) as cp:
        await chain(cp, first).ainvoke({"log": ["x"]}, thread_id="t")
    async with SqliteCheckpointer.open(tmp_path / "b.db") as cp:
        await chain(cp, second).ainvoke({"log": ["y"]}, thread_id="t")
        await chain(cp, second).ainvoke({"log": ["x"]}, thread_id="u")
    assert not {k for _, k in first} & {k for _, k in second}


async def test_keys_never_repeat_across_runs_replays_updates_and_forks(
    store: BaseCheckpointer,
) -> None:
    keys: KeyLog = []
    g = chain(store, keys)
    await g.ainvoke({"log": []}, thread_id="t")
    await g.ainvoke({"log": []}, thread_id="t")  # the same input again: a new run, new keys
    history = await g.aget_state_history("t")
    after_a = next(s for s in history if s.next == ("w", "w", "w"))
    await g.ainvoke(None, thread_id="t", checkpoint_id=after_a.checkpoint_id)  # replay
    await g.aupdate_state("t", {"log": ["fix"]}, checkpoint_id=after_a.checkpoint_id)
    await g.ainvoke(None, thread_id="t")  # runs w x3 and b after the update
    await g.afork("t", after_a.checkpoint_id, "t2")
    await g.ainvoke(None, thread_id="t2")
    all_keys = [k for _, k in keys]
    assert len(keys) == 5 + 5 + 4 + 4 + 4
    assert len(set(all_keys)) == len(all_keys), "a key was given to two tasks"


async def test_without_a_checkpointer_every_run_has_new_keys() -> None:
    keys: KeyLog = []
    g = chain(None, keys)
    await g.ainvoke({"log": []})
    await g.ainvoke({"log": []})
    assert len({k for _, k in keys}) == 10


async def test_a_task_keeps_its_key_through_an_interrupt_and_a_crash_resume(
    store: BaseCheckpointer,
) -> None:
    keys: list[str] = []
    fail = {"on": True}

    def ask(state: S, ctx: NodeContext) -> dict[str, Any]:
        keys.append(ctx.idempotency_key)
        answer = interrupt("topic?")
        if fail["on"]:
            fail["on"] = False
            raise RuntimeError("boom after the answer")
        return {"topic": answer}

    g = StateGraph(S)
    g.add_node("ask", ask)
    g.add_edge(START, "ask")
    g.add_edge("ask", END)
    graph = g.compile(checkpointer=store)
    r = await graph.arun({"log": []}, thread_id="t", durability="exit")
    assert r.status == "interrupted"
    r = await graph.arun(Command(resume="cats"), thread_id="t", durability="exit")
    assert r.status == "failed"
    out = await graph.ainvoke(None, thread_id="t", durability="exit")
    assert out["topic"] == "cats"
    assert len(keys) == 3 and len(set(keys)) == 1


async def test_subgraph_tasks_have_their_own_stable_keys(tmp_path: Path) -> None:
    def inner_graph(keys: KeyLog) -> CompiledGraph[S]:
        def leaf(state: S, ctx: NodeContext) -> dict[str, Any]:
            keys.append((f"leaf:{ctx.checkpoint_ns}", ctx.idempotency_key))
            return {"log": ["leaf"]}

        g = StateGraph(S)
        g.add_node("leaf", leaf)
        g.add_edge(START, "leaf")
        g.add_edge("leaf", END)
        return g.compile()

    def outer(store: BaseCheckpointer, keys: KeyLog) -> CompiledGraph[S]:
        def fan(state: S) -> Command:
            return Command(goto=[Send("sub", {"log": [str(i)]}) for i in range(2)])

        g = StateGraph(S)
        g.add_node("fan", fan, destinations=["sub"])
        g.add_node("sub", inner_graph(keys))
        g.add_edge(START, "fan")
        g.add_edge("sub", END)
        return g.compile(checkpointer=store)

    db = tmp_path / "a.db"
    async with SqliteCheckpointer.open(db) as cp:
        await outer(cp, []).ainvoke({"log": []}, thread_id="t")
    shutil.copy(db, tmp_path / "b.db")
    runs: list[KeyLog] = []
    for name in ("a.db", "b.db"):
        keys: KeyLog = []
        async with SqliteCheckpointer.open(tmp_path / name) as cp:
            await outer(cp, keys).ainvoke({"log": []}, thread_id="t", durability="exit")
        runs.append(sorted(keys))
    assert runs[0] == runs[1]
    assert len({k for _, k in runs[0]}) == 2  # the two subgraph runs' leaves differ
