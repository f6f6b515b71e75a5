"""``CompiledGraph.run_streamed``: parts as they happen, then the run's ``RunResult``."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    Command,
    GraphExecError,
    InMemoryCheckpointer,
    NodeExecutionError,
    StateGraph,
    StreamedRun,
    ThreadInterruptedError,
    interrupt,
)


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def appender(name: str) -> Any:
    def node(state: S) -> dict[str, Any]:
        return {"log": [name]}

    return node


def graph(*nodes: tuple[str, Any]) -> Any:
    b = StateGraph(S)
    for name, fn in nodes:
        b.add_node(name, fn)
    b.add_edge(START, nodes[0][0])
    b.add_sequence([name for name, _ in nodes])
    b.add_edge(nodes[-1][0], END)
    return b.compile(checkpointer=InMemoryCheckpointer())


async def test_parts_as_they_happen_then_the_result() -> None:
    g = graph(("a", appender("a")), ("b", appender("b")))
    run = g.run_streamed({"log": []}, mode="updates", thread_id="t")
    assert isinstance(run, StreamedRun) and repr(run) == "<StreamedRun new>"
    with pytest.raises(GraphExecError, match="has not started"):
        run.result  # noqa: B018
    parts = []
    async for part in run:
        parts.append(part)
        assert repr(run) == "<StreamedRun running>"
        with pytest.raises(GraphExecError, match="has not ended"):
            run.result  # noqa: B018
    assert parts == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}]
    result = run.result
    assert result.status == "done" and result.values == {"log": ["a", "b"]}
    assert result.thread_id == "t" and repr(run) == "<StreamedRun ended: done>"
    state = await g.aget_state("t")
    assert state is not None and state.checkpoint_id == result.checkpoint_id


async def test_several_modes_come_as_mode_and_part() -> None:
    g = graph(("a", appender("a")))
    run = g.run_streamed({"log": []}, mode=["values", "updates"], thread_id="t")
    parts = [p async for p in run]
    assert parts == [
        ("values", {"log": []}),
        ("updates", {"a": {"log": ["a"]}}),
        ("values", {"log": ["a"]}),
    ]


async def test_a_failed_node_is_reported_not_raised() -> None:
    g = graph(("a", appender("a")), ("boom", lambda s: 1 / 0))
    run = g.run_streamed({"log": []}, mode="updates", thread_id="t")
    parts = [p async for p in run]
    assert parts == [{"a": {"log": ["a"]}}]
    assert run.result.status == "failed"
    assert isinstance(run.result.error, NodeExecutionError)
    assert "boom" in str(run.result.error)
    # astream raises the same failure
    with pytest.raises(NodeExecutionError):
        async for _ in g.astream(None, thread_id="t"):
            pass


async def test_an_interrupted_run_reports_its_interruptions_and_resumes() -> None:
    def ask(state: S) -> dict[str, Any]:
        return {"answer": interrupt("name?")}

    g = graph(("a", appender("a")), ("ask", ask))
    run = g.run_streamed({"log": []}, mode="updates", thread_id="t")
    async for _ in run:
        pass
    assert run.result.status == "interrupted"
    [pending] = run.result.interruptions
    assert pending.value == "name?"
    assert run.result.to_state().thread_id == "t"

    # New input on a waiting thread is a misuse: it raises from the iteration.
    misuse = g.run_streamed({"log": []}, thread_id="t")
    with pytest.raises(ThreadInterruptedError):
        async for _ in misuse:
            pass
    assert repr(misuse) == "<StreamedRun raised ThreadInterruptedError>"
    with pytest.raises(GraphExecError, match="raised ThreadInterruptedError") as info:
        misuse.result  # noqa: B018
    assert isinstance(info.value.__cause__, ThreadInterruptedError)

    run = g.run_streamed(Command(resume="Ada"), thread_id="t")
    assert [p async for p in run][-1] == {"log": ["a"], "answer": "Ada"}
    assert run.result.status == "done"


async def test_leaving_early_cancels_the_run_and_keeps_its_commits() -> None:
    release = asyncio.Event()
    seen: list[str] = []

    async def slow(state: S) -> dict[str, Any]:
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return {"log": ["slow"]}

    g = graph(("a", appender("a")), ("slow", slow), ("c", appender("c")))
    run = g.run_streamed({"log": []}, mode="updates", thread_id="t")
    async for part in run:
        assert part == {"a": {"log": ["a"]}}
        break
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(run.aclose(), 10)
    assert loop.time() - started < 2  # the run was cancelled, not waited for
    assert repr(run) == "<StreamedRun stopped early>"
    assert seen == ["cancelled"]
    with pytest.raises(GraphExecError, match="has not ended"):
        run.result  # noqa: B018
    state = await g.aget_state("t")
    assert state is not None and state.values == {"log": ["a"]} and state.next == ("slow",)

    release.set()
    resumed = g.run_streamed(None, thread_id="t")
    async for _ in resumed:
        pass
    assert resumed.result.values == {"log": ["a", "slow", "c"]}


async def test_a_run_is_iterated_once() -> None:
    g = graph(("a", appender("a")))
    run = g.run_streamed({"log": []}, thread_id="t")
    async for _ in run:
        pass
    with pytest.raises(GraphExecError, match="iterated already"):
        async for _ in run:
            pass
    assert run.result.status == "done"


def test_bad_arguments_are_refused_at_the_call() -> None:
    g = graph(("a", appender("a")))
    with pytest.raises(GraphExecError, match="unknown stream mode 'value'"):
        g.run_streamed({"log": []}, mode="value", thread_id="t")  # type: ignore[arg-type]
    with pytest.raises(GraphExecError, match="at least one stream mode"):
        g.run_streamed({"log": []}, mode=[], thread_id="t")
    with pytest.raises(GraphExecError, match="thread_id must be a non-empty string"):
        g.run_streamed({"log": []}, thread_id="")


def test_sync_code_iterates_it_with_for() -> None:
    g = graph(("a", appender("a")), ("b", appender("b")))
    run = g.run_streamed({"log": []}, mode="updates", thread_id="t")
    assert list(run) == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}]
    assert run.result.status == "done" and run.result.values == {"log": ["a", "b"]}

    async def inside() -> None:
        with pytest.raises(RuntimeError, match=r"run_streamed.*'async for part in run'"):
            list(g.run_streamed({"log": []}, thread_id="t2"))

    asyncio.run(inside())


async def test_closing_astream_early_cancels_its_run() -> None:
    seen: list[str] = []

    async def slow(state: S) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return {}

    g = graph(("a", appender("a")), ("slow", slow))
    parts = g.astream({"log": []}, mode="updates", thread_id="t")
    async for part in parts:
        assert part == {"a": {"log": ["a"]}}
        break
    await asyncio.wait_for(parts.aclose(), 10)  # type: ignore[attr-defined]
    assert seen == ["cancelled"]
