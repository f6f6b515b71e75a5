"""RunState signing by default, approvals that fail closed, answers checked against their kind."""

from __future__ import annotations

import json
import operator
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    Command,
    CompiledGraph,
    GraphExecError,
    InMemoryCheckpointer,
    InvalidResumeError,
    RunState,
    StateGraph,
)
from graphexec._hitl import Answer
from graphexec._records import encode_answers

KEY = "unit-test-key"


class Pay(TypedDict, total=False):
    amount: int
    log: Annotated[list[str], operator.add]


def pay_graph(paid: list[int]) -> CompiledGraph[Pay]:
    def pay(state: Pay) -> dict[str, Any]:
        paid.append(state["amount"])
        return {"log": [f"paid {state['amount']}"]}

    b = StateGraph(Pay)
    b.add_node("pay", pay, needs_approval=True, preview=["amount"])
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    return b.compile(checkpointer=InMemoryCheckpointer(), name="pay")


async def paused(paid: list[int]) -> tuple[CompiledGraph[Pay], RunState]:
    g = pay_graph(paid)
    r = await g.arun({"amount": 10, "log": []}, thread_id="t")
    assert r.status == "interrupted" and r.interruptions[0].kind == "approval"
    return g, r.to_state()


# -- signing is the default (#19.2) ------------------------------------------------------------


async def test_to_json_needs_a_key_or_an_explicit_unsigned() -> None:
    _, state = await paused([])
    with pytest.raises(GraphExecError, match="needs key="):
        state.to_json()
    with pytest.raises(InvalidResumeError, match="non-empty"):
        state.to_json(key="")
    with pytest.raises(InvalidResumeError, match="non-empty"):
        state.to_json(key=b"")
    with pytest.raises(GraphExecError, match="not both"):
        state.to_json(key=KEY, unsigned=True)


async def test_an_edited_unsigned_state_is_refused_and_pays_nothing() -> None:
    paid: list[int] = []
    g, state = await paused(paid)
    doc = json.loads(state.to_json(unsigned=True))
    iid = doc["body"]["interruptions"][0]["id"]
    doc["body"]["answers"] = {
        iid: {
            "decision": "approve",
            "value": None,
            "edited": {"amount": 1_000_000},
            "reason": None,
            "by": "mallory",
            "at": "2026-01-01T00:00:00+00:00",
        }
    }
    forged = json.dumps(doc)
    with pytest.raises(InvalidResumeError, match="not signed"):
        RunState.from_json(forged, g)
    with pytest.raises(InvalidResumeError, match="not signed"):
        RunState.from_json(forged, g, key=KEY)
    # only an explicit opt-out reads it (trusted text)
    assert RunState.from_json(forged, g, allow_unsigned=True).answers[iid].by == "mallory"
    assert paid == []


async def test_a_stripped_signature_is_refused_by_a_reader_without_key() -> None:
    g, state = await paused([])
    doc = json.loads(state.approve(0, edited={"amount": 1_000_000}).to_json(key=KEY))
    del doc["signature"]
    with pytest.raises(InvalidResumeError, match="not signed"):
        RunState.from_json(json.dumps(doc), g)


async def test_an_empty_key_neither_signs_nor_verifies() -> None:
    g, state = await paused([])
    text = state.to_json(key=KEY)
    for empty in ("", b""):
        with pytest.raises(InvalidResumeError, match="non-empty"):
            RunState.from_json(text, g, key=empty)
    with pytest.raises(InvalidResumeError, match="signature does not match"):
        RunState.from_json(text, g, key=KEY + "x")
    assert RunState.from_json(text, g, key=KEY).interruptions == state.interruptions


# -- an approval runs its node only on an explicit approve (#19.3) -----------------------------

WRONG_DECISIONS: list[Any] = ["deny", "rejected", None, 0, "resume", "continue", "APPROVE", 1]


@pytest.mark.parametrize("decision", WRONG_DECISIONS)
async def test_a_signed_state_with_a_wrong_decision_is_refused(decision: Any) -> None:
    paid: list[int] = []
    g, state = await paused(paid)
    doc = json.loads(state.approve(0).to_json(key=KEY))
    iid = doc["body"]["interruptions"][0]["id"]
    doc["body"]["answers"][iid]["decision"] = decision
    from graphexec._hitl import _sign

    doc["signature"] = _sign(KEY, doc["body"])  # validly signed by the key holder
    with pytest.raises(InvalidResumeError, match="decision must be one of"):
        RunState.from_json(json.dumps(doc), g, key=KEY)
    assert paid == []


@pytest.mark.parametrize("decision", WRONG_DECISIONS)
async def test_a_run_state_built_with_a_wrong_decision_does_not_run_the_node(
    decision: Any,
) -> None:
    paid: list[int] = []
    g, state = await paused(paid)
    state.answers[state.interruptions[0].id] = Answer(decision)
    with pytest.raises(InvalidResumeError, match="decision must be one of"):
        await g.arun(state)
    assert paid == []
    snap = await g.aget_state("t")
    assert snap is not None and [i.kind for i in snap.interruptions] == ["approval"]


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "deny"},
        {"decision": None},
        {"decision": 0},
        {"decision": "approve", "edited": "amount=5"},
        {"decision": "reject", "reason": 5},
        {"decision": "approve", "edited": {"amount": 5}, "by": ["x"]},
        "approve",
        None,
        0,
        1,
        Answer("deny"),  # type: ignore[arg-type]
        Answer("resume", value=True),
        Answer("reject", edited={"amount": 5}),
    ],
)
async def test_command_resume_of_an_approval_takes_only_approve_or_reject(answer: Any) -> None:
    paid: list[int] = []
    g, state = await paused(paid)
    iid = state.interruptions[0].id
    # Command(resume=None) is no resume at all (refused as new input on a waiting thread)
    for resume in ([answer] if answer is not None else []) + [{iid: answer}]:
        with pytest.raises(InvalidResumeError):
            await g.arun(Command(resume=resume), thread_id="t")
    assert paid == []
    done = await g.arun(Command(resume={"decision": "approve"}), thread_id="t")
    assert done.status == "done" and paid == [10]


async def test_a_stored_answer_with_a_wrong_decision_fails_closed() -> None:
    """An answer already in the store (older version, or written by hand) never runs the node."""
    paid: list[int] = []
    g, state = await paused(paid)
    intr = state.interruptions[0]
    store = g.checkpointer
    assert store is not None
    tup = await store.get("t")
    assert tup is not None
    task_id = next(w.task_id for w in tup.pending_writes if w.channel == "__interrupt__")
    from graphexec._tasks import TaskRecord

    rec = TaskRecord()
    rec.answers[intr.id] = Answer("deny")  # type: ignore[arg-type]
    rec.answer_info[intr.id] = (intr.node, intr.kind)
    await store.put_writes(
        "t",
        "",
        tup.checkpoint.checkpoint_id,
        task_id,
        [("__resume__", encode_answers(g.serde, rec))],
    )
    with pytest.raises(InvalidResumeError, match="neither 'approve' nor 'reject'"):
        await g.arun(None, thread_id="t")
    assert paid == []


# -- ids, deep nesting ---------------------------------------------------------------------------


async def test_resume_keys_that_look_like_ids_must_all_be_pending() -> None:
    paid: list[int] = []
    g, state = await paused(paid)
    iid = state.interruptions[0].id
    with pytest.raises(InvalidResumeError, match="not pending"):
        await g.arun(Command(resume={iid: True, "decision": "approve"}), thread_id="t")
    with pytest.raises(InvalidResumeError, match="24 hex digits"):
        await g.arun(Command(resume={"intr-" + "0" * 24: True}), thread_id="t")
    assert paid == []
    assert iid.startswith("intr-") and len(iid) == 29 and int(iid[5:], 16) >= 0


async def test_a_deeply_nested_state_is_refused_with_a_clear_error() -> None:
    g, _ = await paused([])
    deep = '{"body": ' * 200_000 + "1" + "}" * 200_000
    with pytest.raises(InvalidResumeError, match="nested too deeply"):
        RunState.from_json(deep, g, key=KEY)
    listy = "[" * 200_000 + "]" * 200_000
    with pytest.raises(InvalidResumeError, match="nested too deeply"):
        RunState.from_json(listy, g)
