"""A graph's cached head values stay right when another process writes the same SQLite thread."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path
from typing import Annotated, Any, TypedDict

from checkpointers import SqliteCheckpointer
from graphexec import END, START, CompiledGraph, StateGraph, add_messages

_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from typing import Annotated, Any, TypedDict
    from checkpointers import SqliteCheckpointer
    from graphexec import END, START, StateGraph, add_messages

    class Chat(TypedDict):
        messages: Annotated[list[Any], add_messages]

    def reply(state):
        return {"messages": [{"role": "assistant", "content": f"other-{len(state['messages'])}"}]}

    async def main(path, turns, prune):
        b = StateGraph(Chat)
        b.add_node("reply", reply)
        b.add_edge(START, "reply")
        b.add_edge("reply", END)
        async with SqliteCheckpointer.open(path) as cp:
            graph = b.compile(checkpointer=cp)
            for _ in range(turns):
                await graph.ainvoke({"messages": [("user", "from the other process")]},
                                    thread_id="t")
            if prune:
                await graph.aprune("t", keep_last=1)

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "prune"))
    """
)


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _reply(state: Chat) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": f"here-{len(state['messages'])}"}]}


def _build(cp: SqliteCheckpointer) -> CompiledGraph[Any]:
    b = StateGraph(Chat)
    b.add_node("reply", _reply)
    b.add_edge(START, "reply")
    b.add_edge("reply", END)
    return b.compile(checkpointer=cp)


async def _other_process(path: Path, script: Path, turns: int, *, prune: bool) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), str(path), str(turns), "prune" if prune else "-", env=env
    )
    assert await proc.wait() == 0


async def _assert_fresh(graph: CompiledGraph[Any], path: Path) -> list[Any]:
    got = await graph.aget_state("t")
    async with SqliteCheckpointer.open(path) as other:
        want = await _build(other).aget_state("t")
    assert got is not None and want is not None
    assert got.checkpoint_id == want.checkpoint_id
    assert got.values == want.values
    messages: list[Any] = got.values["messages"]
    return messages


async def test_cached_reads_see_another_process(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    async with SqliteCheckpointer.open(path) as cp:
        graph = _build(cp)
        for _ in range(3):
            await graph.ainvoke({"messages": [("user", "here")]}, thread_id="t")
        assert len(await _assert_fresh(graph, path)) == 6
        await _other_process(path, script, 4, prune=False)
        messages = await _assert_fresh(graph, path)
        assert len(messages) == 14 and messages[-1]["content"] == "other-13"
        out = await graph.ainvoke({"messages": [("user", "here")]}, thread_id="t")
        assert len(out["messages"]) == 16 and out["messages"][-1]["content"] == "here-15"
        await _other_process(path, script, 2, prune=True)
        messages = await _assert_fresh(graph, path)
        assert len(messages) == 20
        out = await graph.ainvoke({"messages": [("user", "here")]}, thread_id="t")
        assert out["messages"][:20] == messages and len(out["messages"]) == 22
