"""Crash and resume: a failed step is retried from the last checkpoint, nothing more.

What it shows:

- A four-step pipeline ``extract -> transform -> load -> notify`` whose ``load`` step fails on
  its first run (a module-level flag raises once, standing in for a crash or an outage).
  ``graph.run()`` reports ``status="failed"`` instead of raising; ``get_state`` shows the
  thread parked with ``next == ("load",)``; ``invoke(None, thread_id=...)`` resumes it.
  Per-node execution counters prove ``extract`` and ``transform`` did not run again.
- A parallel step where ``charge`` succeeds and ``reserve`` fails: ``charge``'s writes were
  saved as pending writes when it finished, so the resume re-runs only ``reserve``.

The checkpoints live in memory here, so the "crash" happens inside one process; resuming reads
nothing but the checkpoints and pending writes, which is exactly what a durable checkpointer
keeps across processes.

Run it (offline, deterministic)::

    python examples/03_crash_and_resume.py
"""

from __future__ import annotations

import asyncio
import operator
from collections import Counter
from typing import Annotated, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, StateGraph

RUNS: Counter[str] = Counter()
"""How many times each node's function was called."""

FAIL_NEXT: set[str] = set()
"""Nodes that raise the next time they run (once each)."""


def maybe_fail(node: str) -> None:
    RUNS[node] += 1
    if node in FAIL_NEXT:
        FAIL_NEXT.discard(node)
        raise ConnectionError(f"{node}: warehouse unreachable")


# -- part 1: a sequential pipeline ------------------------------------------------------------


class Pipeline(TypedDict):
    source: str
    rows: list[int]
    total: int
    log: Annotated[list[str], operator.add]


def extract(state: Pipeline) -> dict[str, object]:
    maybe_fail("extract")
    return {"rows": [3, 1, 4, 1, 5], "log": ["extract"]}


def transform(state: Pipeline) -> dict[str, object]:
    maybe_fail("transform")
    return {"rows": [r * 10 for r in state["rows"]], "log": ["transform"]}


def load(state: Pipeline) -> dict[str, object]:
    maybe_fail("load")
    return {"total": sum(state["rows"]), "log": ["load"]}


def notify(state: Pipeline) -> dict[str, object]:
    maybe_fail("notify")
    return {"log": [f"notify (total={state['total']})"]}


def build_pipeline() -> CompiledGraph[Pipeline]:
    builder = StateGraph(Pipeline)
    builder.add_sequence([extract, transform, load, notify])
    builder.add_edge(START, "extract")
    builder.add_edge("notify", END)
    return builder.compile(checkpointer=InMemoryCheckpointer())


# -- part 2: one of two parallel nodes fails --------------------------------------------------


class Order(TypedDict):
    order_id: str
    done: Annotated[list[str], operator.add]


def prepare(state: Order) -> dict[str, object]:
    maybe_fail("prepare")
    return {"done": ["prepare"]}


async def charge(state: Order) -> dict[str, object]:
    maybe_fail("charge")
    return {"done": ["charge"]}


async def reserve(state: Order) -> dict[str, object]:
    await asyncio.sleep(0.01)  # fail after 'charge' has finished and saved its writes
    maybe_fail("reserve")
    return {"done": ["reserve"]}


def confirm(state: Order) -> dict[str, object]:
    maybe_fail("confirm")
    return {"done": ["confirm"]}


def build_order() -> CompiledGraph[Order]:
    builder = StateGraph(Order)
    builder.add_node("prepare", prepare)
    builder.add_node("charge", charge)
    builder.add_node("reserve", reserve)
    builder.add_node("confirm", confirm)
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "charge")
    builder.add_edge("prepare", "reserve")
    builder.add_edge(["charge", "reserve"], "confirm")
    builder.add_edge("confirm", END)
    return builder.compile(checkpointer=InMemoryCheckpointer())


def counts(*nodes: str) -> str:
    return ", ".join(f"{n}={RUNS[n]}" for n in nodes)


def main() -> None:
    print("Part 1: load fails on its first run")
    pipeline = build_pipeline()
    FAIL_NEXT.add("load")
    result = pipeline.run({"source": "orders.csv", "log": []}, thread_id="etl-1")
    print(f"  run status: {result.status} ({type(result.error).__name__})")
    parked = pipeline.get_state("etl-1")
    assert parked is not None
    print(f"  saved state: next={parked.next}, log={parked.values['log']}")
    final = pipeline.invoke(None, thread_id="etl-1")
    print(f"  resumed: log={final['log']}")
    print(f"  executions: {counts('extract', 'transform', 'load', 'notify')}")
    assert (RUNS["extract"], RUNS["transform"], RUNS["load"]) == (1, 1, 2)

    print("Part 2: reserve fails while charge, running in parallel, succeeds")
    order = build_order()
    FAIL_NEXT.add("reserve")
    result = order.run({"order_id": "A-7", "done": []}, thread_id="order-1")
    parked = order.get_state("order-1")
    assert parked is not None
    print(f"  run status: {result.status}; next={parked.next}")
    final = order.invoke(None, thread_id="order-1")
    print(f"  resumed: done={final['done']}")
    print(f"  executions: {counts('prepare', 'charge', 'reserve', 'confirm')}")
    assert (RUNS["charge"], RUNS["reserve"]) == (1, 2), "charge must not be charged twice"


if __name__ == "__main__":
    main()
