"""Hostile human-in-the-loop input: forged decisions, unsigned states, bad edits and answers.

On SQLite and PostgreSQL, one paused payment (an approval-gated ``pay`` node, then a node that
asks for a note) meets every hostile input below. Each must be refused with
:class:`~graphexec.InvalidResumeError` (or, for an answer the node cannot use, fail the run with
the interrupt pending again) while the payment is never made, the store keeps no trace of the
refused input, and the thread still finishes with a good answer afterwards:

- an approval answered with any decision but an explicit approve or reject, through a signed
  RunState, ``Command(resume=...)`` and an answer stored behind the engine's back;
- RunState documents that are unsigned, had their signature stripped, or use an empty key;
- approved edits that only a reducer refuses;
- answers the node cannot use (its update fails validation);
- RunState documents nested far beyond the parser's stack.
"""

from __future__ import annotations

import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from rel_backends import backend_params, make_backend, open_spec
from rel_support import STATS

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    InvalidResumeError,
    RunState,
    StateGraph,
    interrupt,
)
from graphexec._hitl import Answer, _sign
from graphexec._records import encode_answers
from graphexec._tasks import RESUME, TaskRecord

KEY = "battery-key"

WRONG_DECISIONS: list[Any] = [
    "deny",
    "rejected",
    "Approve",
    "approve ",
    "resume",
    "continue",
    "",
    None,
    0,
    1,
    True,
    ["approve"],
    {"decision": "approve"},
]


class Pay(TypedDict, total=False):
    amount: int
    note: str
    log: Annotated[list[str], operator.add]


def pay_graph(store: BaseCheckpointer, paid: list[int]) -> CompiledGraph[Pay]:
    def pay(state: Pay) -> dict[str, Any]:
        paid.append(state["amount"])
        return {"log": [f"paid {state['amount']}"]}

    def ask(state: Pay) -> dict[str, Any]:
        return {"note": interrupt("a note?"), "log": ["noted"]}

    b = StateGraph(Pay)
    b.add_node("pay", pay, needs_approval=True, preview=["amount"])
    b.add_node("ask", ask)
    b.add_edge(START, "pay")
    b.add_edge("pay", "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=store, name="pay")


async def stored(store: BaseCheckpointer, thread: str) -> tuple[str, list[tuple[str, str, bytes]]]:
    tup = await store.get(thread)
    assert tup is not None
    writes = sorted((w.task_id, w.channel, w.data) for w in tup.pending_writes)
    return tup.checkpoint.checkpoint_id, writes


def forged(text: str, change: Any) -> str:
    doc = json.loads(text)
    change(doc)
    return json.dumps(doc)


@pytest.mark.parametrize("kind", backend_params())
async def test_hostile_hitl_input_is_refused(kind: str, tmp_path: Path) -> None:
    async with make_backend(kind, tmp_path) as backend, open_spec(backend.spec) as store:
        paid: list[int] = []
        g = pay_graph(store, paid)
        r = await g.arun({"amount": 10, "log": []}, thread_id="p")
        assert r.status == "interrupted"
        state = r.to_state()
        (intr,) = state.interruptions
        before = await stored(store, "p")

        # -- decisions of every wrong kind, by every path --
        signed = state.approve(0).to_json(key=KEY)
        for decision in WRONG_DECISIONS:

            def set_decision(doc: dict[str, Any], d: Any = decision) -> None:
                doc["body"]["answers"][intr.id]["decision"] = d
                doc["signature"] = _sign(KEY, doc["body"])  # the key holder signed it

            with pytest.raises(InvalidResumeError):
                RunState.from_json(forged(signed, set_decision), g, key=KEY)
            STATS.add("hostile", kind="hostile HITL: wrong decisions")
            built = r.to_state()
            built.answers[intr.id] = Answer(decision)
            with pytest.raises(InvalidResumeError):
                await g.arun(built)
            STATS.add("hostile", kind="hostile HITL: wrong decisions")
            # as a raw Command value, True and {"decision": "approve"} are real approvals
            raw = decision is True or isinstance(decision, dict)
            resumes = [{intr.id: Answer(decision)}] + ([] if raw else [{intr.id: decision}])
            for resume in resumes:
                with pytest.raises(InvalidResumeError):
                    await g.arun(Command(resume=resume), thread_id="p")
                STATS.add("hostile", kind="hostile HITL: wrong decisions")
            assert await stored(store, "p") == before
        # an answer stored behind the engine's back fails closed, the node does not run
        rec = TaskRecord()
        rec.answers[intr.id] = Answer("deny")  # type: ignore[arg-type]
        rec.answer_info[intr.id] = (intr.node, intr.kind)
        task_id = next(t for t, ch, _ in before[1] if ch == "__interrupt__")
        await store.put_writes(
            "p", "", before[0], task_id, [(RESUME, encode_answers(g.serde, rec))]
        )
        with pytest.raises(InvalidResumeError, match="neither 'approve' nor 'reject'"):
            await g.arun(None, thread_id="p")
        STATS.add("hostile", kind="hostile HITL: wrong decisions")
        assert paid == []
        # the forged stored answer is withdrawn with the failure: the approval is pending again
        snap = await g.aget_state("p")
        assert snap is not None and [i.id for i in snap.interruptions] == [intr.id]
        before = await stored(store, "p")

        # -- unsigned, stripped-signature and empty-key states --
        approved = state.approve(0, edited={"amount": 1_000_000})
        unsigned = approved.to_json(unsigned=True)
        stripped = forged(approved.to_json(key=KEY), lambda doc: doc.pop("signature"))
        for text in (unsigned, stripped):
            for key in (None, KEY):
                with pytest.raises(InvalidResumeError, match="not signed"):
                    RunState.from_json(text, g, key=key)
                STATS.add("hostile", kind="hostile HITL: unsigned states")
        for empty in ("", b""):
            with pytest.raises(InvalidResumeError, match="non-empty"):
                approved.to_json(key=empty)
            with pytest.raises(InvalidResumeError, match="non-empty"):
                RunState.from_json(approved.to_json(key=KEY), g, key=empty)
            STATS.add("hostile", kind="hostile HITL: unsigned states", n=2)
        assert paid == [] and await stored(store, "p") == before

        # -- edits only a reducer refuses: refused before anything is recorded --
        for edit in ({"log": "paid 0"}, {"log": 5}, {"log": {"a": 1}}):
            with pytest.raises(InvalidResumeError, match="'log'"):
                await g.arun(r.to_state().approve(0, edited=edit))
            with pytest.raises(InvalidResumeError, match="'log'"):
                resume = {"decision": "approve", "edited": edit}
                await g.arun(Command(resume=resume), thread_id="p")
            STATS.add("hostile", kind="hostile HITL: reducer-refused edits", n=2)
            assert await stored(store, "p") == before
        assert paid == []

        # -- deep nesting --
        for deep in (
            '{"body": ' * 200_000 + "1" + "}" * 200_000,
            "[" * 200_000 + "]" * 200_000,
            '{"body": {"format": ' + "[" * 200_000 + "]" * 200_000 + "}}",
        ):
            with pytest.raises(InvalidResumeError, match="nested too deeply"):
                RunState.from_json(deep, g, key=KEY)
            STATS.add("hostile", kind="hostile HITL: deep nesting")

        # the thread is unharmed: approve, then answers the node cannot use
        asked = await g.arun(Command(resume=True), thread_id="p")
        assert asked.status == "interrupted" and paid == [10]
        (note,) = asked.interruptions
        for bad in ({"not": "a str"}, 42, ["x"], None, 1.5):
            failed = await g.arun(Command(resume={note.id: bad}), thread_id="p")
            assert failed.status == "failed", bad
            snap = await g.aget_state("p")
            assert snap is not None and [i.id for i in snap.interruptions] == [note.id]
            again = await g.arun(None, thread_id="p")  # asks again, never replays the bad answer
            assert again.status == "interrupted" and again.interruptions[0].id == note.id
            STATS.add("hostile", kind="hostile HITL: bad answers")
        finished = await g.arun(Command(resume="ok"), thread_id="p")
        assert finished.status == "done" and finished.values["note"] == "ok"
        assert finished.values["log"] == ["paid 10", "noted"] and paid == [10]
