"""A run in ``exit`` durability that pauses stores its last checkpoint, its interruption and
the lease release in one call (``put_with_writes_final``) when nothing else is left to store,
and the usual way (the checkpoint, then each task's writes) otherwise. Either way the thread
resumes exactly as one run in ``sync`` durability would."""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    Command,
    CompiledGraph,
    InMemoryCheckpointer,
    Send,
    StateGraph,
    interrupt,
)
from graphexec._checkpoint import Checkpoint


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


class Recording(SqliteCheckpointer):
    """Records the run-level store calls the engine makes."""

    calls: list[str]

    async def acquire_lease_and_get(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("acquire_lease_and_get")
        return await super().acquire_lease_and_get(*args, **kwargs)

    async def put(self, checkpoint: Checkpoint, **kwargs: Any) -> None:
        self.calls.append("put")
        await super().put(checkpoint, **kwargs)

    async def put_final(self, checkpoint: Checkpoint, **kwargs: Any) -> None:
        self.calls.append("put_final")
        await super().put_final(checkpoint, **kwargs)

    async def put_writes(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("put_writes")
        await super().put_writes(*args, **kwargs)

    async def put_writes_final(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("put_writes_final")
        await super().put_writes_final(*args, **kwargs)

    async def put_with_writes_final(
        self, checkpoint: Checkpoint, task_id: str, writes: Sequence[tuple[str, bytes]], **kw: Any
    ) -> None:
        self.calls.append("put_with_writes_final")
        await super().put_with_writes_final(checkpoint, task_id, writes, **kw)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Recording]:
    async with Recording.open(tmp_path / "runs.db") as cp:
        cp.calls = []
        yield cp


def _ask_twice(cp: Any) -> CompiledGraph[S]:
    """``prepare``, then ``ask`` (two interrupts, so two pauses), then ``finish``."""

    def ask(state: S) -> dict[str, Any]:
        return {"log": [interrupt("name?"), interrupt("city?")]}

    b = StateGraph(S)
    b.add_node("prepare", lambda s: {"log": ["prepare"]})
    b.add_node("ask", ask)
    b.add_node("finish", lambda s: {"log": ["finish"]})
    b.add_sequence(["prepare", "ask", "finish"])
    b.add_edge(START, "prepare")
    b.add_edge("finish", END)
    return b.compile(checkpointer=cp)


def _fan_out(cp: Any) -> CompiledGraph[S]:
    """One step of two tasks: ``quick`` finishes while ``ask`` pauses."""
    b = StateGraph(S)
    b.add_node("quick", lambda s: {"log": ["quick"]})
    b.add_node("ask", lambda s: {"log": [interrupt("ok?")]})
    b.add_conditional_edges(START, lambda s: [Send("quick", s), Send("ask", s)])
    b.add_edge("quick", END)
    b.add_edge("ask", END)
    return b.compile(checkpointer=cp)


async def _conversation(
    graph: CompiledGraph[S], answers: list[str], durability: Any
) -> list[tuple[dict[str, Any], list[str]]]:
    """The values and next nodes after each call: the input, then one call per answer."""
    out = []
    for payload in [{"log": ["in"]}, *(Command(resume=a) for a in answers)]:
        await graph.arun(payload, thread_id="t", durability=durability)
        state = await graph.aget_state("t")
        out.append((state.values, list(state.next)))
    return out


async def test_a_pause_is_one_call(store: Recording) -> None:
    graph = _ask_twice(store)
    paused = await graph.arun({"log": ["in"]}, thread_id="t", durability="exit")
    assert paused.status == "interrupted"
    assert store.calls == ["acquire_lease_and_get", "put_with_writes_final"]
    state = await graph.aget_state("t")
    assert state.values == {"log": ["in", "prepare"]} and list(state.next) == ["ask"]
    assert [i.value for i in state.interruptions] == ["name?"]
    # The lease went with it: another graph object (another process) resumes at once.
    store.calls.clear()
    other = _ask_twice(store)
    again = await other.arun(Command(resume="Ada"), thread_id="t", durability="exit")
    assert again.status == "interrupted"
    # The answer is stored first; this pause has no checkpoint held back (the step re-ran).
    assert store.calls == ["acquire_lease_and_get", "put_writes", "put_writes_final"]
    done = await other.arun(Command(resume="Paris"), thread_id="t", durability="exit")
    assert done.status == "done"
    assert done.values == {"log": ["in", "prepare", "Ada", "Paris", "finish"]}


async def test_pauses_resume_as_in_sync_durability(store: Recording) -> None:
    for build in (_ask_twice, _fan_out):
        answers = ["Ada", "Paris"] if build is _ask_twice else ["yes"]
        got = await _conversation(build(store), answers, "exit")
        assert got == await _conversation(build(InMemoryCheckpointer()), answers, "sync")
        await store.delete_thread("t")


async def test_a_step_with_other_work_to_save_pauses_the_usual_way(store: Recording) -> None:
    """``quick`` finished in the pausing step: its writes need the checkpoint stored first."""
    graph = _fan_out(store)
    paused = await graph.arun({"log": ["in"]}, thread_id="t", durability="exit")
    assert paused.status == "interrupted"
    assert store.calls == ["acquire_lease_and_get", "put", "put_writes", "put_writes_final"]
    done = await graph.arun(Command(resume="yes"), thread_id="t", durability="exit")
    assert sorted(done.values["log"]) == ["in", "quick", "yes"]
