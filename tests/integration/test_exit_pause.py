"""Human in the loop in ``exit`` durability: the run's stores are held back to its end.

A run that pauses stores its last checkpoint, its interruption and the lease release in one
call (``put_with_writes_final``) when nothing else is left to store, and the usual way (the
checkpoint, then each task's writes) otherwise. A resume's answers are held back too: stored
with the run's next pause, its failure or before an effect, and not at all once the step they
answer completes. Either way the thread goes where one in ``sync`` durability would."""

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
    NodeContext,
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
        self.calls.append("put_writes" + _channels(args[4]))
        await super().put_writes(*args, **kwargs)

    async def put_writes_final(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("put_writes_final" + _channels(args[4]))
        await super().put_writes_final(*args, **kwargs)

    async def put_with_writes_final(
        self, checkpoint: Checkpoint, task_id: str, writes: Sequence[tuple[str, bytes]], **kw: Any
    ) -> None:
        self.calls.append("put_with_writes_final")
        await super().put_with_writes_final(checkpoint, task_id, writes, **kw)


def _channels(writes: Sequence[tuple[str, bytes]]) -> str:
    return ":" + ",".join(ch.split(":")[0].strip("_") for ch, _ in writes)


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


def _nested(cp: Any) -> CompiledGraph[S]:
    """A subgraph that asks twice: answers cross a namespace, and are held back in both."""

    def ask(state: S) -> dict[str, Any]:
        return {"log": [interrupt("name?"), interrupt("city?")]}

    inner = StateGraph(S)
    inner.add_node("before", lambda s: {"log": ["inner"]})
    inner.add_node("ask", ask)
    inner.add_sequence(["before", "ask"])
    inner.add_edge(START, "before")
    inner.add_edge("ask", END)
    outer = StateGraph(S)
    outer.add_node("sub", inner.compile())
    outer.add_node("after", lambda s: {"log": ["after"]})
    outer.add_sequence(["sub", "after"])
    outer.add_edge(START, "sub")
    outer.add_edge("after", END)
    return outer.compile(checkpointer=cp)


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
    # No checkpoint is held back this time (the step re-ran): the answer goes with the pause.
    assert store.calls == ["acquire_lease_and_get", "put_writes_final:resume,interrupt"]
    store.calls.clear()
    done = await other.arun(Command(resume="Paris"), thread_id="t", durability="exit")
    assert done.status == "done"
    assert done.values == {"log": ["in", "prepare", "Ada", "Paris", "finish"]}
    # The step the answers were for completed: its checkpoint carries them, once.
    assert store.calls == ["acquire_lease_and_get", "put_final"]


async def test_pauses_resume_as_in_sync_durability(store: Recording) -> None:
    for build in (_ask_twice, _fan_out, _nested):
        answers = ["yes"] if build is _fan_out else ["Ada", "Paris"]
        got = await _conversation(build(store), answers, "exit")
        assert got == await _conversation(build(InMemoryCheckpointer()), answers, "sync")
        await store.delete_thread("t")


async def test_a_step_with_other_work_to_save_pauses_the_usual_way(store: Recording) -> None:
    """``quick`` finished in the pausing step: its writes need the checkpoint stored first."""
    graph = _fan_out(store)
    paused = await graph.arun({"log": ["in"]}, thread_id="t", durability="exit")
    assert paused.status == "interrupted"
    assert store.calls == [
        "acquire_lease_and_get",
        "put",
        "put_writes:updates,route",
        "put_writes_final:interrupt",
    ]
    done = await graph.arun(Command(resume="yes"), thread_id="t", durability="exit")
    assert sorted(done.values["log"]) == ["in", "quick", "yes"]


async def test_answers_survive_a_failure_of_the_step_they_answer(store: Recording) -> None:
    attempts: list[str] = []

    def ask(state: S) -> dict[str, Any]:
        answer = interrupt("ok?")
        attempts.append(answer)
        if len(attempts) == 1:
            raise RuntimeError("flaky")
        return {"log": [answer]}

    b = StateGraph(S)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    graph = b.compile(checkpointer=store)
    await graph.arun({"log": ["in"]}, thread_id="t", durability="exit")
    store.calls.clear()
    failed = await graph.arun(Command(resume="yes"), thread_id="t", durability="exit")
    assert failed.status == "failed" and "flaky" in repr(failed.error)
    assert store.calls == ["acquire_lease_and_get", "put_writes:resume"]
    # Retried without a new answer: the stored one is used, nobody is asked again.
    done = await graph.arun(None, thread_id="t", durability="exit")
    assert done.status == "done" and done.values == {"log": ["in", "yes"]}
    assert attempts == ["yes", "yes"]


async def test_answers_are_stored_before_an_effect_runs(store: Recording) -> None:
    """An effect's stored result must never outlive the answers it was computed from."""
    seen: list[list[str]] = []

    def ask(state: S, ctx: NodeContext) -> dict[str, Any]:
        answer = interrupt("amount?")
        receipt = ctx.effect("charge", lambda: f"charged {answer}")
        seen.append(list(store.calls))
        return {"log": [receipt]}

    b = StateGraph(S)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    graph = b.compile(checkpointer=store)
    await graph.arun({"log": ["in"]}, thread_id="t", durability="exit")
    store.calls.clear()
    done = await graph.arun(Command(resume="5"), thread_id="t", durability="exit")
    assert done.values == {"log": ["in", "charged 5"]}
    assert seen == [["acquire_lease_and_get", "put_writes:resume", "put_writes:effect"]]
