"""Memory in the graph: core-memory blocks, archival search, session history, compaction, recall.

What it shows, on a product-support assistant whose "LLM" is a deterministic fake:

- **Blocks** (core memory, Letta-style): a ``persona`` block (read-only for the agent) and a
  ``customer`` block the agent edits with ``append``/``replace`` (exactly-one-match, within the
  block's ``limit``). ``render_blocks`` puts them in the state as ``<memory_blocks>`` XML.
- **Archival**: product notes inserted with tags; ``archival_search`` turns the user's question
  into hits (hybrid full-text + vector search, tag filter applied inside the query).
- **Sessions**: ``load_history`` / ``save_items`` keep the conversation per session id; a
  ``pop_item`` correction removes a wrong answer and its question.
- **Compaction**: ``compact`` keeps the session under a small token budget: the oldest items
  are summarised into one system item that lists the ids it replaced.
- **Recall**: an evicted item is still found by ``mem.recall.search``.
- **Facts**: ``mem.facts`` with an audit history (``history``) of a changed preference.

Run it (offline; uses a temporary directory)::

    python examples/07_memory.py
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, NodeContext, StateGraph
from memory import Block, SqliteMemory
from memory.nodes import archival_search, compact, load_history, render_blocks, save_items

NOTES = [
    ("The K2 kettle has a 1.7 litre capacity and switches off automatically when boiling.", "k2"),
    ("Descale the K2 kettle monthly with citric acid; never use vinegar on the filter.", "k2"),
    ("The T9 toaster has six browning levels and a defrost button.", "t9"),
    ("Warranty: two years on all appliances, three years when registered online.", "policy"),
    ("Returns are accepted within 30 days with the receipt.", "policy"),
]


class Chat(TypedDict, total=False):
    session_id: str
    question: str
    core_memory: str
    found: list[dict[str, Any]]
    messages: list[dict[str, Any]]


async def answer(state: Chat, ctx: NodeContext) -> dict[str, Any]:
    """The fake LLM: answers from the best archival hit, notes what it learned in a block."""
    best = state["found"][0]["text"] if state["found"] else "I do not know that yet."
    question = state["question"]
    if "my name is" in question.lower():
        name = question.rsplit(" ", 1)[-1].strip(".")
        await ctx.memory.blocks.replace("customer", "name: unknown", f"name: {name}")
        best = f"Nice to meet you, {name}."
    if "kettle" in question.lower():
        await ctx.memory.blocks.append("customer", "owns: K2 kettle")
    turn = [{"role": "user", "content": question}, {"role": "assistant", "content": best}]
    return {"messages": [*state["messages"], *turn]}


def build(mem: SqliteMemory) -> CompiledGraph[Chat]:
    b = StateGraph(Chat)
    b.add_node("blocks", render_blocks())
    b.add_node("history", load_history())
    b.add_node("search", archival_search("question", "found", top_k=2))
    b.add_node("answer", answer)
    b.add_node("save", save_items())
    b.add_node("compact", compact(budget_tokens=120, threshold=0.7, keep_last=2))
    b.add_edge(START, "blocks")
    b.add_sequence(["blocks", "history", "search", "answer", "save", "compact"])
    b.add_edge("compact", END)
    return b.compile(checkpointer=InMemoryCheckpointer(), memory=mem, name="assistant")


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with SqliteMemory.open(Path(tmp) / "memory.db") as mem:
            await mem.blocks.create(
                Block("persona", "I am Kit, a calm appliance helper.", 200, "who I am", True)
            )
            await mem.blocks.create(
                Block("customer", "name: unknown", 120, "what I know about the customer")
            )
            for text, tag in NOTES:
                await mem.archival.insert(text, tags=(tag,))
            page = await mem.archival.search("how long is the warranty", tags=["policy"])
            print(f"archival, tag 'policy': {page.hits[0].passage.text}")

            graph = build(mem)
            questions = [
                "Hello, my name is Ada.",
                "How do I descale my kettle?",
                "How many browning levels on the toaster?",
                "What about the warranty?",
            ]
            for i, q in enumerate(questions):
                out = await graph.ainvoke(
                    {"session_id": "ada", "question": q}, thread_id=f"turn-{i}"
                )
                print(f"Q: {q}\n   A: {out['messages'][-1]['content']}")

            customer = await mem.blocks.get("customer")
            assert customer is not None
            print(f"block 'customer' now: {customer.value!r}")
            try:
                await mem.blocks.append("persona", " I also sell insurance.")
            except Exception as e:  # read-only for the agent
                print(f"agent edit of 'persona' refused: {type(e).__name__}")
            print("rendered for the prompt:")
            print("   " + (await mem.blocks.render(["customer"])).replace("\n", "\n   "))

            session = mem.session("ada")
            items = await session.get_items()
            summary = items[0]
            print(
                f"session 'ada' holds {len(items)} items; the first is a {summary['role']} "
                f"summary replacing {len(summary.get('replaces', []))} evicted items"
            )
            hits = await mem.recall.search("name Ada", session_id="ada")
            print(
                f"recall still finds the evicted greeting: {hits[0].item['content']!r} "
                f"(evicted={hits[0].evicted})"
            )

            wrong = await session.pop_item()
            asked = await session.pop_item()
            assert wrong is not None and asked is not None
            print(f"pop_item correction: removed {asked['content']!r} and its answer")
            q = "What about returns?"
            out = await graph.ainvoke({"session_id": "ada", "question": q}, thread_id="redo")
            print(f"re-asked: {q}\n   A: {out['messages'][-1]['content']}")

            ns = ("customers", "ada")
            await mem.facts.put(ns, "contact", "email", source="signup form")
            await mem.facts.put(ns, "contact", "phone, after 5pm", source="chat turn 3")
            fact = await mem.facts.get(ns, "contact")
            assert fact is not None
            versions = await mem.facts.history(ns, "contact")
            print(
                f"fact contact = {fact.value!r}; history: "
                + ", ".join(f"{v.value!r} from {v.source}" for v in versions)
            )


if __name__ == "__main__":
    asyncio.run(main())
