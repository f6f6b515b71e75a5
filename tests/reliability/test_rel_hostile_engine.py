"""Hostile input to the engine, one row per test, on every backend (memory, SQLite, PostgreSQL).

Each row makes a node (or a caller) do something the schema or the graph forbids and asserts the
precise error, that nothing past the input checkpoint was written, and that the thread is still
usable afterwards.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import pydantic
import pytest
from rel_support import STATS

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    CheckpointNotFoundError,
    Command,
    CompiledGraph,
    GraphExecError,
    InvalidUpdateError,
    RecursionLimitError,
    Send,
    SerializationError,
    StateGraph,
)


class Ticket(pydantic.BaseModel):
    n: int = 0
    log: Annotated[list[str], operator.add] = []
    payload: str = ""


def _cycle() -> list[Any]:
    a: list[Any] = []
    a.append(a)
    return a


def _deep(depth: int) -> Any:
    v: Any = "leaf"
    for _ in range(depth):
        v = [v]
    return v


@dataclass(frozen=True)
class Row:
    node: Callable[[Ticket], Any]
    error: type[BaseException]
    cause: type[BaseException] | None = None
    match: str = ""


ROWS: dict[str, Row] = {
    "unknown state key": Row(lambda s: {"nope": 1}, InvalidUpdateError, match="unknown state key"),
    "wrong type for a key": Row(lambda s: {"n": "seven"}, InvalidUpdateError, match="declared int"),
    "None for an int key": Row(lambda s: {"n": None}, InvalidUpdateError, match="declared int"),
    "not a dict": Row(lambda s: 42, InvalidUpdateError, match="must return a dict"),
    "a bare string": Row(lambda s: "DROP TABLE", InvalidUpdateError, match="must return a dict"),
    "reducer given a non-list": Row(lambda s: {"log": 5}, InvalidUpdateError, TypeError),
    "goto an unknown node": Row(
        lambda s: Command(goto="nowhere"), InvalidUpdateError, match="unknown node 'nowhere'"
    ),
    "goto END-like name": Row(
        lambda s: Command(goto="__end__x"), InvalidUpdateError, match="unknown node"
    ),
    "Send to an unknown node": Row(
        lambda s: [Send("nowhere", 1)], InvalidUpdateError, match="nowhere"
    ),
    "unserializable object": Row(
        lambda s: {"log": [object()]}, InvalidUpdateError, SerializationError, "not registered"
    ),
    "a function in state": Row(
        lambda s: {"log": [print]}, InvalidUpdateError, SerializationError, "functions"
    ),
    "a reference cycle": Row(lambda s: {"log": _cycle()}, InvalidUpdateError, SerializationError),
    "nesting 5000 deep": Row(
        lambda s: {"log": [_deep(5000)]}, InvalidUpdateError, SerializationError, "nests too"
    ),
    "oversized value (over serde.max_bytes)": Row(
        lambda s: {"payload": "x" * (2 << 20)},
        InvalidUpdateError,
        SerializationError,
        "over the limit of 1048576 bytes",
    ),
}


def graph_with(cp: BaseCheckpointer, node: Callable[[Ticket], Any]) -> CompiledGraph[Ticket]:
    b = StateGraph(Ticket)
    b.add_node("a", node)
    b.add_node("b", lambda s: {"log": ["b"]})
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", END)
    graph = b.compile(checkpointer=cp)
    graph.serde.max_bytes = 1 << 20  # the configurable limit, small for the oversized row
    return graph


@pytest.mark.parametrize("row", sorted(ROWS))
async def test_hostile_node_output_is_refused(store: BaseCheckpointer, row: str) -> None:
    spec = ROWS[row]
    graph = graph_with(store, spec.node)
    result = await graph.arun({"n": 0}, thread_id="t")
    assert result.status == "failed"
    assert type(result.error) is spec.error, repr(result.error)
    if spec.cause is not None:
        assert isinstance(result.error.__cause__, spec.cause), repr(result.error.__cause__)
    assert spec.match in str(result.error) + str(result.error.__cause__)
    STATS.add("hostile", kind="hostile engine rows")
    # nothing but the input checkpoint was written, and the thread still works
    history = await graph.aget_state_history("t")
    assert [s.step for s in history] == [0]
    fixed = graph_with(store, lambda s: {"log": ["a"]})
    done = await fixed.ainvoke(None, thread_id="t")
    assert done["log"] == ["a", "b"]


UPDATES: dict[str, tuple[dict[str, Any], str | None, type[BaseException], str]] = {
    "update with an unknown key": ({"zzz": 1}, "a", InvalidUpdateError, "unknown state key"),
    "update with a wrong type": ({"n": "abc"}, "a", InvalidUpdateError, "declared int"),
    "update as an unknown node": ({"n": 1}, "nowhere", GraphExecError, "no such node"),
    "update as an injection node name": (
        {"n": 1},
        "a'; DROP TABLE graphexec_heads; --",
        GraphExecError,
        "no such node",
    ),
    "update oversized": ({"payload": "y" * (2 << 20)}, "a", InvalidUpdateError, "max_bytes"),
}


@pytest.mark.parametrize("row", sorted(UPDATES))
async def test_hostile_update_state_is_refused(store: BaseCheckpointer, row: str) -> None:
    values, as_node, error, match = UPDATES[row]
    graph = graph_with(store, lambda s: {"log": ["a"]})
    await graph.ainvoke({"n": 0}, thread_id="t")
    before = [s.checkpoint_id for s in await graph.aget_state_history("t")]
    with pytest.raises(error, match=match):
        await graph.aupdate_state("t", values, as_node=as_node)
    STATS.add("hostile", kind="hostile engine rows")
    assert [s.checkpoint_id for s in await graph.aget_state_history("t")] == before


async def test_hostile_input_is_refused_before_anything_is_written(store: BaseCheckpointer) -> None:
    graph = graph_with(store, lambda s: {"log": ["a"]})
    for bad in ({"n": "bad"}, {"unknown": 1}, {"log": "not a list"}):
        with pytest.raises(InvalidUpdateError):
            await graph.ainvoke(bad, thread_id="t")
        STATS.add("hostile", kind="hostile engine rows")
    assert await graph.aget_state("t") is None


async def test_unknown_checkpoint_ids_are_errors_not_silent(store: BaseCheckpointer) -> None:
    graph = graph_with(store, lambda s: {"log": ["a"]})
    await graph.ainvoke({"n": 0}, thread_id="t")
    for cid in ("nope", "' OR '1'='1", "%", "_", ""):
        with pytest.raises(CheckpointNotFoundError):
            await graph.ainvoke(None, thread_id="t", checkpoint_id=cid or "0")
        STATS.add("hostile", kind="hostile engine rows")


async def test_a_loop_without_exit_stops_at_the_recursion_limit(store: BaseCheckpointer) -> None:
    b = StateGraph(Ticket)
    b.add_node("spin", lambda s: {"n": s.n + 1})
    b.add_edge(START, "spin")
    b.add_conditional_edges("spin", lambda s: "spin" if s.n >= 0 else END)
    graph = b.compile(checkpointer=store, recursion_limit=12)
    with pytest.raises(RecursionLimitError) as info:
        await graph.ainvoke({"n": 0}, thread_id="t")
    assert info.value.limit == 12 and info.value.cycle == ("spin",)
    STATS.add("hostile", kind="hostile engine rows")
    state = await graph.aget_state("t")
    assert state is not None and state.values["n"] == 12 and state.next == ("spin",)
    with pytest.raises(RecursionLimitError):  # resumable, and stops again
        await graph.ainvoke(None, thread_id="t")
    assert len(await store.list_tips("t")) == 1
