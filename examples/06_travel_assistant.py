"""A travel assistant with memory: one session over two "days", and a correction.

What it shows:

- A chat graph built from the ready-made memory nodes: ``load_history`` → ``load_facts_summary``
  → the assistant → ``save_items`` → ``upsert_facts``, compiled with
  ``compile(memory=SqliteMemory(path))``. The "LLM" is a fake: a pure function of the
  conversation and the facts, so the run is offline and deterministic.
- Day 1 (one OS process): the user plans a trip to Lisbon and states preferences; the
  preferences become long-term facts (``seat``, ``meal``).
- Day 2 (a fresh process, same session id, same memory file): the history and the facts
  summary are reloaded, so "Which flight should I book?" is answered for Lisbon, with the
  stored preferences.
- The correction pattern: the assistant answers a question wrongly (it picks the last city
  mentioned, Porto); the user takes the question back — ``pop_item()`` twice removes the
  assistant's answer and the user's question — and re-asks, getting the right answer.

Run it (offline; uses a temporary directory)::

    python examples/06_travel_assistant.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict

from graphexec import END, START, CompiledGraph, InMemoryCheckpointer, StateGraph
from memory import SqliteMemory
from memory.nodes import load_facts_summary, load_history, save_items, upsert_facts

SESSION = "trip-ada"
CITIES = ("Lisbon", "Porto", "Madrid")
HOTELS = {"Lisbon": "Casa Alfama", "Porto": "Casa Ribeira", "Madrid": "Hostal Sol"}


class Chat(TypedDict, total=False):
    session_id: str
    user: str
    messages: list[dict[str, Any]]
    loaded: int
    facts: str
    reply: str


def traveller(state: Mapping[str, Any]) -> tuple[str, ...]:
    return ("traveller", state["session_id"])


def fake_llm(messages: list[dict[str, Any]], facts: str) -> str:
    """The "model": a pure function of the conversation (last message = the question)."""
    question = messages[-1]["content"].lower()
    said = " ".join(m["content"] for m in messages if m["role"] == "user")
    mentioned = [(said.rfind(c), c) for c in CITIES if c in said]
    city = max(mentioned)[1] if mentioned else None  # the most recently mentioned city
    prefs = dict(line[2:].split(": ", 1) for line in facts.splitlines() if line.startswith("- "))
    if "planning a trip" in question:
        return f"{city} in May is a fine choice. Any preferences for the flight?"
    if "prefer" in question:
        noted = extract_prefs(question)
        return f"Noted: {noted.get('seat', 'any')} seat, {noted.get('meal', 'any')} meals."
    if "flight" in question:
        extras = [f"{prefs['seat']} seat" if "seat" in prefs else "any seat"]
        if "meal" in prefs:
            extras.append(f"{prefs['meal']} meal requested")
        return f"Take the 08:10 flight to {city} on 12 May, {', '.join(extras)}."
    if "hotel" in question and city is not None:
        return f"Book {HOTELS[city]} in {city}."
    return "Could you tell me more?"


def extract_prefs(text: str) -> dict[str, str]:
    """The fact extractor: preferences stated by the user."""
    text = text.lower()
    prefs: dict[str, str] = {}
    for seat in ("window", "aisle"):
        if seat in text:
            prefs["seat"] = seat
    if "vegetarian" in text:
        prefs["meal"] = "vegetarian"
    return prefs


def assistant(state: Chat) -> dict[str, Any]:
    messages = [*state.get("messages", []), {"role": "user", "content": state["user"]}]
    reply = fake_llm(messages, state.get("facts", ""))
    return {"messages": [*messages, {"role": "assistant", "content": reply}], "reply": reply}


def build(mem: SqliteMemory) -> CompiledGraph[Chat]:
    b = StateGraph(Chat)
    b.add_node("load", load_history(count_key="loaded"))
    b.add_node("facts", load_facts_summary(traveller))
    b.add_node("assistant", assistant)
    b.add_node("save", save_items(since_key="loaded"))
    b.add_node("remember", upsert_facts(lambda s: extract_prefs(s["user"]), namespace=traveller))
    b.add_edge(START, "load")
    b.add_sequence(["load", "facts", "assistant", "save", "remember"])
    b.add_edge("remember", END)
    return b.compile(checkpointer=InMemoryCheckpointer(), memory=mem, name="travel")


async def ask(graph: CompiledGraph[Chat], text: str, turn: str) -> dict[str, Any]:
    out = await graph.ainvoke({"session_id": SESSION, "user": text}, thread_id=turn)
    print(f"  user: {text}")
    print(f"  assistant: {out['reply']}")
    return out


async def day1(db: Path) -> None:
    async with SqliteMemory.open(db) as mem:
        graph = build(mem)
        await ask(graph, "I'm planning a trip to Lisbon in May.", "day1-1")
        await ask(graph, "I prefer window seats and I'm vegetarian.", "day1-2")
        facts = await mem.facts.list(traveller({"session_id": SESSION}))
        print("  facts stored: " + ", ".join(sorted(f"{f.key}={f.value}" for f in facts)))


async def day2(db: Path) -> None:
    async with SqliteMemory.open(db) as mem:
        graph = build(mem)
        out = await ask(graph, "Which flight should I book?", "day2-1")
        print(
            f"  (reloaded {out['loaded']} items of history; facts summary: "
            f"{'; '.join(sorted(line[2:] for line in out['facts'].splitlines()))})"
        )
        await ask(graph, "My cousin loved Porto. Which hotel should I book?", "day2-2")
        session = mem.session(SESSION)
        popped = [await session.pop_item(), await session.pop_item()]
        print(
            "  wrong city: the user takes the question back; popped "
            + " and ".join(f"the {p['role']} item" for p in popped if p is not None)
        )
        await ask(graph, "Which hotel should I book in Lisbon?", "day2-3")
        items = await session.get_items()
        porto = sum("Porto" in m["content"] for m in items)
        print(f"  session {SESSION!r} now holds {len(items)} items ({porto} mention Porto)")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "memory.db"
        for day in ("day1", "day2"):
            print(f"{day} (a new process, session {SESSION!r}, memory file {db.name})")
            done = subprocess.run(
                [sys.executable, __file__, day, str(db)], capture_output=True, text=True, check=True
            )
            print(done.stdout.rstrip())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "day1":
        asyncio.run(day1(Path(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "day2":
        asyncio.run(day2(Path(sys.argv[2])))
    else:
        main()
