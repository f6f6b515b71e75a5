"""The reference workflows of the reliability battery (not a test module).

Five shapes users build: ``linear`` (a chain), ``fanout`` (``Send`` map and a join), ``loop``
(a cycle that grows an ``add_messages`` list), ``hitl`` (an approval gate and an ``interrupt``)
and ``memory`` (facts and session items written through the memory tiers). Each node execution
appends ``pid step task_id node`` to ``exec.log`` in the run's log folder (one ``O_APPEND``
write: it survives SIGKILL) and every side effect goes through ``ctx.effect`` into an external
"ledger" (``effects.log``: ``pid idempotency_key name``), deduplicated by the idempotency key the
way a payment API would be.

:func:`drive` runs a workflow to its end, answering every approval/interrupt, so a crash-free
run and a killed-and-resumed one can be compared.
"""

from __future__ import annotations

import asyncio
import operator
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    Command,
    CompiledGraph,
    NodeContext,
    Send,
    StateGraph,
    add_messages,
    interrupt,
)

LEASE_TTL = 0.4
"""Short, so a killed run's thread is taken over quickly by the next generation."""
NAP_SCALE = 1.0
"""Multiplies every node's nap (a worker sets it: slow runs for the paused-owner tests)."""


class FlowState(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    n: int
    parts: Annotated[list[int], operator.add]
    messages: Annotated[list[dict[str, Any]], add_messages]
    case: str
    note: str


INPUT: FlowState = {"log": [], "n": 0, "parts": [], "messages": [], "case": "", "note": ""}


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _nap(ctx: NodeContext, lo: float = 0.002, hi: float = 0.012) -> float:
    # Deterministic per task (so reruns look alike), varied between tasks.
    span = (hash(ctx.task_id) % 1000) / 1000
    return (lo + (hi - lo) * span) * NAP_SCALE


@dataclass
class Recorder:
    folder: Path

    def executed(self, ctx: NodeContext) -> None:
        _append(self.folder / "exec.log", f"{os.getpid()} {ctx.step} {ctx.task_id} {ctx.node}")

    def effect(self, ctx: NodeContext, name: str) -> Callable[[], str]:
        def fire() -> str:
            _append(self.folder / "effects.log", f"{os.getpid()} {ctx.idempotency_key} {name}")
            return f"{name}-done"

        return fire


def _linear(cp: BaseCheckpointer | None, mem: Any, rec: Recorder) -> CompiledGraph[Any]:
    names = [f"s{i}" for i in range(8)]

    def step(name: str) -> Any:
        async def node(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
            rec.executed(ctx)
            await asyncio.sleep(_nap(ctx))
            out: dict[str, Any] = {"log": [name], "n": state["n"] + 1}
            if name in ("s3", "s6"):
                out["case"] = await ctx.effect("notify", rec.effect(ctx, f"notify-{name}"))
            return out

        return node

    b = StateGraph(FlowState)
    for name in names:
        b.add_node(name, step(name))
    b.add_edge(START, names[0])
    b.add_sequence(names)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp, memory=mem, name="linear", lease_ttl=LEASE_TTL)


def _fanout(cp: BaseCheckpointer | None, mem: Any, rec: Recorder) -> CompiledGraph[Any]:
    def split(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        return {"log": ["split"]}

    async def part(i: int, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        await asyncio.sleep(0.004 * (i + 1))
        await ctx.effect("charge", rec.effect(ctx, f"charge-{i}"))
        return {"parts": [i], "log": [f"part{i}"]}

    def join(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        return {"log": ["join"], "n": sum(state["parts"])}

    def after(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        time.sleep(0.005)
        return {"log": ["after"]}

    b = StateGraph(FlowState)
    b.add_node("split", split)
    b.add_node("part", part)
    b.add_node("join", join)
    b.add_node("after", after)
    b.add_edge(START, "split")
    b.add_conditional_edges("split", lambda s: [Send("part", i) for i in range(6)])
    b.add_edge("part", "join")
    b.add_edge("join", "after")
    b.add_edge("after", END)
    return b.compile(checkpointer=cp, memory=mem, name="fanout", lease_ttl=LEASE_TTL)


LOOP_TURNS = 14


def _loop(cp: BaseCheckpointer | None, mem: Any, rec: Recorder) -> CompiledGraph[Any]:
    async def chat(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        await asyncio.sleep(_nap(ctx))
        n = state["n"]
        text = f"turn {n}: " + "lorem ipsum " * (20 + 5 * n)
        update: dict[str, Any] = {
            "n": n + 1,
            "messages": [{"id": f"m{n}", "role": "assistant", "content": text}],
        }
        if n % 5 == 4:  # an edit of an earlier message, by id
            update["messages"].append({"id": f"m{n - 2}", "role": "assistant", "content": "edited"})
        return update

    b = StateGraph(FlowState)
    b.add_node("chat", chat)
    b.add_edge(START, "chat")
    b.add_conditional_edges("chat", lambda s: "chat" if s["n"] < LOOP_TURNS else END)
    return b.compile(
        checkpointer=cp, memory=mem, name="loop", lease_ttl=LEASE_TTL, recursion_limit=100
    )


def _hitl(cp: BaseCheckpointer | None, mem: Any, rec: Recorder) -> CompiledGraph[Any]:
    def prepare(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        return {"log": ["prepared"]}

    async def crm(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        case = await ctx.effect("open_case", rec.effect(ctx, "open_case"))
        note = interrupt({"case": case, "question": "anything to add?"})
        await asyncio.sleep(0.005)
        return {"case": case, "note": str(note), "log": ["crm"]}

    def close(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
        rec.executed(ctx)
        return {"log": ["closed"]}

    b = StateGraph(FlowState)
    b.add_node("prepare", prepare)
    b.add_node("crm", crm, needs_approval=True)
    b.add_node("close", close)
    b.add_edge(START, "prepare")
    b.add_edge("prepare", "crm")
    b.add_edge("crm", "close")
    b.add_edge("close", END)
    return b.compile(checkpointer=cp, memory=mem, name="hitl", lease_ttl=LEASE_TTL)


MEMORY_SESSION = "rel-session"
MEMORY_NS = ("rel", "user")


def _memory(cp: BaseCheckpointer | None, mem: Any, rec: Recorder) -> CompiledGraph[Any]:
    names = [f"m{i}" for i in range(6)]

    def step(i: int, name: str) -> Any:
        async def node(state: FlowState, ctx: NodeContext) -> dict[str, Any]:
            rec.executed(ctx)
            memory = ctx.memory
            await memory.facts.put(
                MEMORY_NS,
                f"fact{i % 3}",
                {"turn": i, "text": f"value {i}"},
                source=name,
                op_key=f"{ctx.idempotency_key}:fact",
            )
            await asyncio.sleep(_nap(ctx))
            await memory.session(MEMORY_SESSION).add_items(
                [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": i}],
                op_key=f"{ctx.idempotency_key}:items",
            )
            return {"log": [name], "n": state["n"] + 1}

        return node

    b = StateGraph(FlowState)
    for i, name in enumerate(names):
        b.add_node(name, step(i, name))
    b.add_edge(START, names[0])
    b.add_sequence(names)
    b.add_edge(names[-1], END)
    return b.compile(checkpointer=cp, memory=mem, name="memory", lease_ttl=LEASE_TTL)


BUILDERS: dict[str, Callable[[BaseCheckpointer | None, Any, Recorder], CompiledGraph[Any]]] = {
    "linear": _linear,
    "fanout": _fanout,
    "loop": _loop,
    "hitl": _hitl,
    "memory": _memory,
}
WORKFLOWS = tuple(BUILDERS)
DURABILITIES = ("sync", "async", "exit")


def build(name: str, cp: BaseCheckpointer | None, mem: Any, folder: Path) -> CompiledGraph[Any]:
    return BUILDERS[name](cp, mem, Recorder(folder))


def answer_for(kind: str) -> Any:
    """What the battery's human answers: approve every approval, a fixed note otherwise."""
    return True if kind == "approval" else "call back tomorrow"


async def drive(
    graph: CompiledGraph[Any],
    thread_id: str,
    *,
    durability: str = "sync",
    fresh: bool,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run (``fresh``) or resume the thread to its end, answering every pending interrupt."""
    command: Any = INPUT if fresh else None
    for _ in range(10):
        state = None if fresh and command is INPUT else await graph.aget_state(thread_id)
        if state is not None and state.interruptions:
            command = Command(
                resume={i.id: answer_for(i.kind) for i in state.interruptions},
            )
        async for event in graph.astream(
            command,
            thread_id=thread_id,
            durability=durability,  # type: ignore[arg-type]
            on_busy="wait",
            mode="events",
        ):
            if on_event is not None:
                on_event(event)
        state = await graph.aget_state(thread_id)
        assert state is not None
        if not state.interruptions and not state.next:
            return dict(state.values)
        command = None
    raise AssertionError(f"{graph.name}: thread {thread_id} did not finish")


async def memory_contents(mem: Any) -> dict[str, Any]:
    """What the memory workflow leaves in its stores (to compare with a crash-free run)."""
    facts = await mem.facts.list(MEMORY_NS)
    history = {f.key: [v.value for v in await mem.facts.history(MEMORY_NS, f.key)] for f in facts}
    items = await mem.session(MEMORY_SESSION).get_items()
    return {
        "facts": sorted((f.key, repr(f.value), f.version) for f in facts),
        "history": history,
        "items": items,
    }
