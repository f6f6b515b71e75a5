"""Graphs the command-line tests run (imported as ``flows:<name>`` through ``--graph``)."""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from graphexec import END, START, StateGraph, interrupt


class Counter(TypedDict, total=False):
    n: int
    fail_at: int
    log: Annotated[list[str], operator.add]


def _bump(name: str) -> Any:
    def node(state: Counter) -> dict[str, Any]:
        n = state.get("n", 0) + 1
        if state.get("fail_at") == n:
            raise RuntimeError(f"{name} failed at n={n} (as asked)")
        return {"n": n, "log": [name]}

    return node


def _chain() -> StateGraph[Counter]:
    b = StateGraph(Counter)
    b.add_node("first", _bump("first"))
    b.add_node("second", _bump("second"))
    b.add_node("third", _bump("third"))
    b.add_edge(START, "first")
    b.add_sequence(["first", "second", "third"])
    b.add_edge("third", END)
    return b


chain = _chain().compile(name="chain")
"""first -> second -> third; ``fail_at=N`` makes the node that would reach n=N raise."""


class Order(TypedDict, total=False):
    item: str
    amount: int
    note: str
    log: Annotated[list[str], operator.add]


def _price(state: Order) -> dict[str, Any]:
    return {"amount": state.get("amount", 10), "log": ["priced"]}


def _charge(state: Order) -> dict[str, Any]:
    return {"log": [f"charged {state['amount']}"]}


def _refund_desk(state: Order) -> dict[str, Any]:
    return {"log": ["sent to the refund desk"]}


def _ask(state: Order) -> dict[str, Any]:
    note = interrupt({"question": f"a note for {state['item']}?"})
    return {"note": note, "log": ["noted"]}


def _approval() -> StateGraph[Order]:
    b = StateGraph(Order)
    b.add_node("price", _price)
    b.add_node("charge", _charge, needs_approval=True, preview=["item", "amount"], on_reject="desk")
    b.add_node("desk", _refund_desk)
    b.add_node("ask", _ask)
    b.add_edge(START, "price")
    b.add_edge("price", "charge")
    b.add_edge("charge", "ask")
    b.add_edge("desk", END)
    b.add_edge("ask", END)
    return b


approval = _approval().compile(name="approval")
"""price -> charge (needs approval; rejected -> desk) -> ask (interrupt for a note)."""


def broken() -> Any:
    """A factory that fails: what a user's module with a bug looks like."""
    raise ValueError("this factory is broken on purpose")


not_a_graph = 42
