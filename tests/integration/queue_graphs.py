"""Graphs served by the run-queue tests' worker processes (imported by ``graphexec worker``).

Each node appends ``"<node>"`` to the state log and a line ``<thread> <node>`` to the file named
by ``GRAPHEXEC_TEST_TRACE`` (if set), so a test can count executions across processes. Nodes
sleep ``GRAPHEXEC_TEST_STEP_SECONDS`` (default 0) to give a test time to kill a worker.

``approving`` SIGKILLs its own process inside the approved node (after the answer, before the
payment) the first time, when ``GRAPHEXEC_TEST_KILL_ONCE`` names a file that does not exist yet
(it creates it first: the event file); ``crashing`` SIGKILLs its process every time.
"""

from __future__ import annotations

import operator
import os
import signal
import time
from typing import Annotated, Any, TypedDict

from graphexec import END, START, CompiledGraph, NodeContext, StateGraph, interrupt


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    answer: str


def _trace(thread: str | None, node: str) -> None:
    path = os.environ.get("GRAPHEXEC_TEST_TRACE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{thread} {node}\n")


def _step(name: str) -> Any:
    def node(state: State, ctx: NodeContext) -> dict[str, Any]:
        time.sleep(float(os.environ.get("GRAPHEXEC_TEST_STEP_SECONDS", "0")))
        _trace(ctx.thread_id, name)
        return {"log": [name]}

    return node


def build_chain(steps: int = 6, name: str = "chain") -> CompiledGraph[State]:
    """``s0 -> s1 -> ... -> s<steps-1>``."""
    names = [f"s{i}" for i in range(steps)]
    b = StateGraph(State)
    for n in names:
        b.add_node(n, _step(n))
    b.add_edge(START, names[0])
    b.add_sequence(names)
    b.add_edge(names[-1], END)
    return b.compile(name=name, lease_ttl=1.5)


def build_asking() -> CompiledGraph[State]:
    """One node that asks a human, then a step."""

    def ask(state: State) -> dict[str, Any]:
        return {"answer": interrupt("ok?"), "log": ["asked"]}

    b = StateGraph(State)
    b.add_node("ask", ask)
    b.add_node("after", _step("after"))
    b.add_edge(START, "ask")
    b.add_edge("ask", "after")
    b.add_edge("after", END)
    return b.compile(name="asking", lease_ttl=1.5)


def build_broken() -> CompiledGraph[State]:
    """A node that always fails."""

    def boom(state: State) -> dict[str, Any]:
        raise RuntimeError("the CRM is down")

    b = StateGraph(State)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    b.add_edge("boom", END)
    return b.compile(name="broken", lease_ttl=1.5)


def build_approving() -> CompiledGraph[State]:
    """Ask for approval, then pay (``<thread> pay`` in the trace) inside the same node."""

    def pay(state: State, ctx: NodeContext) -> dict[str, Any]:
        answer = interrupt("pay 100?")
        event = os.environ.get("GRAPHEXEC_TEST_KILL_ONCE")
        if event and not os.path.exists(event):
            with open(event, "w", encoding="utf-8") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        _trace(ctx.thread_id, "pay")
        return {"answer": answer, "log": ["paid"]}

    b = StateGraph(State)
    b.add_node("pay", pay)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    return b.compile(name="approving", lease_ttl=1.5)


def build_crashing() -> CompiledGraph[State]:
    """A node that kills its worker process every time (a poison run)."""

    def die(state: State, ctx: NodeContext) -> dict[str, Any]:
        _trace(ctx.thread_id, "die")
        os.kill(os.getpid(), signal.SIGKILL)
        return {}  # pragma: no cover - killed above

    b = StateGraph(State)
    b.add_node("die", die)
    b.add_edge(START, "die")
    b.add_edge("die", END)
    return b.compile(name="crashing", lease_ttl=1.5)


chain = build_chain()
approving = build_approving()
crashing = build_crashing()
short = build_chain(2, name="short")
asking = build_asking()
broken = build_broken()
