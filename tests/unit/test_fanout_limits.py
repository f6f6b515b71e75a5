"""``compile(max_tasks_per_step=...)``: a step that would start too many tasks is refused.

The step whose nodes produced the tasks is not checkpointed, the error says which step, which
nodes, how many tasks and how to raise the limit, and the thread stays usable (issue #19.6).
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    GraphBuildError,
    InMemoryCheckpointer,
    PendingWrite,
    Send,
    StateGraph,
    TaskLimitError,
)


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    results: Annotated[list[int], operator.add]
    sends: int


def fan_graph(
    cp: BaseCheckpointer | None, *, runs: list[str] | None = None, **compile_kw: Any
) -> CompiledGraph[S]:
    """START -> prep -> fan, whose conditional edge sends ``state['sends']`` workers -> END."""

    def fan(state: S) -> dict[str, Any]:
        if runs is not None:
            runs.append("fan")
        return {"log": ["fan"]}

    b = StateGraph(S)
    b.add_node("prep", lambda s: {"log": ["prep"]})
    b.add_node("fan", fan)
    b.add_node("worker", lambda i: {"results": [i]})
    b.add_edge(START, "prep")
    b.add_edge("prep", "fan")
    b.add_conditional_edges(
        "fan", lambda s: [Send("worker", i) for i in range(s["sends"])], ["worker"]
    )
    b.add_edge("worker", END)
    return b.compile(cp, **compile_kw)


async def pending(cp: BaseCheckpointer, thread_id: str) -> tuple[PendingWrite, ...]:
    tup = await cp.get(thread_id)
    assert tup is not None
    return tup.pending_writes


async def test_a_fan_out_over_the_limit_names_step_nodes_count_and_the_fix() -> None:
    cp = InMemoryCheckpointer()
    g = fan_graph(cp, max_tasks_per_step=10)
    with pytest.raises(TaskLimitError) as err:
        await g.ainvoke({"sends": 11}, thread_id="t")
    e = err.value
    assert (e.limit, e.count, e.step, e.nodes, e.thread_id) == (10, 11, 2, ("fan",), "t")
    text = str(e)
    for part in ("step 2", "11 tasks", "'fan'", "max_tasks_per_step=10", "'t'"):
        assert part in text, text
    assert "compile(max_tasks_per_step=" in text  # how to raise it
    # nothing past the last checkpoint: fan's step (2) was not committed, no writes pending
    history = await g.aget_state_history("t")
    assert [h.step for h in history] == [1, 0]
    state = await g.aget_state("t")
    assert state is not None and state.next == ("fan",) and state.values["log"] == ["prep"]
    assert await pending(cp, "t") == ()


async def test_run_reports_the_refused_fan_out_as_a_failure() -> None:
    g = fan_graph(InMemoryCheckpointer(), max_tasks_per_step=10)
    result = await g.arun({"sends": 11}, thread_id="t")
    assert result.status == "failed" and isinstance(result.error, TaskLimitError)
    assert result.values["log"] == ["prep"]  # the state of the last checkpoint


async def test_a_fan_out_at_the_limit_runs() -> None:
    g = fan_graph(InMemoryCheckpointer(), max_tasks_per_step=10)
    out = await g.ainvoke({"sends": 10}, thread_id="t")
    assert out["results"] == list(range(10))


async def test_the_thread_stays_usable_after_a_refused_fan_out() -> None:
    cp = InMemoryCheckpointer()
    runs: list[str] = []
    small = fan_graph(cp, runs=runs, max_tasks_per_step=10)
    with pytest.raises(TaskLimitError):
        await small.ainvoke({"sends": 11}, thread_id="t")
    # the same graph with a higher limit resumes it from the last checkpoint
    big = fan_graph(cp, runs=runs, max_tasks_per_step=11)
    assert big.version == small.version  # the limit is not part of the graph's identity
    out = await big.ainvoke(None, thread_id="t")
    assert out["results"] == list(range(11)) and out["log"] == ["prep", "fan"]
    assert runs == ["fan", "fan"]  # fan ran again: its refused step had stored nothing
    # and new input on the small graph, within its limit, runs too
    out = await small.ainvoke({"sends": 3, "results": []}, thread_id="t")
    assert out["results"][-3:] == [0, 1, 2]


async def test_edges_count_toward_the_limit_with_sends() -> None:
    b = StateGraph(S)
    b.add_node("fan", lambda s: [Send("worker", i) for i in range(9)], destinations=["worker"])
    b.add_node("worker", lambda i: {"results": [i]})
    b.add_node("x", lambda s: None)
    b.add_node("y", lambda s: None)
    b.add_edge(START, "fan")
    b.add_edge("fan", "x")
    b.add_edge("fan", "y")
    for n in ("worker", "x", "y"):
        b.add_edge(n, END)
    with pytest.raises(TaskLimitError) as err:
        await b.compile(max_tasks_per_step=10).ainvoke({})
    assert (err.value.count, err.value.nodes, err.value.thread_id) == (11, ("fan",), None)
    out = await b.compile(max_tasks_per_step=11).ainvoke({})
    assert out["results"] == list(range(9))


async def test_sends_of_several_nodes_are_summed_and_named_most_first() -> None:
    b = StateGraph(S)
    b.add_node("a", lambda s: [Send("worker", i) for i in range(4)], destinations=["worker"])
    b.add_node("b", lambda s: [Send("worker", i) for i in range(7)], destinations=["worker"])
    b.add_node("worker", lambda i: {"results": [i]})
    b.add_edge(START, "a")
    b.add_edge(START, "b")
    b.add_edge("worker", END)
    with pytest.raises(TaskLimitError) as err:
        await b.compile(InMemoryCheckpointer(), max_tasks_per_step=10).ainvoke({}, thread_id="t")
    assert (err.value.count, err.value.step, err.value.nodes) == (11, 1, ("b", "a"))
    assert "7 from 'b'" in str(err.value) and "4 from 'a'" in str(err.value)


async def test_a_command_given_as_input_cannot_send_past_the_limit() -> None:
    g = fan_graph(InMemoryCheckpointer(), max_tasks_per_step=10)
    sends = [Send("worker", i) for i in range(11)]
    with pytest.raises(TaskLimitError) as err:
        await g.ainvoke(Command(goto=sends), thread_id="t")
    assert (err.value.step, err.value.nodes, err.value.count) == (0, ("__input__",), 11)
    assert await g.aget_state("t") is None  # nothing written, not even the input
    out = await g.ainvoke(Command(goto=sends[:10]), thread_id="t")
    assert out["results"] == list(range(10))


async def test_a_conditional_edge_from_start_cannot_send_past_the_limit() -> None:
    b = StateGraph(S)
    b.add_node("worker", lambda i: {"results": [i]})
    b.add_conditional_edges(START, lambda s: [Send("worker", i) for i in range(s["sends"])])
    b.add_edge("worker", END)
    g = b.compile(InMemoryCheckpointer(), max_tasks_per_step=5)
    with pytest.raises(TaskLimitError) as err:
        await g.ainvoke({"sends": 6}, thread_id="t")
    assert (err.value.step, err.value.nodes) == (0, ("__start__",))
    assert await g.aget_state("t") is None
    assert (await g.ainvoke({"sends": 5}, thread_id="t"))["results"] == list(range(5))


async def test_exit_durability_keeps_the_steps_before_the_refused_one() -> None:
    cp = InMemoryCheckpointer()
    g = fan_graph(cp, max_tasks_per_step=10)
    with pytest.raises(TaskLimitError):
        await g.ainvoke({"sends": 11}, thread_id="t", durability="exit")
    state = await g.aget_state("t")
    assert state is not None and state.step == 1 and state.next == ("fan",)
    assert state.values["log"] == ["prep"]
    assert await pending(cp, "t") == ()


async def test_a_producer_that_finished_first_is_not_saved_when_alone_over_the_limit() -> None:
    """Tasks are saved as they finish; one whose own sends exceed the limit is not.

    ``fan``'s conditional edge releases ``other``, so ``fan`` finishes first, while ``other``
    still runs: that is when a finished task's writes are stored. Stored, they would replay
    on every resume and refuse the step again; not stored, ``fan`` runs again on resume.
    """
    released = asyncio.Event()
    saved: list[tuple[str, str]] = []

    class Spy(InMemoryCheckpointer):
        async def put_writes(self, *args: Any, **kwargs: Any) -> None:
            saved.append((args[2], args[3]))  # (checkpoint id, task id)
            await super().put_writes(*args, **kwargs)

    def route(state: S) -> list[Send]:
        released.set()
        return [Send("worker", i) for i in range(state["sends"])]

    async def other(state: S) -> dict[str, Any]:
        await released.wait()
        return {"log": ["other"]}

    b = StateGraph(S)
    b.add_node("fan", lambda s: {"log": ["fan"]})
    b.add_node("other", other)
    b.add_node("worker", lambda i: {"results": [i]})
    b.add_edge(START, "fan")
    b.add_edge(START, "other")
    b.add_conditional_edges("fan", route, ["worker"])
    b.add_edge("worker", END)
    b.add_edge("other", END)
    cp = Spy()
    with pytest.raises(TaskLimitError):
        await b.compile(cp, max_tasks_per_step=10).ainvoke({"sends": 11}, thread_id="t")
    assert saved == [] and await pending(cp, "t") == ()
    released.clear()
    out = await b.compile(cp, max_tasks_per_step=10).ainvoke({"sends": 3}, thread_id="t")
    assert out["results"] == [0, 1, 2] and out["log"] == ["fan", "other"]
    # within the limit, the first to finish (fan) is saved as usual, at fan's step
    assert len([cid for cid, _ in saved if cid == saved[0][0]]) == 1


async def test_the_default_limit_is_100_000_tasks() -> None:
    g = fan_graph(InMemoryCheckpointer())
    with pytest.raises(TaskLimitError) as err:
        await g.ainvoke({"sends": 100_001}, thread_id="t")
    assert (err.value.limit, err.value.count) == (100_000, 100_001)
    assert "max_tasks_per_step=100000" in str(err.value)


def test_with_checkpointer_keeps_the_limit() -> None:
    g = fan_graph(None, max_tasks_per_step=7).with_checkpointer(InMemoryCheckpointer())
    with pytest.raises(TaskLimitError):
        g.invoke({"sends": 8}, thread_id="t")


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10", None])
def test_the_limit_must_be_a_positive_int(bad: Any) -> None:
    with pytest.raises(GraphBuildError, match="max_tasks_per_step"):
        fan_graph(None, max_tasks_per_step=bad)
