"""In-process crashes: a run cancelled mid-step or failing in one parallel branch, then resumed.

The resumed run must reach the same final state as an uninterrupted run, and tasks that had
finished before the crash must not run again. (Real SIGKILL tests live with the durable
backends.)
"""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, Send, StateGraph


class State(TypedDict, total=False):
    topic: str
    parts: Annotated[list[str], operator.add]
    scores: Annotated[list[int], operator.add]
    summary: str


class Harness:
    """A fan-out/fan-in workflow whose nodes count their executions and can be held or broken."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.hold: dict[str, asyncio.Event] = {}
        self.fail: set[str] = set()
        self.reached: dict[str, asyncio.Event] = {}

    def node(self, name: str, update: Any) -> Any:
        async def fn(state: State) -> dict[str, Any]:
            self.calls[name] += 1
            self.reached.setdefault(name, asyncio.Event()).set()
            if name in self.hold:
                await self.hold[name].wait()
            if name in self.fail:
                raise RuntimeError(f"{name} is broken")
            return update(state) if callable(update) else update

        return fn

    def build(self) -> CompiledGraph:
        b = StateGraph(State)
        b.add_node("plan", self.node("plan", {"parts": ["plan"]}))
        for i in range(3):
            b.add_node(f"research{i}", self.node(f"research{i}", {"parts": [f"r{i}"]}))
            b.add_edge("plan", f"research{i}")
        b.add_node("score", self.node("score", lambda s: {"scores": [len(s["parts"])]}))
        b.add_node(
            "write",
            self.node("write", lambda s: {"summary": "+".join(s["parts"]) + f"/{s['scores']}"}),
        )
        b.add_edge(START, "plan")
        b.add_edge(["research0", "research1", "research2"], "score")
        b.add_conditional_edges("score", lambda s: [Send("fanout", i) for i in range(4)])
        b.add_node("fanout", self.fanout)
        b.add_edge("fanout", "write")
        b.add_edge("write", END)
        return b.compile(checkpointer=InMemoryCheckpointer())

    async def fanout(self, i: int) -> dict[str, Any]:
        self.calls[f"fanout{i}"] += 1
        await asyncio.sleep(0.001 * (4 - i))
        return {"scores": [i]}


INPUT: State = {"topic": "t", "parts": [], "scores": []}


async def reference() -> dict[str, Any]:
    h = Harness()
    return await h.build().ainvoke(INPUT, thread_id="ref")


async def test_cancelled_mid_step_resumes_only_unfinished_tasks() -> None:
    h = Harness()
    g = h.build()
    h.hold["research2"] = asyncio.Event()
    run = asyncio.create_task(g.ainvoke(INPUT, thread_id="t"))
    await asyncio.wait_for(h.reached.setdefault("research2", asyncio.Event()).wait(), 5)
    await asyncio.sleep(0.01)  # research0/1 finish and save their writes
    run.cancel()  # the "crash": research2 is mid-flight
    with pytest.raises(asyncio.CancelledError):
        await run
    assert h.calls["research0"] == h.calls["research1"] == 1

    state = await g.aget_state("t")
    assert state is not None and set(state.next) == {"research0", "research1", "research2"}

    h.hold.clear()
    final = await g.ainvoke(None, thread_id="t")
    assert final == await reference()
    # finished tasks of the interrupted step were not executed again
    assert h.calls["plan"] == 1
    assert h.calls["research0"] == 1 and h.calls["research1"] == 1
    assert h.calls["research2"] == 2
    assert h.calls["score"] == 1 and h.calls["write"] == 1


async def test_one_parallel_branch_failing_then_resume() -> None:
    h = Harness()
    g = h.build()
    h.fail.add("research1")
    result = await g.arun(INPUT, thread_id="t")
    assert result.status == "failed"
    assert getattr(result.error, "node", None) == "research1"

    h.fail.clear()
    final = await g.ainvoke(None, thread_id="t")
    assert final == await reference()
    assert h.calls["research0"] == 1 and h.calls["research2"] == 1
    assert h.calls["research1"] == 2


async def test_crash_inside_send_fanout_keeps_finished_workers() -> None:
    h = Harness()
    g = h.build()
    original = h.fanout
    gate = asyncio.Event()

    async def fanout(i: int) -> dict[str, Any]:
        if i == 0 and not gate.is_set():
            h.calls["fanout0"] += 1
            await asyncio.sleep(3600)  # cancelled below
        return await original(i)

    h.fanout = fanout  # type: ignore[method-assign]
    g = h.build()
    run = asyncio.create_task(g.ainvoke(INPUT, thread_id="t"))

    async def others_done() -> None:
        while not all(h.calls[f"fanout{i}"] for i in (1, 2, 3)):
            await asyncio.sleep(0.005)

    await asyncio.wait_for(others_done(), 5)
    await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    gate.set()
    final = await g.ainvoke(None, thread_id="t")
    assert final == await reference()
    assert [h.calls[f"fanout{i}"] for i in range(4)] == [2, 1, 1, 1]


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_failure_then_resume_equals_uninterrupted_in_every_mode(durability: str) -> None:
    h = Harness()
    g = h.build()
    h.fail.add("write")
    result = await g.arun(INPUT, thread_id="t", durability=durability)  # type: ignore[arg-type]
    assert result.status == "failed"
    h.fail.clear()
    assert await g.ainvoke(None, thread_id="t") == await reference()
    assert h.calls["plan"] == 1  # committed before the failure in every mode


# -- replay / fork equivalence ------------------------------------------------------------


class Walk(TypedDict):
    n: int
    path: Annotated[list[int], operator.add]


def walk_graph() -> CompiledGraph:
    """A deterministic loop: halve even numbers, 3n+1 odd ones, until 1 (Collatz)."""

    def even(s: Walk) -> dict[str, Any]:
        return {"n": s["n"] // 2, "path": [s["n"] // 2]}

    def odd(s: Walk) -> dict[str, Any]:
        return {"n": 3 * s["n"] + 1, "path": [3 * s["n"] + 1]}

    def route(s: Walk) -> str:
        return END if s["n"] == 1 else ("even" if s["n"] % 2 == 0 else "odd")

    b = StateGraph(Walk)
    b.add_node("even", even)
    b.add_node("odd", odd)
    b.add_conditional_edges(START, route, ["even", "odd", END])
    b.add_conditional_edges("even", route, ["even", "odd", END])
    b.add_conditional_edges("odd", route, ["even", "odd", END])
    return b.compile(checkpointer=InMemoryCheckpointer(), recursion_limit=500)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=st.integers(min_value=2, max_value=60), pick=st.floats(0, 1), data=st.data())
def test_replay_and_fork_reproduce_later_states(start: int, pick: float, data: Any) -> None:
    g = walk_graph()
    final = g.invoke({"n": start, "path": [start]}, thread_id="orig")
    history = g.get_state_history("orig")  # newest first
    original = [h.values for h in reversed(history)]
    idx = min(int(pick * len(history)), len(history) - 1)
    chosen = list(reversed(history))[idx]

    # replay on the same thread: a new branch from `chosen` reproduces the later states
    replayed = g.invoke(None, thread_id="orig", checkpoint_id=chosen.checkpoint_id)
    assert replayed == final
    branch = [h.values for h in reversed(g.get_state_history("orig"))]
    assert branch == original
    new_head = g.get_state_history("orig")[0]
    if idx < len(original) - 1:
        assert new_head.checkpoint_id != history[0].checkpoint_id  # a real new branch
        assert len(g.list_branches("orig")) == 2

    # fork into a new thread: same later states, source thread untouched
    fork_id = data.draw(st.sampled_from(["f", "fork-1", "orig-fork"]))
    g.fork("orig", chosen.checkpoint_id, fork_id)
    assert g.invoke(None, thread_id=fork_id) == final
    forked = [h.values for h in reversed(g.get_state_history(fork_id))]
    assert forked == original[idx:]
    assert g.get_state_history("orig")[0].checkpoint_id == new_head.checkpoint_id
