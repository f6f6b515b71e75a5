"""Hello, graphexec: a three-node support-ticket flow, checkpointed per thread.

What it shows:

- a ``TypedDict`` state whose ``log`` key has an ``operator.add`` reducer, so every node's log
  lines are appended rather than overwritten;
- ``classify`` followed by a conditional route to ``draft`` (normal tickets) or ``escalate``
  (refund requests), both ending the run;
- two tickets run on two ``thread_id`` values of one compiled graph, each with its own state;
- ``get_state_history`` listing the checkpoints of one thread (one per superstep, plus the input).

Run it (offline, no server; the checkpoints live in memory)::

    python examples/01_hello.py
"""

from __future__ import annotations

import operator
from typing import Annotated, Literal, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, StateGraph


class Ticket(TypedDict):
    ticket_id: str
    message: str
    priority: str
    reply: str
    log: Annotated[list[str], operator.add]


def classify(state: Ticket) -> dict[str, object]:
    urgent = "refund" in state["message"].lower()
    priority = "high" if urgent else "low"
    return {"priority": priority, "log": [f"classified as {priority}"]}


def route(state: Ticket) -> Literal["high", "low"]:
    return "high" if state["priority"] == "high" else "low"


def draft(state: Ticket) -> dict[str, object]:
    reply = f"Re {state['ticket_id']}: thanks for asking, here are the steps."
    return {"reply": reply, "log": ["drafted a reply"]}


def escalate(state: Ticket) -> dict[str, object]:
    return {"reply": "Forwarded to a human agent.", "log": ["escalated to a human"]}


def build() -> CompiledGraph[Ticket]:
    builder = StateGraph(Ticket)
    builder.add_node("classify", classify)
    builder.add_node("draft", draft)
    builder.add_node("escalate", escalate)
    builder.add_edge(START, "classify")
    builder.add_conditional_edges("classify", route, {"high": "escalate", "low": "draft"})
    builder.add_edge("draft", END)
    builder.add_edge("escalate", END)
    return builder.compile(checkpointer=InMemoryCheckpointer())


def main() -> None:
    graph = build()
    tickets = {
        "ticket-1": "How do I change my password?",
        "ticket-2": "I want a refund for order 42!",
    }
    for thread_id, message in tickets.items():
        print(f"{thread_id}: {message!r}")
        final = graph.invoke(
            {"ticket_id": thread_id, "message": message, "log": []}, thread_id=thread_id
        )
        print(f"  priority={final['priority']}  reply={final['reply']!r}")
        print(f"  log: {' -> '.join(final['log'])}")

    history = graph.get_state_history("ticket-1")
    print(f"ticket-1 has {len(history)} checkpoints (newest first):")
    for snap in history:
        next_nodes = ", ".join(snap.next) or "(done)"
        print(
            f"  step {snap.step:>2}  source={snap.metadata.get('source')!s:<6}  next={next_nodes}"
        )
    print(f"threads in the checkpointer: {sorted(t.thread_id for t in graph.list_threads())}")


if __name__ == "__main__":
    main()
