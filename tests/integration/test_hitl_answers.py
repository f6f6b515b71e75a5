"""Answers a node cannot use, and edits only a reducer refuses, on every backend and durability.

A bad answer must leave the interrupt pending (the thread answerable again, ``run(None)`` asking
again rather than replaying it), without re-running the node's effects; an approved edit that a
reducer refuses must be refused before anything is recorded.
"""

from __future__ import annotations

import json
import operator
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    InvalidResumeError,
    InvalidUpdateError,
    NodeContext,
    StateGraph,
    interrupt,
)
from graphexec._types import Durability

DURABILITIES: list[Durability] = ["sync", "async", "exit"]


class Ticket(TypedDict, total=False):
    note: str
    tags: Annotated[list[str], operator.add]
    log: Annotated[list[str], operator.add]


def ask_graph(store: BaseCheckpointer, calls: Counter[str]) -> CompiledGraph[Ticket]:
    async def ask(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
        calls["ask"] += 1
        calls[f"key:{ctx.idempotency_key}"] += 1  # the key must stay the same: count them

        def open_case() -> str:
            calls["effect"] += 1
            return "case-1"

        case = await ctx.effect("open_case", open_case)
        note = interrupt({"case": case, "question": "a note?"})
        return {"note": note, "log": [f"noted on {case}"]}

    b = StateGraph(Ticket)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=store)


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_a_bad_answer_leaves_the_interrupt_pending(
    store: BaseCheckpointer, durability: Durability
) -> None:
    calls: Counter[str] = Counter()
    g = ask_graph(store, calls)
    r = await g.arun({"log": []}, thread_id="t", durability=durability)
    assert r.status == "interrupted"
    (intr,) = r.interruptions

    bad = await g.arun(Command(resume={"not": "a str"}), thread_id="t", durability=durability)
    assert bad.status == "failed" and isinstance(bad.error, InvalidUpdateError)
    assert "'note'" in str(bad.error)
    snap = await g.aget_state("t")
    assert snap is not None and [i.id for i in snap.interruptions] == [intr.id]

    # run(None) asks again instead of replaying the bad answer, as often as it is called
    for _ in range(2):
        again = await g.arun(None, thread_id="t", durability=durability)
        assert again.status == "interrupted" and [i.id for i in again.interruptions] == [intr.id]

    # a second bad answer, by id, is withdrawn too; then a good one finishes the run
    bad = await g.arun(Command(resume={intr.id: 42}), thread_id="t", durability=durability)
    assert bad.status == "failed" and isinstance(bad.error, InvalidUpdateError)
    done = await g.arun(Command(resume="call back"), thread_id="t", durability=durability)
    assert done.status == "done", done
    assert done.values["note"] == "call back" and done.values["log"] == ["noted on case-1"]
    assert calls["effect"] == 1  # the effect before interrupt() ran once through all of it
    assert len([k for k in calls if k.startswith("key:")]) == 1  # one idempotency key
    with pytest.raises(InvalidResumeError, match="no pending interrupt"):
        await g.arun(Command(resume="late"), thread_id="t")


def approval_graph(store: BaseCheckpointer, ran: list[str]) -> CompiledGraph[Ticket]:
    def tag(state: Ticket) -> dict[str, Any]:
        return {"tags": ["new"], "log": ["tagged"]}

    def file(state: Ticket) -> dict[str, Any]:
        ran.append(",".join(state["tags"]))
        return {"log": ["filed"]}

    b = StateGraph(Ticket)
    b.add_node("tag", tag)
    b.add_node("file", file, needs_approval=True, preview=["tags"])
    b.add_sequence(["tag", "file"])
    b.add_edge(START, "tag")
    b.add_edge("file", END)
    return b.compile(checkpointer=store)


@pytest.mark.parametrize("durability", DURABILITIES)
async def test_an_edit_a_reducer_refuses_is_refused_before_it_is_recorded(
    store: BaseCheckpointer, durability: Durability
) -> None:
    ran: list[str] = []
    g = approval_graph(store, ran)
    r = await g.arun({"log": []}, thread_id="t", durability=durability)
    assert r.status == "interrupted"
    before = await store.get("t")
    assert before is not None
    bad = r.to_state().approve(0, edited={"tags": "urgent"})  # a str for a list + operator.add
    with pytest.raises(InvalidResumeError, match="'tags'") as info:
        await g.arun(bad, durability=durability)
    assert "nothing was recorded" in str(info.value)
    after = await store.get("t")
    assert after is not None
    assert after.checkpoint.checkpoint_id == before.checkpoint.checkpoint_id
    assert sorted((w.task_id, w.channel, w.data) for w in after.pending_writes) == sorted(
        (w.task_id, w.channel, w.data) for w in before.pending_writes
    )
    with pytest.raises(InvalidResumeError, match="'tags'"):
        await g.arun(
            Command(resume={"decision": "approve", "edited": {"tags": "urgent"}}),
            thread_id="t",
            durability=durability,
        )
    # the interrupt is still there; a good edit goes through the reducer
    good = r.to_state().approve(0, edited={"tags": ["urgent"]})
    done = await g.arun(good, durability=durability)
    assert done.status == "done" and ran == ["new,urgent"]


def test_cli_approve_with_an_edit_a_reducer_refuses_exits_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from graphexec.cli import EXIT_INTERRUPTED, EXIT_USAGE, main

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "cli"))
    monkeypatch.chdir(tmp_path)
    for var in ("GRAPHEXEC_GRAPH", "GRAPHEXEC_DB", "GRAPHEXEC_DSN", "GRAPHEXEC_ENCRYPTION_KEYS"):
        monkeypatch.delenv(var, raising=False)
    db = tmp_path / "work.db"
    start = ["run", "flows:approval", "--thread", "o1", "--input", '{"item": "lamp", "log": []}']
    assert main([*start, "--db", str(db), "-q"]) == EXIT_INTERRUPTED
    con = sqlite3.connect(db)
    before = list(con.iterdump())
    con.close()
    capsys.readouterr()
    edit = json.dumps({"log": "not a list"})
    status = main(["approve", "o1", "--edit", edit, "--graph", "flows:approval", "--db", str(db)])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE, err
    assert "'log'" in err and "nothing was written" in err and len(err.strip().splitlines()) == 1
    con = sqlite3.connect(db)
    assert list(con.iterdump()) == before
    con.close()
