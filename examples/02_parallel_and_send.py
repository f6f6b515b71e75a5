"""Parallel branches, a join, and map-reduce with ``Send``, watched through ``stream``.

What it shows:

- Two branches start together from ``START``: ``fetch_profile`` then ``enrich_profile`` (two
  steps) and ``fetch_orders`` (one step). ``add_edge(["enrich_profile", "fetch_orders"],
  "report")`` makes ``report`` a join: it runs once, after both branches, although they finish
  in different supersteps.
- Map-reduce: ``split`` fans out one ``Send("score", doc)`` per document; the eight ``score``
  tasks run concurrently and finish in a scrambled order (each sleeps a duration derived from its
  index), yet the reducer sees their results in the order the ``Send`` objects were made, so
  the collected list is in document order. ``summarize`` then runs once.
- ``stream(..., mode="updates")`` yields ``{node: update}`` as each task finishes.

Run it (offline, deterministic, well under a second)::

    python examples/02_parallel_and_send.py
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, Send, StateGraph

# -- part 1: two branches of different lengths, joined ----------------------------------------


class Customer(TypedDict):
    customer: str
    trail: Annotated[list[str], operator.add]
    report: str


async def fetch_profile(state: Customer) -> dict[str, object]:
    await asyncio.sleep(0.01)
    return {"trail": ["profile"]}


async def enrich_profile(state: Customer) -> dict[str, object]:
    await asyncio.sleep(0.01)
    return {"trail": ["enriched"]}


async def fetch_orders(state: Customer) -> dict[str, object]:
    await asyncio.sleep(0.03)
    return {"trail": ["orders"]}


def report(state: Customer) -> dict[str, object]:
    return {"report": f"{state['customer']}: {' + '.join(state['trail'])}", "trail": ["report"]}


def build_join() -> CompiledGraph[Customer]:
    builder = StateGraph(Customer)
    builder.add_node("fetch_profile", fetch_profile)
    builder.add_node("enrich_profile", enrich_profile)
    builder.add_node("fetch_orders", fetch_orders)
    builder.add_node("report", report)
    builder.add_edge(START, "fetch_profile")
    builder.add_edge(START, "fetch_orders")
    builder.add_edge("fetch_profile", "enrich_profile")
    builder.add_edge(["enrich_profile", "fetch_orders"], "report")
    builder.add_edge("report", END)
    return builder.compile(checkpointer=InMemoryCheckpointer())


# -- part 2: map-reduce with Send -------------------------------------------------------------

DOCS = [
    "refund policy",
    "shipping times",
    "password reset",
    "invoice format",
    "gift cards",
    "returns label",
    "account deletion",
    "store hours",
]


class Batch(TypedDict):
    docs: list[str]
    scores: Annotated[list[str], operator.add]
    best: str


class DocTask(TypedDict):
    index: int
    text: str


def split(state: Batch) -> dict[str, object]:
    return {"docs": [doc.strip().lower() for doc in state["docs"]]}


def fan_out(state: Batch) -> list[Send]:
    return [Send("score", DocTask(index=i, text=doc)) for i, doc in enumerate(state["docs"])]


async def score(task: DocTask) -> dict[str, object]:
    # A scrambled but reproducible finishing order: index i sleeps ((3 * i) % 8) * 10 ms.
    await asyncio.sleep(((3 * task["index"]) % 8) * 0.01)
    value = sum(ord(c) for c in task["text"]) % 100
    return {"scores": [f"{task['index']}:{value}"]}


def summarize(state: Batch) -> dict[str, object]:
    best = max(state["scores"], key=lambda s: int(s.split(":")[1]))
    return {"best": state["docs"][int(best.split(":")[0])]}


def build_map_reduce() -> CompiledGraph[Batch]:
    builder = StateGraph(Batch)
    builder.add_node("split", split)
    builder.add_node("score", score)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "split")
    builder.add_conditional_edges("split", fan_out)
    builder.add_edge("score", "summarize")
    builder.add_edge("summarize", END)
    return builder.compile(checkpointer=InMemoryCheckpointer())


def main() -> None:
    print("Part 1: two branches of different lengths, joined by 'report'")
    join = build_join()
    for update in join.stream({"customer": "ada", "trail": []}, thread_id="join-1", mode="updates"):
        for node, values in update.items():
            print(f"  {node:<15} finished -> {values}")
    history = reversed(join.get_state_history("join-1"))
    steps = [f"step {s.step}: {', '.join(s.metadata['writes'])}" for s in history if s.step > 0]
    print(f"  supersteps: {'; '.join(steps)}")
    final = join.get_state("join-1")
    assert final is not None
    print(f"  'report' waited for both branches and ran once: {final.values['report']!r}")

    print("Part 2: map-reduce over 8 documents with Send")
    graph = build_map_reduce()
    finished: list[str] = []
    for update in graph.stream({"docs": DOCS}, thread_id="batch-1", mode="updates"):
        for node, values in update.items():
            if node == "score":
                finished.extend(values["scores"])
                continue
            if finished:
                order = ", ".join(s.split(":")[0] for s in finished)
                print(f"  {len(finished)} score tasks finished, in this order: {order}")
            print(f"  {node} finished")
    state = graph.get_state("batch-1")
    assert state is not None
    print(f"  collected in document order: {state.values['scores']}")
    print(f"  best match: {state.values['best']!r}")


if __name__ == "__main__":
    main()
