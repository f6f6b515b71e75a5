"""Human in the loop on every backend: interrupts, resume rules, effects, approvals, RunState."""

from __future__ import annotations

import asyncio
import json
import operator
from collections import Counter
from typing import Annotated, Any, TypedDict

import pytest

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    GraphExecError,
    InvalidResumeError,
    NodeContext,
    RunState,
    Send,
    StateGraph,
    ThreadInterruptedError,
    interrupt,
)


class S(TypedDict, total=False):
    request: str
    answers: Annotated[list[str], operator.add]
    log: Annotated[list[str], operator.add]
    amount: int


def note(name: str) -> Any:
    def fn(state: S) -> dict[str, Any]:
        return {"log": [name]}

    return fn


def ask_graph(store: BaseCheckpointer, calls: Counter[str]) -> CompiledGraph[S]:
    def ask(state: S) -> dict[str, Any]:
        calls["ask"] += 1
        first = interrupt({"question": "name?"})
        second = interrupt({"question": "city?"})
        return {"answers": [first, second]}

    b = StateGraph(S)
    b.add_node("prepare", note("prepare"))
    b.add_node("ask", ask)
    b.add_node("finish", note("finish"))
    b.add_sequence(["prepare", "ask", "finish"])
    b.add_edge(START, "prepare")
    b.add_edge("finish", END)
    return b.compile(checkpointer=store)


async def test_interrupt_pauses_and_resume_returns_answers_by_id(store: BaseCheckpointer) -> None:
    calls: Counter[str] = Counter()
    g = ask_graph(store, calls)
    r1 = await g.arun({"log": []}, thread_id="t")
    assert r1.status == "interrupted"
    (i1,) = r1.interruptions
    assert (i1.node, i1.kind, i1.value) == ("ask", "input", {"question": "name?"})
    assert i1.id.startswith("intr-") and i1.created_at.tzinfo is not None
    state = await g.aget_state("t")
    assert state is not None and state.interruptions == (i1,) and state.next == ("ask",)
    assert [t.node for t in state.tasks] == ["ask"] and not state.tasks[0].finished

    r2 = await g.arun(Command(resume="Ada"), thread_id="t")
    assert r2.status == "interrupted"
    (i2,) = r2.interruptions
    assert i2.id != i1.id and i2.value == {"question": "city?"}
    # the earlier id is answered: using it again is stale
    with pytest.raises(InvalidResumeError, match="not pending"):
        await g.arun(Command(resume={i1.id: "again"}), thread_id="t")

    r3 = await g.arun(Command(resume={i2.id: "Paris"}), thread_id="t")
    assert r3.status == "done"
    assert r3.values["answers"] == ["Ada", "Paris"]
    assert r3.values["log"] == ["prepare", "finish"]
    assert calls["ask"] == 3  # the node re-ran from its top on each resume
    history = await g.aget_state_history("t")
    decided = [d for h in history for d in h.metadata.get("decisions", [])]
    assert sorted(d["interruption_id"] for d in decided) == sorted([i1.id, i2.id])
    assert {d["decision"] for d in decided} == {"resume"}


async def test_resume_rules(store: BaseCheckpointer) -> None:
    calls: Counter[str] = Counter()
    g = ask_graph(store, calls)
    await g.arun({"log": []}, thread_id="t")
    with pytest.raises(InvalidResumeError) as err:
        await g.arun(Command(resume={"intr-000000000000000000000000": 1}), thread_id="t")
    assert err.value.pending and "not pending" in str(err.value)
    with pytest.raises(ThreadInterruptedError) as busy:
        await g.arun({"log": ["new input"]}, thread_id="t")
    assert busy.value.pending
    with pytest.raises(InvalidResumeError, match="update= or goto="):
        await g.arun(Command(resume="x", goto="finish"), thread_id="t")
    # input=None on a waiting thread does not re-run the waiting node
    before = calls["ask"]
    again = await g.arun(None, thread_id="t")
    assert again.status == "interrupted" and calls["ask"] == before
    await g.arun(Command(resume="a"), thread_id="t")
    await g.arun(Command(resume="b"), thread_id="t")
    with pytest.raises(InvalidResumeError, match="no pending interrupt"):
        await g.arun(Command(resume="late"), thread_id="t")
    with pytest.raises(InvalidResumeError, match="no pending interrupt"):
        await g.arun(Command(resume="x"), thread_id="never-started")


async def test_interrupt_outside_a_node() -> None:
    with pytest.raises(GraphExecError, match="inside a node"):
        interrupt("x")


async def test_parallel_interrupts_are_all_reported_and_answered_together(
    store: BaseCheckpointer,
) -> None:
    calls: Counter[str] = Counter()

    def reviewer(name: str) -> Any:
        def fn(state: S) -> dict[str, Any]:
            calls[name] += 1
            return {"answers": [f"{name}={interrupt(f'{name} ok?')}"]}

        return fn

    b = StateGraph(S)
    b.add_node("quick", note("quick"))
    b.add_node("legal", reviewer("legal"))
    b.add_node("finance", reviewer("finance"))
    b.add_node("merge", note("merge"))
    for n in ("quick", "legal", "finance"):
        b.add_edge(START, n)
    b.add_edge(["quick", "legal", "finance"], "merge")
    b.add_edge("merge", END)
    g = b.compile(checkpointer=store)
    r1 = await g.arun({"log": []}, thread_id="t")
    assert r1.status == "interrupted"
    assert [i.node for i in r1.interruptions] == ["legal", "finance"]
    ids = {i.node: i.id for i in r1.interruptions}
    with pytest.raises(InvalidResumeError, match="2 pending"):
        await g.arun(Command(resume="yes"), thread_id="t")
    # answer one: the other stays pending and does not re-run
    r2 = await g.arun(Command(resume={ids["finance"]: "no"}), thread_id="t")
    assert r2.status == "interrupted" and [i.id for i in r2.interruptions] == [ids["legal"]]
    assert calls == Counter({"legal": 1, "finance": 2})
    r3 = await g.arun(Command(resume={ids["legal"]: "yes"}), thread_id="t")
    assert r3.status == "done"
    assert r3.values["answers"] == ["legal=yes", "finance=no"]
    assert r3.values["log"] == ["quick", "merge"]


async def test_effect_runs_once_across_two_interrupts_and_resume(store: BaseCheckpointer) -> None:
    sent: list[str] = []
    runs: Counter[str] = Counter()

    async def charge(state: S, ctx: NodeContext) -> dict[str, Any]:
        runs["charge"] += 1

        async def send_invoice() -> str:
            sent.append(ctx.idempotency_key)
            return f"INV-{len(sent)}"

        invoice = await ctx.effect("invoice", send_invoice)
        ok = interrupt({"confirm": invoice})
        amount = interrupt({"amount": invoice})
        return {"log": [f"{invoice}:{ok}:{amount}"]}

    def sync_node(state: S, ctx: NodeContext) -> dict[str, Any]:
        runs["sync"] += 1
        ticket = ctx.effect("ticket", lambda: sent.append("sync") or len(sent))
        answer = interrupt("sync?")
        return {"log": [f"ticket-{ticket}:{answer}"]}

    b = StateGraph(S)
    b.add_node("charge", charge)
    b.add_node("sync_node", sync_node)
    b.add_edge(START, "charge")
    b.add_edge("charge", "sync_node")
    b.add_edge("sync_node", END)
    g = b.compile(checkpointer=store)
    r = await g.arun({"log": []}, thread_id="t")
    key = sent[0]
    r = await g.arun(Command(resume=True), thread_id="t")
    r = await g.arun(Command(resume=42), thread_id="t")
    assert r.status == "interrupted" and r.interruptions[0].node == "sync_node"
    r = await g.arun(Command(resume="go"), thread_id="t")
    assert r.status == "done"
    assert r.values["log"] == ["INV-1:True:42", "ticket-2:go"]
    assert sent == [key, "sync"]  # each effect exactly once
    assert runs == Counter({"charge": 3, "sync": 2})


async def test_effect_result_survives_a_crash(store: BaseCheckpointer) -> None:
    sent: list[int] = []
    crash = {"on": True}

    async def node(state: S, ctx: NodeContext) -> dict[str, Any]:
        receipt = await ctx.effect("pay", lambda: sent.append(1) or len(sent))
        if crash["on"]:
            raise asyncio.CancelledError  # the process dies after paying
        return {"log": [f"receipt {receipt}"]}

    b = StateGraph(S)
    b.add_node("pay", node)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    g = b.compile(checkpointer=store)
    with pytest.raises(asyncio.CancelledError):
        await g.ainvoke({"log": []}, thread_id="t")
    crash["on"] = False
    assert (await g.ainvoke(None, thread_id="t"))["log"] == ["receipt 1"]
    assert sent == [1]


async def test_idempotency_key_stable_across_resume_and_distinct_elsewhere(
    store: BaseCheckpointer,
) -> None:
    keys: list[tuple[str | None, str]] = []

    def node(state: S, ctx: NodeContext) -> dict[str, Any]:
        keys.append((ctx.thread_id, ctx.idempotency_key))
        return {"answers": [interrupt("?")]}

    b = StateGraph(S)
    b.add_node("n", node)
    b.add_edge(START, "n")
    b.add_edge("n", END)
    g = b.compile(checkpointer=store)
    await g.arun({"log": []}, thread_id="a")
    start = (await g.aget_state_history("a"))[-1]
    await g.arun(Command(resume=1), thread_id="a")
    await g.arun({"log": []}, thread_id="b")
    await g.afork("a", start.checkpoint_id, "a-fork")
    await g.arun(None, thread_id="a-fork")
    a_keys = [k for t, k in keys if t == "a"]
    assert len(a_keys) == 2 and a_keys[0] == a_keys[1]
    others = {k for t, k in keys if t != "a"}
    assert len(others) == 2 and a_keys[0] not in others


def approval_graph(store: BaseCheckpointer, **node_options: Any) -> CompiledGraph[S]:
    def refund(state: S) -> dict[str, Any]:
        return {"log": [f"refunded {state['amount']}"]}

    b = StateGraph(S)
    b.add_node("draft", lambda s: {"amount": 50, "log": ["drafted"]})
    b.add_node("refund", refund, needs_approval=True, **node_options)
    b.add_node("close", note("closed"))
    if node_options.get("on_reject") == "apologise":
        b.add_node("apologise", note("apologised"))
        b.add_edge("apologise", "close")
    b.add_edge(START, "draft")
    b.add_edge("draft", "refund")
    b.add_edge("refund", "close")
    b.add_edge("close", END)
    return b.compile(checkpointer=store, name="refunds")


async def test_approval_preview_approve_with_edit_and_decision_record(
    store: BaseCheckpointer,
) -> None:
    g = approval_graph(store, preview=["amount"])
    r = await g.arun({"log": []}, thread_id="t")
    assert r.status == "interrupted"
    (i,) = r.interruptions
    assert (i.kind, i.node, i.value) == ("approval", "refund", {"amount": 50})
    state = r.to_state()
    state.approve(i, edited={"amount": 30}, by="alice")
    r2 = await g.arun(state)
    assert r2.status == "done"
    assert r2.values["log"] == ["drafted", "refunded 30", "closed"]
    assert r2.values["amount"] == 30
    decisions = [
        d for h in await g.aget_state_history("t") for d in h.metadata.get("decisions", [])
    ]
    assert len(decisions) == 1
    d = decisions[0]
    assert (d["decision"], d["by"], d["node"], d["kind"]) == (
        "approve",
        "alice",
        "refund",
        "approval",
    )
    assert d["edited"] == {"amount": 30} and d["at"] is not None


async def test_invalid_edits_are_refused_before_anything_is_recorded(
    store: BaseCheckpointer,
) -> None:
    g = approval_graph(store)
    r = await g.arun({"log": []}, thread_id="t")
    with pytest.raises(InvalidResumeError, match="refused"):
        await g.arun(r.to_state().approve(0, edited={"amount": "lots"}))
    with pytest.raises(InvalidResumeError, match="refused"):
        await g.arun(r.to_state().approve(0, edited={"nope": 1}))
    state = await g.aget_state("t")
    assert state is not None and [i.kind for i in state.interruptions] == ["approval"]
    done = await g.arun(r.to_state().approve(0, edited={"amount": 7}))
    assert done.values["log"] == ["drafted", "refunded 7", "closed"]


async def test_routing_after_an_approved_edit_sees_each_write_once(
    store: BaseCheckpointer,
) -> None:
    seen: list[list[str]] = []

    def route(state: S) -> str:
        seen.append(list(state["log"]))
        return END

    b = StateGraph(S)
    b.add_node("act", note("acted"), needs_approval=True)
    b.add_edge(START, "act")
    b.add_conditional_edges("act", route, [END])
    g = b.compile(checkpointer=store)
    r = await g.arun({"log": []}, thread_id="t")
    done = await g.arun(r.to_state().approve(0, edited={"log": ["edit"]}))
    assert done.values["log"] == ["edit", "acted"]
    assert seen == [["edit", "acted"]]  # the edit is folded once, not twice


async def test_reject_default_ends_the_run_as_rejected(store: BaseCheckpointer) -> None:
    g = approval_graph(store)
    r = await g.arun({"log": []}, thread_id="t")
    assert r.interruptions[0].value["amount"] == 50  # default preview: the state
    r2 = await g.arun(r.to_state().reject(0, reason="too much", by="bob"))
    assert r2.status == "rejected"
    assert r2.values["log"] == ["drafted"]
    state = await g.aget_state("t")
    assert state is not None and state.next == ()
    (d,) = state.metadata["decisions"]
    assert (d["decision"], d["reason"], d["by"]) == ("reject", "too much", "bob")


@pytest.mark.parametrize(
    ("on_reject", "log"), [("apologise", ["drafted", "apologised", "closed"]), (END, ["drafted"])]
)
async def test_reject_routes_to_on_reject(
    store: BaseCheckpointer, on_reject: str, log: list[str]
) -> None:
    g = approval_graph(store, on_reject=on_reject)
    await g.arun({"log": []}, thread_id="t")
    r = await g.arun(Command(resume=False), thread_id="t")
    assert r.status == "done" and r.values["log"] == log


async def test_approval_predicate_and_callable_preview(store: BaseCheckpointer) -> None:
    async def big(state: S) -> bool:
        return state["amount"] > 100

    g = approval_graph(store, preview=lambda s: f"refund {s['amount']}")
    r = await g.arun({"log": []}, thread_id="t")
    assert r.interruptions[0].value == "refund 50"
    b = StateGraph(S)
    b.add_node("refund", note("refunded"), needs_approval=big)
    b.add_edge(START, "refund")
    b.add_edge("refund", END)
    small = b.compile(checkpointer=store)
    assert (await small.arun({"amount": 5, "log": []}, thread_id="s")).status == "done"
    assert (await small.arun({"amount": 500, "log": []}, thread_id="b")).status == "interrupted"


async def test_approval_on_send_task_previews_its_argument(store: BaseCheckpointer) -> None:
    def pay(item: int) -> dict[str, Any]:
        return {"log": [f"paid {item}"]}

    b = StateGraph(S)
    b.add_node("plan", note("plan"))
    b.add_node("pay", pay, needs_approval=True)
    b.add_edge(START, "plan")
    b.add_conditional_edges("plan", lambda s: [Send("pay", 1), Send("pay", 2)])
    b.add_edge("pay", END)
    g = b.compile(checkpointer=store)
    r = await g.arun({"log": []}, thread_id="t")
    assert [i.value for i in r.interruptions] == [1, 2]
    state = r.to_state().approve(0).reject(1)
    with pytest.raises(InvalidResumeError, match="does not apply"):
        state.resume(0, "x")
    done = await g.arun(state)
    assert done.status == "rejected" and done.values["log"] == ["plan", "paid 1"]


async def test_run_state_json_round_trip_signing_and_refusals(store: BaseCheckpointer) -> None:
    g = approval_graph(store)
    r = await g.arun({"log": []}, thread_id="t")
    text = r.to_state().to_json(key="s3cret")
    loaded = RunState.from_json(text, g, key="s3cret")
    assert loaded.interruptions == r.interruptions
    with pytest.raises(InvalidResumeError, match="signed"):
        RunState.from_json(text, g)
    with pytest.raises(InvalidResumeError, match="does not match"):
        RunState.from_json(text, g, key="wrong")
    doc = json.loads(text)
    doc["body"]["thread_id"] = "other"
    with pytest.raises(InvalidResumeError, match="does not match"):
        RunState.from_json(json.dumps(doc), g, key="s3cret")
    unsigned = r.to_state().to_json(unsigned=True)
    with pytest.raises(InvalidResumeError, match="not signed"):
        RunState.from_json(unsigned, g, key="s3cret")
    with pytest.raises(InvalidResumeError, match="not signed"):
        RunState.from_json(unsigned, g)
    other = approval_graph(store, on_reject="apologise")
    with pytest.raises(InvalidResumeError, match="belongs to graph"):
        RunState.from_json(text, other, key="s3cret")
    with pytest.raises(InvalidResumeError, match="no decisions"):
        await g.arun(RunState.from_json(unsigned, g, allow_unsigned=True))
    # a state for a thread that moved on is stale
    stale = RunState.from_json(text, g, key="s3cret").approve(0)
    await g.arun(Command(resume=True), thread_id="t")
    with pytest.raises(InvalidResumeError, match="moved on"):
        await g.arun(stale)
    with pytest.raises(InvalidResumeError, match="belongs to thread"):
        await g.arun(stale, thread_id="another")


async def test_static_breakpoints(store: BaseCheckpointer) -> None:
    b = StateGraph(S)
    for n in ("a", "b", "c"):
        b.add_node(n, note(n))
    b.add_edge(START, "a")
    b.add_sequence(["a", "b", "c"])
    b.add_edge("c", END)
    g = b.compile(checkpointer=store, interrupt_before=["b"], interrupt_after=["b"])
    r1 = await g.arun({"log": []}, thread_id="t")
    assert r1.status == "interrupted" and r1.values["log"] == ["a"]
    assert [(i.node, i.kind) for i in r1.interruptions] == [("b", "breakpoint")]
    r2 = await g.arun(None, thread_id="t")
    assert r2.status == "interrupted" and r2.values["log"] == ["a", "b"]
    assert r2.interruptions[0].id != r1.interruptions[0].id
    state = await g.aget_state("t")
    assert state is not None and state.interruptions == r2.interruptions
    r3 = await g.arun(None, thread_id="t")
    assert r3.status == "done" and r3.values["log"] == ["a", "b", "c"]
    # new input is allowed at a breakpoint (it is not waiting for an answer)
    r4 = await g.arun({"log": ["again"]}, thread_id="t")
    assert r4.status == "interrupted"


async def test_stream_shows_interrupts(store: BaseCheckpointer) -> None:
    calls: Counter[str] = Counter()
    g = ask_graph(store, calls)
    parts = [p async for p in g.astream({"log": []}, thread_id="t", mode=["updates", "events"])]
    events = [p for m, p in parts if m == "events" and p["event"] == "interrupt"]
    assert len(events) == 1 and events[0]["interruptions"][0]["node"] == "ask"
    updates = [p for m, p in parts if m == "updates" and "__interrupt__" in p]
    assert len(updates) == 1


async def test_interrupt_inside_a_subgraph(store: BaseCheckpointer) -> None:
    inner_calls: Counter[str] = Counter()

    def inner_ask(state: S) -> dict[str, Any]:
        inner_calls["ask"] += 1
        return {"answers": [interrupt("inner?")]}

    inner = StateGraph(S)
    inner.add_node("before", note("inner-before"))
    inner.add_node("ask", inner_ask)
    inner.add_sequence(["before", "ask"])
    inner.add_edge(START, "before")
    inner.add_edge("ask", END)
    outer = StateGraph(S)
    outer.add_node("sub", inner.compile())
    outer.add_node("after", note("after"))
    outer.add_edge(START, "sub")
    outer.add_edge("sub", "after")
    outer.add_edge("after", END)
    g = outer.compile(checkpointer=store)
    r = await g.arun({"log": []}, thread_id="t")
    assert r.status == "interrupted" and r.interruptions[0].value == "inner?"
    done = await g.arun(Command(resume={r.interruptions[0].id: "deep"}), thread_id="t")
    assert done.status == "done"
    assert done.values == {"log": ["inner-before", "after"], "answers": ["deep"]}
    assert inner_calls["ask"] == 2


@pytest.mark.parametrize("durability", ["async", "exit"])
async def test_interrupts_in_other_durability_modes(
    store: BaseCheckpointer, durability: str
) -> None:
    calls: Counter[str] = Counter()
    g = ask_graph(store, calls)
    r = await g.arun({"log": []}, thread_id="t", durability=durability)  # type: ignore[arg-type]
    assert r.status == "interrupted"
    r = await g.arun(Command(resume="x"), thread_id="t", durability=durability)  # type: ignore[arg-type]
    r = await g.arun(Command(resume="y"), thread_id="t", durability=durability)  # type: ignore[arg-type]
    assert r.status == "done" and r.values["answers"] == ["x", "y"]
