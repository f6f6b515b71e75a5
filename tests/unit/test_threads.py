"""The worker threads sync nodes run in (``graphexec._threads``), alone and under graphs."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import operator
import threading
import traceback
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    Command,
    InMemoryCheckpointer,
    NodeContext,
    NodeExecutionError,
    NodeTimeoutError,
    Send,
    StateGraph,
    interrupt,
)
from graphexec._threads import max_workers, run_in_thread
from graphexec.testing import assert_eventually

var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")


def node_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("graphexec-node-")}


# -- the dispatcher alone ---------------------------------------------------------------------


async def test_returns_the_result_and_runs_off_the_loop_thread() -> None:
    def where(a: int, b: int) -> tuple[int, str]:
        return a + b, threading.current_thread().name

    total, name = await run_in_thread(where, 2, 3)
    assert total == 5
    assert name.startswith("graphexec-node-")


async def test_an_exception_reaches_the_caller_with_its_traceback() -> None:
    def deep() -> None:
        raise ValueError("boom")

    def outer() -> None:
        deep()

    with pytest.raises(ValueError, match="boom") as err:
        await run_in_thread(outer)
    frames = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert frames[-2:] == ["outer", "deep"]


async def test_base_exceptions_and_stop_iteration_reach_the_caller() -> None:
    def stop() -> None:
        raise StopIteration("done")

    def exit_() -> None:
        raise SystemExit(3)

    with pytest.raises(RuntimeError) as err:
        await run_in_thread(stop)
    assert isinstance(err.value.__cause__, StopIteration)
    with pytest.raises(SystemExit):
        await run_in_thread(exit_)
    assert await run_in_thread(lambda: "still serving") == "still serving"


async def test_the_callers_contextvars_are_visible_and_changes_stay_in_the_thread() -> None:
    def read_and_set() -> str:
        seen = var.get()
        var.set("changed in thread")
        return seen

    token = var.set("caller")
    try:
        assert await run_in_thread(read_and_set) == "caller"
        assert var.get() == "caller"
    finally:
        var.reset(token)


async def test_a_timed_out_call_keeps_running_and_its_worker_is_reused() -> None:
    release, finished = threading.Event(), threading.Event()

    def slow() -> str:
        release.wait(10)
        finished.set()
        return "late"

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await run_in_thread(slow)
    assert not finished.is_set()
    release.set()

    async def done() -> None:
        assert finished.is_set()

    await assert_eventually(done)
    assert await run_in_thread(lambda: 42) == 42


async def test_a_call_cancelled_before_a_worker_takes_it_never_runs() -> None:
    release = threading.Event()
    started = threading.Semaphore(0)
    ran: list[str] = []

    def hold() -> None:
        started.release()
        release.wait(10)

    holders = [asyncio.ensure_future(run_in_thread(hold)) for _ in range(max_workers)]
    for _ in range(max_workers):  # every worker busy
        await asyncio.to_thread(started.acquire)
    waiting = asyncio.ensure_future(run_in_thread(ran.append, "should not run"))
    await asyncio.sleep(0)
    waiting.cancel()
    release.set()
    await asyncio.gather(*holders)
    assert await run_in_thread(lambda: "after") == "after"
    assert waiting.cancelled()
    assert ran == []


async def test_concurrency_is_bounded_and_every_call_completes() -> None:
    lock = threading.Lock()
    running, peak = 0, 0

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        # enough work that calls overlap
        total = sum(range(20_000))
        with lock:
            running -= 1
        return i + total - total

    before = node_threads()  # other loops' workers (the sync API's loop) are not this pool's
    results = await asyncio.gather(*(run_in_thread(work, i) for i in range(200)))
    assert results == list(range(200))
    assert 1 <= peak <= max_workers
    assert len(node_threads() - before) <= max_workers


async def test_workers_run_calls_in_parallel() -> None:
    n = min(4, max_workers)
    barrier = threading.Barrier(n, timeout=10)  # passes only if n calls run at once
    results = await asyncio.gather(*(run_in_thread(barrier.wait) for _ in range(n)))
    assert sorted(results) == list(range(n))


def open_fds() -> int | None:
    fd_dir = Path("/proc/self/fd")
    return len(list(fd_dir.iterdir())) if fd_dir.is_dir() else None


def test_no_worker_thread_or_pipe_outlives_asyncio_run() -> None:
    before = node_threads()
    n = min(4, max_workers)

    async def main() -> None:
        barrier = threading.Barrier(n, timeout=10)
        await asyncio.gather(*(run_in_thread(barrier.wait) for _ in range(n)))
        assert len(node_threads() - before) == n

    asyncio.run(main())  # warm-up: the first asyncio.run may open files of its own
    fds = open_fds()
    for _ in range(3):
        asyncio.run(main())
        assert not node_threads() - before
        assert open_fds() == fds  # each worker's wake-up pipe is closed with it


def test_loop_shutdown_waits_for_a_timed_out_call() -> None:
    before = node_threads()
    finished = threading.Event()

    def slow() -> None:
        gate.wait(10)
        finished.set()

    gate = threading.Event()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await run_in_thread(slow)
        threading.Timer(0.05, gate.set).start()

    asyncio.run(main())
    assert finished.is_set()  # like shutdown_default_executor, shutdown waited for it
    assert not node_threads() - before


# -- under graphs -------------------------------------------------------------------------------


class S(TypedDict, total=False):
    n: int
    log: Annotated[list[str], operator.add]
    results: Annotated[list[int], operator.add]


async def test_64_sync_send_workers_complete_without_deadlock() -> None:
    def fan(state: S) -> list[Send]:
        return [Send("work", {"n": i}) for i in range(64)]

    def work(state: S) -> dict[str, Any]:
        return {"results": [state["n"] * 2]}

    b = StateGraph(S)
    b.add_node("fan", lambda s: None)
    b.add_node("work", work)
    b.add_node("join", lambda s: {"log": ["joined"]})
    b.add_edge(START, "fan")
    b.add_conditional_edges("fan", fan, ["work"])
    b.add_edge("work", "join")
    b.add_edge("join", END)
    out = await b.compile(checkpointer=InMemoryCheckpointer()).ainvoke({}, thread_id="t")
    assert sorted(out["results"]) == [2 * i for i in range(64)]
    assert out["log"] == ["joined"]


async def test_sync_node_errors_timeouts_and_context_under_a_graph() -> None:
    token = var.set("from caller")
    seen: list[tuple[str, str]] = []

    def ok(state: S, ctx: NodeContext) -> dict[str, Any]:
        seen.append((var.get(), ctx.node))
        return {"log": ["ok"]}

    def slow(state: S) -> None:
        gate.wait(10)

    def bad(state: S) -> None:
        raise KeyError("missing")

    gate = threading.Event()
    try:
        b = StateGraph(S)
        b.add_node("ok", ok)
        b.add_node("slow", slow, timeout=0.05)
        b.add_edge(START, "ok")
        b.add_edge("ok", "slow")
        b.add_edge("slow", END)
        with pytest.raises(NodeTimeoutError):
            await b.compile().ainvoke({"log": []})
        gate.set()
        assert seen == [("from caller", "ok")]

        b2 = StateGraph(S)
        b2.add_node("bad", bad)
        b2.add_edge(START, "bad")
        b2.add_edge("bad", END)
        with pytest.raises(NodeExecutionError) as err:
            await b2.compile().ainvoke({"log": []})
        assert isinstance(err.value.__cause__, KeyError)
    finally:
        var.reset(token)


def subgraph() -> Any:
    b = StateGraph(S)
    b.add_node("inner", lambda s: {"log": [f"inner:{threading.current_thread().name[:15]}"]})
    b.add_edge(START, "inner")
    b.add_edge("inner", END)
    return b.compile()


def outer_graph() -> StateGraph[S]:
    def ask(state: S) -> dict[str, Any]:
        answer = interrupt("name?")
        return {"log": [f"answer:{answer}"]}

    b = StateGraph(S)
    b.add_node("first", lambda s: {"log": ["first"]})
    b.add_node("sub", subgraph())
    b.add_node("ask", ask)
    b.add_edge(START, "first")
    b.add_edge("first", "sub")
    b.add_edge("sub", "ask")
    b.add_edge("ask", END)
    return b


async def test_subgraph_and_interrupt_in_sync_nodes() -> None:
    g = outer_graph().compile(checkpointer=InMemoryCheckpointer())
    first = await g.arun({"log": []}, thread_id="t")
    assert first.status == "interrupted"
    out = await g.ainvoke(Command(resume="ada"), thread_id="t")
    assert out["log"] == ["first", "inner:graphexec-node-", "answer:ada"]


def test_the_sync_api_runs_sync_nodes_in_worker_threads() -> None:
    g = outer_graph().compile(checkpointer=InMemoryCheckpointer())
    first = g.run({"log": []}, thread_id="t")
    assert first.status == "interrupted"
    out = g.invoke(Command(resume="bob"), thread_id="t")
    assert out["log"] == ["first", "inner:graphexec-node-", "answer:bob"]


def test_a_loop_closed_by_hand_leaves_no_workers_behind() -> None:
    before = node_threads()
    n = min(3, max_workers)

    async def main() -> None:
        barrier = threading.Barrier(n, timeout=10)
        await asyncio.gather(*(run_in_thread(barrier.wait) for _ in range(n)))

    for _ in range(5):  # without shutdown_asyncgens(): only close()
        loop = asyncio.new_event_loop()
        loop.run_until_complete(main())
        loop.close()
    # each new pool stopped the previous loop's: at most one closed loop's workers are left
    assert len(node_threads() - before) <= n
    asyncio.run(main())
    assert not node_threads() - before
    gc.collect()  # the abandoned pools' generators are collected quietly
