"""Executor semantics: supersteps, parallelism, joins, Send, Command, retry, timeout, limits."""

from __future__ import annotations

import asyncio
import operator
import threading
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    REMOVE_ALL_MESSAGES,
    START,
    Command,
    InMemoryCheckpointer,
    InvalidUpdateError,
    NodeContext,
    NodeExecutionError,
    NodeTimeoutError,
    RecursionLimitError,
    RemoveMessage,
    RetryPolicy,
    Send,
    StateGraph,
    add_messages,
)
from graphexec._state import StateSchema


class S(TypedDict, total=False):
    n: int
    log: Annotated[list[str], operator.add]
    results: Annotated[list[int], operator.add]
    route: str


def appender(name: str) -> Any:
    def node(state: S) -> dict[str, Any]:
        return {"log": [name]}

    node.__name__ = name
    return node


def chain(*names: str) -> StateGraph[S]:
    b = StateGraph(S)
    for n in names:
        b.add_node(n, appender(n))
    b.add_edge(START, names[0])
    b.add_sequence(list(names))
    b.add_edge(names[-1], END)
    return b


async def test_linear_chain_one_checkpoint_per_step() -> None:
    g = chain("a", "b", "c").compile(checkpointer=InMemoryCheckpointer())
    out = await g.ainvoke({"log": []}, thread_id="t")
    assert out == {"log": ["a", "b", "c"]}
    history = await g.aget_state_history("t")
    # one input checkpoint, then exactly one per superstep
    assert [h.metadata["source"] for h in history] == ["loop", "loop", "loop", "input"]
    assert [h.step for h in history] == [3, 2, 1, 0]
    assert [h.next for h in history] == [(), ("c",), ("b",), ("a",)]


async def test_parallel_nodes_run_concurrently_and_join_waits() -> None:
    started: list[str] = []
    gate = asyncio.Event()

    async def left(state: S) -> dict[str, Any]:
        started.append("left")
        await asyncio.wait_for(gate.wait(), 5)
        return {"log": ["left"]}

    async def right(state: S) -> dict[str, Any]:
        started.append("right")
        gate.set()  # left can only finish if right ran while left was waiting
        return {"log": ["right"]}

    def right2(state: S) -> dict[str, Any]:
        return {"log": ["right2"]}

    def join(state: S) -> dict[str, Any]:
        return {"log": ["join"]}

    b = StateGraph(S)
    b.add_node("left", left)
    b.add_node("right", right)
    b.add_node("right2", right2)
    b.add_node("join", join)
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge("right", "right2")
    b.add_edge(["left", "right2"], "join")  # join across different supersteps
    b.add_edge("join", END)
    out = await b.compile().ainvoke({"log": []})
    # writes are applied in frontier (declaration) order, not finishing order
    assert out["log"] == ["left", "right", "right2", "join"]
    assert sorted(started) == ["left", "right"]


async def test_plain_fan_in_runs_target_once_per_step() -> None:
    calls = []

    def d(state: S) -> dict[str, Any]:
        calls.append(1)
        return {"log": ["d"]}

    b = StateGraph(S)
    for n in ("a", "b"):
        b.add_node(n, appender(n))
        b.add_edge(START, n)
        b.add_edge(n, "d")
    b.add_node("d", d)
    b.add_edge("d", END)
    out = await b.compile().ainvoke({"log": []})
    assert out["log"] == ["a", "b", "d"]
    assert len(calls) == 1


async def test_send_map_reduce_has_deterministic_order() -> None:
    async def worker(i: int) -> dict[str, Any]:
        await asyncio.sleep(0.001 * (10 - i))  # finish in reverse order
        return {"results": [i * i]}

    def fan(state: S) -> list[Send]:
        return [Send("worker", i) for i in range(10)]

    b = StateGraph(S)
    b.add_node("start", appender("start"))
    b.add_node("worker", worker)
    b.add_node("collect", appender("collect"))
    b.add_edge(START, "start")
    b.add_conditional_edges("start", fan)
    b.add_edge("worker", "collect")
    b.add_edge("collect", END)
    out = await b.compile(checkpointer=InMemoryCheckpointer()).ainvoke(
        {"log": [], "results": []}, thread_id="t"
    )
    assert out["results"] == [i * i for i in range(10)]
    assert out["log"] == ["start", "collect"]


async def test_node_returning_sends_and_command_goto() -> None:
    def fan(state: S) -> list[Send]:
        return [Send("worker", i) for i in range(3)]

    def worker(i: int) -> Command:
        return Command(update={"results": [i]}, goto="finish" if i == 2 else [])

    b = StateGraph(S)
    b.add_node("fan", fan, destinations=["worker"])
    b.add_node("worker", worker, destinations=["finish"])
    b.add_node("finish", appender("finish"))
    b.add_edge(START, "fan")
    b.add_edge("finish", END)
    out = await b.compile().ainvoke({"log": [], "results": []})
    assert out == {"log": ["finish"], "results": [0, 1, 2]}


async def test_command_goto_unknown_node_is_invalid_update() -> None:
    b = StateGraph(S)
    b.add_node("a", lambda s: Command(goto="nowhere"), destinations=[END])
    b.add_edge(START, "a")
    with pytest.raises(InvalidUpdateError) as err:
        await b.compile().ainvoke({"log": []})
    assert err.value.node == "a"
    assert "nowhere" in str(err.value)


async def test_conditional_edge_sees_the_nodes_own_writes() -> None:
    def decide(state: S) -> dict[str, Any]:
        return {"route": "yes"}

    b = StateGraph(S)
    b.add_node("decide", decide)
    b.add_node("yes", appender("yes"))
    b.add_node("no", appender("no"))
    b.add_edge(START, "decide")
    b.add_conditional_edges("decide", lambda s: s["route"], {"yes": "yes", "no": "no"})
    b.add_edge("yes", END)
    b.add_edge("no", END)
    assert (await b.compile().ainvoke({"log": [], "route": "no"}))["log"] == ["yes"]


async def test_conditional_edge_key_missing_from_path_map() -> None:
    b = StateGraph(S)
    b.add_node("a", appender("a"))
    b.add_edge(START, "a")
    b.add_conditional_edges("a", lambda s: "maybe", {"yes": END})
    with pytest.raises(InvalidUpdateError, match="maybe"):
        await b.compile().ainvoke({"log": []})


async def test_ctx_fields_and_stable_idempotency_key() -> None:
    seen: list[NodeContext] = []

    def node(state: S, ctx: NodeContext) -> None:
        seen.append(ctx)

    b = StateGraph(S)
    b.add_node("a", node)
    b.add_edge(START, "a")
    b.add_edge("a", END)
    g = b.compile(checkpointer=InMemoryCheckpointer(), memory={"m": 1})
    await g.ainvoke({"log": []}, thread_id="t1")
    await g.ainvoke({"log": []}, thread_id="t2")
    a, c = seen
    assert (a.thread_id, a.node, a.step, a.attempt, a.checkpoint_ns) == ("t1", "a", 1, 1, "")
    assert a.memory == {"m": 1}
    assert a.idempotency_key != c.idempotency_key
    assert a.task_id != c.task_id


async def test_retry_policy_retries_and_records_attempts() -> None:
    attempts: list[int] = []

    def flaky(state: S, ctx: NodeContext) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError("transient")
        return {"log": ["ok"]}

    b = StateGraph(S)
    b.add_node("flaky", flaky, retry=RetryPolicy(max_attempts=3, initial_interval=0, jitter=False))
    b.add_edge(START, "flaky")
    b.add_edge("flaky", END)
    out = await b.compile().ainvoke({"log": []})
    assert out["log"] == ["ok"]
    assert attempts == [1, 2, 3]


async def test_retry_gives_up_and_does_not_retry_programming_errors() -> None:
    calls = {"conn": 0, "value": 0}

    def conn(state: S) -> None:
        calls["conn"] += 1
        raise ConnectionError("down")

    def value(state: S) -> None:
        calls["value"] += 1
        raise ValueError("bug")

    for name, fn, expected in (("conn", conn, 2), ("value", value, 1)):
        b = StateGraph(S)
        b.add_node(name, fn, retry=RetryPolicy(max_attempts=2, initial_interval=0, jitter=False))
        b.add_edge(START, name)
        b.add_edge(name, END)
        with pytest.raises(NodeExecutionError) as err:
            await b.compile().ainvoke({"log": []})
        assert err.value.node == name
        assert err.value.attempt == expected
        assert calls[name] == expected


async def test_retry_attempts_survive_a_crash() -> None:
    """The attempt count is persisted: after a crash the retry continues, not restarts."""
    attempts: list[int] = []
    crash = {"on": True}

    async def flaky(state: S, ctx: NodeContext) -> dict[str, Any]:
        attempts.append(ctx.attempt)
        if ctx.attempt == 2 and crash["on"]:
            raise asyncio.CancelledError  # the process "dies" during attempt 2
        if ctx.attempt < 3:
            raise ConnectionError("transient")
        return {"log": [f"ok@{ctx.attempt}"]}

    b = StateGraph(S)
    b.add_node("a", appender("a"))
    b.add_node("flaky", flaky, retry=RetryPolicy(max_attempts=5, initial_interval=0, jitter=False))
    b.add_edge(START, "a")
    b.add_edge("a", "flaky")
    b.add_edge("flaky", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(asyncio.CancelledError):
        await g.ainvoke({"log": []}, thread_id="t")
    crash["on"] = False
    out = await g.ainvoke(None, thread_id="t")
    assert out["log"] == ["a", "ok@3"]
    # attempt 1 failed and was recorded; attempt 2 died with the "process" and runs again as
    # attempt 2 (not as attempt 1: the count continues), then attempt 3 succeeds
    assert attempts == [1, 2, 2, 3]


async def test_timeout_raises_node_timeout_error() -> None:
    async def slow(state: S) -> None:
        await asyncio.sleep(10)

    b = StateGraph(S)
    b.add_node("slow", slow, timeout=0.05)
    b.add_edge(START, "slow")
    b.add_edge("slow", END)
    with pytest.raises(NodeTimeoutError) as err:
        await b.compile().ainvoke({"log": []})
    assert err.value.node == "slow"
    assert err.value.timeout == 0.05


async def test_recursion_limit_names_the_cycle_and_stays_resumable() -> None:
    def ping(state: S) -> dict[str, Any]:
        return {"n": state["n"] + 1}

    b = StateGraph(S)
    b.add_node("ping", ping)
    b.add_node("pong", lambda s: None)
    b.add_edge(START, "ping")
    b.add_edge("ping", "pong")
    b.add_conditional_edges("pong", lambda s: END if s["n"] >= 20 else "ping", ["ping", END])
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(RecursionLimitError) as err:
        await g.ainvoke({"n": 0}, thread_id="t", recursion_limit=10)
    assert err.value.steps == 10
    assert set(err.value.cycle) == {"ping", "pong"}
    assert "ping" in str(err.value) and "pong" in str(err.value)
    state = await g.aget_state("t")
    assert state is not None and state.values["n"] == 5 and state.next
    out = await g.ainvoke(None, thread_id="t", recursion_limit=100)
    assert out["n"] == 20


async def test_invalid_update_keeps_thread_resumable() -> None:
    bad = {"on": True}

    def b_node(state: S) -> dict[str, Any]:
        return {"n": "not an int"} if bad["on"] else {"n": 2}

    b = StateGraph(S)
    b.add_node("a", lambda s: {"n": 1})
    b.add_node("b", b_node)
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(InvalidUpdateError) as err:
        await g.ainvoke({"log": []}, thread_id="t")
    assert (err.value.node, err.value.key) == ("b", "n")
    state = await g.aget_state("t")
    assert state is not None and state.values["n"] == 1 and state.next == ("b",)
    bad["on"] = False
    assert (await g.ainvoke(None, thread_id="t"))["n"] == 2


async def test_unserializable_value_fails_at_write_time_naming_node_and_key() -> None:
    class Opaque:
        pass

    class T(TypedDict):
        blob: Any

    b = StateGraph(T)
    b.add_node("a", lambda s: {"blob": Opaque()})
    b.add_edge(START, "a")
    b.add_edge("a", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(InvalidUpdateError) as err:
        await g.ainvoke({"blob": 1}, thread_id="t")
    assert (err.value.node, err.value.key) == ("a", "blob")


async def test_run_reports_failure_without_raising() -> None:
    def boom(state: S) -> None:
        raise KeyError("x")

    b = StateGraph(S)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    b.add_edge("boom", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    result = await g.arun({"log": ["x"]}, thread_id="t")
    assert result.status == "failed"
    assert isinstance(result.error, NodeExecutionError)
    assert isinstance(result.error.__cause__, KeyError)
    assert result.values == {"log": ["x"]}
    assert result.thread_id == "t" and result.checkpoint_id is not None


async def test_subgraph_as_node_uses_a_stable_namespace() -> None:
    inner = StateGraph(S)
    inner.add_node("i1", appender("i1"))
    inner.add_node("i2", appender("i2"))
    inner.add_edge(START, "i1")
    inner.add_edge("i1", "i2")
    inner.add_edge("i2", END)
    sub = inner.compile()

    outer = StateGraph(S)
    outer.add_node("before", appender("before"))
    outer.add_node("sub", sub)
    outer.add_node("after", appender("after"))
    outer.add_sequence(["before", "sub", "after"])
    outer.add_edge(START, "before")
    outer.add_edge("after", END)
    store = InMemoryCheckpointer()
    g = outer.compile(checkpointer=store)
    out = await g.ainvoke({"log": []}, thread_id="t")
    # the subgraph's reducer updates are passed up as updates, not as a whole new list
    assert out["log"] == ["before", "i1", "i2", "after"]
    sub_history = await store.list("t", "sub")
    assert [c.step for c in sub_history][-1] >= 0
    assert all(c.metadata["parent_task"] for c in sub_history)
    # a second run starts the subgraph afresh in the same namespace
    out2 = await g.ainvoke({"log": []}, thread_id="t")
    assert out2["log"] == ["before", "i1", "i2", "after"] * 2


async def test_subgraph_resumes_inside_after_a_crash() -> None:
    calls: list[str] = []
    crash = {"on": True}

    def i1(state: S) -> dict[str, Any]:
        calls.append("i1")
        return {"log": ["i1"]}

    async def i2(state: S) -> dict[str, Any]:
        calls.append("i2")
        if crash["on"]:
            raise asyncio.CancelledError
        return {"log": ["i2"]}

    inner = StateGraph(S)
    inner.add_node("i1", i1)
    inner.add_node("i2", i2)
    inner.add_sequence(["i1", "i2"])
    inner.add_edge(START, "i1")
    inner.add_edge("i2", END)
    outer = StateGraph(S)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    outer.add_edge("sub", END)
    g = outer.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(asyncio.CancelledError):
        await g.ainvoke({"log": []}, thread_id="t")
    crash["on"] = False
    out = await g.ainvoke(None, thread_id="t")
    assert out["log"] == ["i1", "i2"]
    assert calls == ["i1", "i2", "i2"]  # i1 was committed inside the subgraph: not re-run


async def test_sync_nodes_run_in_worker_threads() -> None:
    threads: list[int] = []

    def node(state: S) -> None:
        threads.append(threading.get_ident())

    b = StateGraph(S)
    b.add_node("a", node)
    b.add_edge(START, "a")
    b.add_edge("a", END)
    await b.compile().ainvoke({"log": []})
    assert threads and threads[0] != threading.get_ident()


async def test_streaming_modes() -> None:
    def a(state: S, ctx: NodeContext) -> dict[str, Any]:
        ctx.stream_writer({"progress": 50})
        return {"log": ["a"]}

    b = StateGraph(S)
    b.add_node("a", a)
    b.add_node("b", appender("b"))
    b.add_sequence(["a", "b"])
    b.add_edge(START, "a")
    b.add_edge("b", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    values = [v async for v in g.astream({"log": []}, thread_id="v")]
    assert values == [{"log": []}, {"log": ["a"]}, {"log": ["a", "b"]}]
    updates = [u async for u in g.astream({"log": []}, thread_id="u", mode="updates")]
    assert updates == [{"a": {"log": ["a"]}}, {"b": {"log": ["b"]}}]
    parts = [p async for p in g.astream({"log": []}, thread_id="m", mode=["custom", "events"])]
    assert ("custom", {"progress": 50}) in parts
    events = [p["event"] for m, p in parts if m == "events"]
    assert events.count("task_start") == 2 and events.count("task_end") == 2
    assert events.count("checkpoint") == 3


async def test_streaming_raises_when_the_run_fails() -> None:
    b = StateGraph(S)
    b.add_node("a", lambda s: 1 / 0)
    b.add_edge(START, "a")
    b.add_edge("a", END)
    with pytest.raises(NodeExecutionError):
        async for _ in b.compile().astream({"log": []}):
            pass


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_durability_modes_reach_the_same_state(durability: str) -> None:
    g = chain("a", "b", "c").compile(checkpointer=InMemoryCheckpointer())
    out = await g.ainvoke({"log": []}, thread_id="t", durability=durability)  # type: ignore[arg-type]
    assert out["log"] == ["a", "b", "c"]
    state = await g.aget_state("t")
    assert state is not None and state.values == out and state.next == ()
    history = await g.aget_state_history("t")
    assert len(history) == (4 if durability != "exit" else 1)


async def test_exit_durability_persists_progress_on_failure() -> None:
    fail = {"on": True}

    def c(state: S) -> dict[str, Any]:
        if fail["on"]:
            raise RuntimeError("boom")
        return {"log": ["c"]}

    b = StateGraph(S)
    b.add_node("a", appender("a"))
    b.add_node("b", appender("b"))
    b.add_node("c", c)
    b.add_sequence(["a", "b", "c"])
    b.add_edge(START, "a")
    b.add_edge("c", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(NodeExecutionError):
        await g.ainvoke({"log": []}, thread_id="t", durability="exit")
    state = await g.aget_state("t")
    assert state is not None and state.values["log"] == ["a", "b"] and state.next == ("c",)
    fail["on"] = False
    assert (await g.ainvoke(None, thread_id="t"))["log"] == ["a", "b", "c"]


async def test_config_form_is_accepted_everywhere() -> None:
    g = chain("a").compile(checkpointer=InMemoryCheckpointer())
    cfg = {"configurable": {"thread_id": "c"}}
    await g.ainvoke({"log": []}, config=cfg)
    state = await g.aget_state(config=cfg)
    assert state is not None and state.values["log"] == ["a"]
    assert len(await g.aget_state_history(config=cfg)) == 2
    first = (await g.aget_state_history(config=cfg))[-1]
    cfg2 = {"configurable": {"thread_id": "c", "checkpoint_id": first.checkpoint_id}}
    old = await g.aget_state(config=cfg2)
    assert old is not None and old.values["log"] == []


def test_sync_twins_work_and_refuse_inside_a_loop() -> None:
    g = chain("a", "b").compile(checkpointer=InMemoryCheckpointer())
    assert g.invoke({"log": []}, thread_id="s") == {"log": ["a", "b"]}
    assert g.run({"log": []}, thread_id="s2").status == "done"
    assert list(g.stream({"log": []}, thread_id="s3", mode="updates")) == [
        {"a": {"log": ["a"]}},
        {"b": {"log": ["b"]}},
    ]
    state = g.get_state("s")
    assert state is not None and state.values == {"log": ["a", "b"]}

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="ainvoke"):
            g.invoke({"log": []}, thread_id="x")

    asyncio.run(inside())


async def test_thread_id_rules() -> None:
    from graphexec import GraphExecError, ThreadNotFoundError

    with_cp = chain("a").compile(checkpointer=InMemoryCheckpointer())
    without = chain("a").compile()
    with pytest.raises(GraphExecError, match="thread_id"):
        await with_cp.ainvoke({"log": []})
    with pytest.raises(GraphExecError, match="checkpointer"):
        await without.ainvoke({"log": []}, thread_id="t")
    with pytest.raises(ThreadNotFoundError):
        await with_cp.ainvoke(None, thread_id="missing")
    with pytest.raises(GraphExecError, match="given twice"):
        await with_cp.ainvoke(
            {"log": []}, thread_id="a", config={"configurable": {"thread_id": "b"}}
        )


async def test_second_run_on_a_busy_thread() -> None:
    from graphexec import ThreadBusyError

    release = asyncio.Event()

    async def slow(state: S) -> dict[str, Any]:
        await asyncio.wait_for(release.wait(), 5)
        return {"log": ["slow"]}

    b = StateGraph(S)
    b.add_node("slow", slow)
    b.add_edge(START, "slow")
    b.add_edge("slow", END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    first = asyncio.create_task(g.ainvoke({"log": []}, thread_id="t"))
    await asyncio.sleep(0.05)
    with pytest.raises(ThreadBusyError):
        await g.ainvoke({"log": []}, thread_id="t")
    waiter = asyncio.create_task(g.ainvoke({"log": []}, thread_id="t", on_busy="wait"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    release.set()
    assert (await first)["log"] == ["slow"]
    assert (await waiter)["log"] == ["slow", "slow"]
    history = await g.aget_state_history("t")
    assert [h.step for h in history] == [3, 2, 1, 0]  # linear: no fork


# -- folding a step's updates (issue #19.6) ---------------------------------------------------


def _fan_out(state_type: Any, key: str, updates: list[Any], **compile_kw: Any) -> Any:
    """START -> fan -> Send('worker', i) for each update -> END; worker i writes updates[i]."""

    def worker(i: int) -> dict[str, Any]:
        return {key: updates[i]}

    b = StateGraph(state_type)
    b.add_node("fan", lambda s: None)
    b.add_node("worker", worker)
    b.add_edge(START, "fan")
    b.add_conditional_edges("fan", lambda s: [Send("worker", i) for i in range(len(updates))])
    b.add_edge("worker", END)
    return b.compile(checkpointer=InMemoryCheckpointer(), **compile_kw)


async def test_a_send_fan_out_folds_its_updates_in_linear_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Folding N one-item updates one by one with operator.add copies the growing list each
    # time: N*N/2 element copies (100k workers took minutes). Count the elements each reducer
    # call receives as its current value, which it must copy to return a new list.
    from graphexec._state import ChannelSpec

    copied = {"elements": 0, "calls": 0}
    real = ChannelSpec.reduce

    def counting(self: ChannelSpec, node: str, current: Any, update: Any) -> Any:
        if self.name == "results":
            copied["calls"] += 1
            copied["elements"] += len(current) if isinstance(current, list) else 0
        return real(self, node, current, update)

    monkeypatch.setattr(ChannelSpec, "reduce", counting)
    n = 3000
    g = _fan_out(S, "results", [[i] for i in range(n)])
    out = await g.ainvoke({"results": [-1]}, thread_id="t")
    assert out["results"] == [-1, *range(n)]
    assert copied["elements"] <= 4 * n, copied  # linear, not n*n/2 = 4.5 million
    state = await g.aget_state("t")
    assert state is not None and state.values["results"] == [-1, *range(n)]


class Texts(TypedDict, total=False):
    items: Annotated[list[Any], operator.add]
    pairs: Annotated[tuple[int, ...], operator.add]
    text: Annotated[str, operator.add]
    order: Annotated[list[int], lambda a, b: [*b, *a]]  # not a concatenation: order matters
    total: Annotated[int, lambda a, b: a * 3 + b]  # not associative
    messages: Annotated[list[Any], add_messages]


FOLDS: dict[str, tuple[str, list[Any], Any]] = {
    "operator.add on lists": ("items", [[1], [], [2, [3]], ["x", None]], None),
    "operator.add on tuples": ("pairs", [(1,), (), (2, 3)], None),
    "operator.add on str": ("text", ["ab", "", "c", "d"], None),
    "an order-sensitive reducer": ("order", [[1], [2, 3], [4]], None),
    "a non-associative reducer": ("total", [1, 2, 3, 4], None),
    "add_messages with replace and remove": (
        "messages",
        [
            [{"role": "user", "content": "a", "id": "1"}],
            [{"role": "ai", "content": "b", "id": "2"}, {"role": "user", "content": "c"}],
            [{"role": "ai", "content": "B", "id": "2"}],
            [RemoveMessage("1")],
            "bare",
        ],
        None,
    ),
    "add_messages with remove-all in the middle": (
        "messages",
        [
            [{"role": "user", "content": "a", "id": "1"}],
            [RemoveMessage(REMOVE_ALL_MESSAGES), {"role": "ai", "content": "b", "id": "2"}],
            [{"role": "ai", "content": "c", "id": "3"}],
        ],
        None,
    ),
}


@pytest.mark.parametrize("row", sorted(FOLDS))
async def test_folding_a_steps_updates_at_once_equals_folding_them_one_by_one(row: str) -> None:
    key, updates, _ = FOLDS[row]
    spec = StateSchema(Texts).channels[key]
    start: dict[str, Any] = {"total": 5, "text": "s", "pairs": (0,), "items": [0], "order": [0]}
    g = _fan_out(Texts, key, updates)
    out = await g.ainvoke({key: start[key]} if key in start else {}, thread_id="t")
    expected = start.get(key, [])
    for u in updates:  # what folding them one at a time, in Send order, gives
        prepared = StateSchema(Texts).coerce_update("worker", {key: u})[key]
        expected = spec.reduce("worker", expected, prepared)
    if key == "messages":  # ids given at write time differ between the two folds
        assert [(m["role"], m["content"]) for m in out[key]] == [
            (m["role"], m["content"]) for m in expected
        ]
        given = {"1", "2", "3"}
        assert [m["id"] for m in out[key] if m["id"] in given] == [
            m["id"] for m in expected if m["id"] in given
        ]
    else:
        assert out[key] == expected and type(out[key]) is type(expected)
    # and reading the stored deltas back gives the same value
    state = await g.aget_state("t")
    assert state is not None and state.values[key] == out[key]


BAD_IN_A_BATCH: dict[str, tuple[str, Any, type[BaseException]]] = {
    "a tuple into an operator.add list": ("results", (1, 2), TypeError),
    "an int into an operator.add list": ("results", 5, TypeError),
    "a remove of an unknown message": ("messages", [RemoveMessage("nope")], ValueError),
}


class Mixed(TypedDict, total=False):
    results: Annotated[list[int], operator.add]
    messages: Annotated[list[Any], add_messages]


@pytest.mark.parametrize("row", sorted(BAD_IN_A_BATCH))
async def test_a_bad_update_among_many_is_blamed_on_its_own_node(row: str) -> None:
    key, bad, cause = BAD_IN_A_BATCH[row]
    good = [1] if key == "results" else [{"role": "user", "content": "x"}]

    def writer(value: Any) -> Any:
        return lambda state: {key: value}

    b = StateGraph(Mixed)
    for n in ("a", "b", "c", "d"):
        b.add_node(n, writer(bad if n == "c" else good))
        b.add_edge(START, n)
        b.add_edge(n, END)
    g = b.compile(checkpointer=InMemoryCheckpointer())
    with pytest.raises(InvalidUpdateError) as err:
        await g.ainvoke({}, thread_id="t")
    assert (err.value.node, err.value.key) == ("c", key)
    assert isinstance(err.value.__cause__, cause), repr(err.value.__cause__)
    assert "node 'c'" in str(err.value)
    history = await g.aget_state_history("t")
    assert [h.step for h in history] == [0]  # the step was not committed
