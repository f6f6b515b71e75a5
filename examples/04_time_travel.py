"""Time travel: list a thread's history, replay from a checkpoint, edit state, fork, prune.

What it shows, on a small draft/review loop that redrafts until ``version >= quality_bar``:

- ``get_state_history`` lists one checkpoint per superstep, newest first.
- Replay: ``invoke(None, thread_id=t, checkpoint_id=c)`` re-executes from checkpoint ``c``;
  steps before ``c`` are not re-run, and the new checkpoints form a branch whose parent is
  ``c``. ``list_branches`` shows both branch tips and which one is the head.
- ``update_state(t, values, as_node="draft", checkpoint_id=c)`` writes a human edit as if the
  ``draft`` node had produced it (so ``review`` runs next) on a new branch; ``invoke(None, ...)``
  continues from it.
- ``fork(t, c, "t-fork")`` copies the thread at ``c`` into a new thread; the fork raises the
  quality bar and runs on, and the source thread is untouched.
- ``prune(t, keep_last=3)`` drops older checkpoints and side branches.

Run it (offline, deterministic)::

    python examples/04_time_travel.py
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Annotated, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, StateGraph

RUNS: Counter[str] = Counter()
"""How many times each node's function was called."""


class Doc(TypedDict):
    topic: str
    version: int
    text: str
    quality_bar: int
    edited: bool
    notes: Annotated[list[str], operator.add]


def draft(state: Doc) -> dict[str, object]:
    RUNS["draft"] += 1
    version = state.get("version", 0) + 1
    return {"version": version, "text": f"{state['topic']} v{version}", "notes": [f"v{version}"]}


def review(state: Doc) -> dict[str, object]:
    RUNS["review"] += 1
    ok = state.get("edited", False) or state["version"] >= state["quality_bar"]
    return {"notes": ["ok" if ok else "redo"]}


def route(state: Doc) -> str:
    return END if state["notes"][-1] == "ok" else "draft"


def build() -> CompiledGraph[Doc]:
    builder = StateGraph(Doc)
    builder.add_node("draft", draft)
    builder.add_node("review", review)
    builder.add_edge(START, "draft")
    builder.add_edge("draft", "review")
    builder.add_conditional_edges("review", route, ["draft", END])
    return builder.compile(checkpointer=InMemoryCheckpointer())


def branches(graph: CompiledGraph[Doc], thread_id: str) -> str:
    tips = graph.list_branches(thread_id)
    return ", ".join(f"step {b.step}{' (head)' if b.is_head else ''}" for b in tips)


def main() -> None:
    graph = build()
    t = "doc-1"
    graph.invoke({"topic": "Refund policy", "quality_bar": 3, "notes": []}, thread_id=t)
    history = graph.get_state_history(t)
    print(f"History of {t}: {len(history)} checkpoints, oldest first (step:next node):")
    print("  " + " | ".join(f"{s.step}:{','.join(s.next) or 'done'}" for s in reversed(history)))
    print(f"  notes: {history[0].values['notes']}")
    by_step = {s.step: s for s in history}

    print("Replay from step 2 (after the first review):")
    RUNS.clear()
    c2 = by_step[2].checkpoint_id
    replayed = graph.invoke(None, thread_id=t, checkpoint_id=c2)
    print(f"  re-ran draft={RUNS['draft']}, review={RUNS['review']}; notes: {replayed['notes']}")
    first_new = next(s for s in graph.get_state_history(t) if s.step == 3)
    print(f"  the new branch starts at step 2's checkpoint: {first_new.parent_id == c2}")
    print(f"  branches: {branches(graph, t)}")

    print("Edit the first draft by hand, as node 'draft', and continue:")
    c1 = by_step[1].checkpoint_id
    graph.update_state(
        t,
        {"text": "Refunds within 30 days.", "edited": True, "notes": ["hand edit"]},
        as_node="draft",
        checkpoint_id=c1,
    )
    edited = graph.get_state(t)
    assert edited is not None
    print(f"  after update_state: next={edited.next}")
    final = graph.invoke(None, thread_id=t)
    print(f"  text={final['text']!r}, notes: {final['notes']}")
    print(f"  branches: {branches(graph, t)}")

    print("Fork at step 2 into 'doc-1-strict' and raise the quality bar there:")
    graph.fork(t, c2, "doc-1-strict")
    graph.update_state("doc-1-strict", {"quality_bar": 5})
    forked = graph.invoke(None, thread_id="doc-1-strict")
    source = graph.get_state(t)
    assert source is not None
    print(f"  fork:   version={forked['version']}, notes: {forked['notes']}")
    print(f"  source: still {source.values['text']!r} at step {source.step}")

    # the oldest kept checkpoint gets a full snapshot, so exactly 3 remain, all readable.
    deleted = graph.prune(t, keep_last=3)
    print(f"prune(keep_last=3) deleted {deleted} checkpoints of {t}:")
    remaining = len(graph.get_state_history(t))
    print(f"  {remaining} remain on the current branch; branches: {branches(graph, t)}")
    print(f"  threads: {sorted(info.thread_id for info in graph.list_threads())}")


if __name__ == "__main__":
    main()
