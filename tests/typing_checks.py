"""Static typing checks: run by mypy (scripts/test), never executed by pytest."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict, assert_type

from graphexec import (
    CompiledGraph,
    InMemoryCheckpointer,
    RunResult,
    StateGraph,
    StateSnapshot,
)


class State(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def node(state: State) -> dict[str, Any]:
    return {"n": state["n"] + 1}


builder = StateGraph(State)
assert_type(builder, StateGraph[State])
assert_type(builder.add_node("a", node), StateGraph[State])
graph = builder.compile(checkpointer=InMemoryCheckpointer())
assert_type(graph, CompiledGraph[State])
assert_type(graph.invoke({"n": 0, "log": []}, thread_id="t"), dict[str, Any])
assert_type(graph.run({"n": 0, "log": []}, thread_id="t"), RunResult)
assert_type(graph.get_state("t"), StateSnapshot | None)
assert_type(graph.get_state_history("t"), list[StateSnapshot])
assert_type(graph.update_state("t", {"n": 1}), str)


async def async_api() -> None:
    assert_type(await graph.ainvoke(None, thread_id="t"), dict[str, Any])
    assert_type(await graph.arun(None, thread_id="t"), RunResult)
    assert_type(await graph.aget_state("t"), StateSnapshot | None)
