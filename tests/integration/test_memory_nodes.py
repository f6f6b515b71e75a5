"""The ready-made memory nodes (``memory.nodes``) in real graphs, crashes included.

Every test that takes ``mem`` runs on both backends: SQLite (a file) and PostgreSQL (a fresh
schema; skipped, saying why, when no server is configured).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, TypedDict

import pytest

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    CompiledGraph,
    InMemoryCheckpointer,
    MemoryStoreError,
    NodeContext,
    StateGraph,
)
from memory import Block, PostgresMemory, SqliteMemory
from memory.nodes import (
    MemoryNode,
    archival_insert,
    archival_search,
    compact,
    load_facts_summary,
    load_history,
    render_blocks,
    save_items,
    sleeptime,
    upsert_facts,
)


class Chat(TypedDict, total=False):
    session_id: str
    user: str
    messages: list[dict[str, Any]]
    loaded: int
    facts: str
    core_memory: str
    query: str
    hits: list[dict[str, Any]]
    note: str
    note_ids: list[str]
    compaction: dict[str, Any] | None


Memory = SqliteMemory | PostgresMemory


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
async def mem(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Memory]:
    if request.param == "sqlite":
        async with SqliteMemory.open(tmp_path / "memory.db") as m:
            yield m
        return
    from pg import fresh_schema, postgres_dsn

    async with fresh_schema() as schema, PostgresMemory.open(postgres_dsn(), schema=schema) as pm:
        yield pm


def chain(*nodes: tuple[str, Any], memory: Any, checkpointer: Any = None) -> CompiledGraph[Chat]:
    b = StateGraph(Chat)
    for name, fn in nodes:
        b.add_node(name, fn)
    b.add_edge(START, nodes[0][0])
    if len(nodes) > 1:
        b.add_sequence([name for name, _ in nodes])
    b.add_edge(nodes[-1][0], END)
    return b.compile(checkpointer=checkpointer or InMemoryCheckpointer(), memory=memory)


def echo_agent(state: Chat) -> dict[str, Any]:
    said = state["user"]
    return {
        "messages": [
            *state.get("messages", []),
            {"role": "user", "content": said},
            {"role": "assistant", "content": f"you said {said}"},
        ]
    }


def chat_graph(mem: Memory, limit: int | None = None, **save: Any) -> CompiledGraph[Chat]:
    return chain(
        ("load", load_history(limit=limit, count_key="loaded")),
        ("agent", echo_agent),
        ("save", save_items(**save)),
        memory=mem,
    )


# -- sessions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("save", [{}, {"since_key": "loaded"}])
@pytest.mark.parametrize("limit", [None, 1, 3])
async def test_history_round_trip_over_turns(
    mem: Memory, limit: int | None, save: dict[str, Any]
) -> None:
    g = chat_graph(mem, limit=limit, **save)
    for i, text in enumerate(["a", "b", "a", "c"]):
        out = await g.ainvoke({"session_id": "s1", "user": text}, thread_id=f"t{i}")
        assert out["loaded"] == (2 * i if limit is None else min(limit, 2 * i))
    items = await mem.session("s1").get_items()
    assert [m["content"] for m in items] == [
        "a", "you said a", "b", "you said b", "a", "you said a", "c", "you said c",
    ]  # fmt: skip
    assert await mem.session("other").get_items() == []


async def test_save_items_twice_stores_nothing_more(mem: Memory) -> None:
    g = chain(
        ("load", load_history()),
        ("agent", echo_agent),
        ("save", save_items()),
        ("save_again", save_items()),
        memory=mem,
    )
    await g.ainvoke({"session_id": "s", "user": "hi"}, thread_id="t")
    assert len(await mem.session("s").get_items()) == 2


async def test_nodes_without_memory_raise_a_clear_error() -> None:
    g = chain(("load", load_history()), memory=None)
    with pytest.raises(MemoryStoreError, match=r"compile\(memory="):
        await g.ainvoke({"session_id": "s"}, thread_id="t")


async def test_missing_session_id_is_a_memory_error(mem: Memory) -> None:
    g = chain(("load", load_history()), memory=mem)
    with pytest.raises(MemoryStoreError, match="session_id"):
        await g.ainvoke({"user": "x"}, thread_id="t")


# -- facts, blocks, archival --------------------------------------------------------------------


async def test_upsert_then_load_facts_summary(mem: Memory) -> None:
    async def extract(state: Mapping[str, Any]) -> dict[str, Any]:
        return {"seat": "window"} if "window" in state["user"] else {}

    g = chain(
        ("extract", upsert_facts(extract, namespace=lambda s: ("user", s["session_id"]))),
        ("facts", load_facts_summary(lambda s: ("user", s["session_id"]))),
        memory=mem,
    )
    out = await g.ainvoke({"session_id": "u1", "user": "I like the window"}, thread_id="t1")
    assert out["facts"] == "- seat: window"
    fact = await mem.facts.get(("user", "u1"), "seat")
    assert fact is not None and fact.source == "extract" and fact.version == 1
    out = await g.ainvoke({"session_id": "u2", "user": "aisle"}, thread_id="t2")
    assert out["facts"] == ""


async def test_render_blocks(mem: Memory) -> None:
    await mem.blocks.create(Block("human", "Name: Ada", limit=100, description="the user"))
    await mem.blocks.create(Block("persona", "A travel agent", limit=100))
    g = chain(("render", render_blocks(labels=["human"])), memory=mem)
    out = await g.ainvoke({}, thread_id="t")
    assert "<memory_blocks>" in out["core_memory"] and "Name: Ada" in out["core_memory"]
    assert "travel agent" not in out["core_memory"]


async def test_archival_insert_then_search(mem: Memory) -> None:
    g = chain(
        ("insert", archival_insert("note", tags=("travel",), into="note_ids")),
        ("search", archival_search("query", "hits", top_k=3, tags=["travel"])),
        memory=mem,
    )
    out = await g.ainvoke(
        {"note": "The Lisbon hotel has a rooftop pool.", "query": "Lisbon hotel pool"},
        thread_id="t",
    )
    (pid,) = out["note_ids"]
    assert out["hits"][0]["id"] == pid and out["hits"][0]["tags"] == ["travel"]
    g2 = chain(("search", archival_search("query", "hits", tags=["work"])), memory=mem)
    assert (await g2.ainvoke({"query": "Lisbon"}, thread_id="t2"))["hits"] == []


# -- crashes: a re-run step writes nothing twice ------------------------------------------------


class Crash:
    """Cancels the run (a simulated crash) after the wrapped memory node wrote, once."""

    def __init__(self, inner: MemoryNode) -> None:
        self.inner = inner
        self.calls = 0

    async def __call__(self, state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        self.calls += 1
        update = await self.inner(state, ctx)
        if self.calls == 1:
            raise asyncio.CancelledError  # dies after the store committed, before the step did
        return update


@pytest.mark.parametrize("backend", ["memory", "sqlite", "same database"])
async def test_crash_after_writes_then_resume_writes_once(
    mem: Memory, tmp_path: Path, backend: str
) -> None:
    cp: Any
    if backend == "memory":
        cp = InMemoryCheckpointer()
    elif backend == "same database" and isinstance(mem, PostgresMemory):
        from pg import postgres_dsn

        from checkpointers import PostgresCheckpointer

        cp = PostgresCheckpointer(postgres_dsn(), schema=mem.schema)
    elif backend == "same database" and mem.path is not None:
        cp = SqliteCheckpointer(mem.path)  # checkpoints and memory in one file
    else:
        cp = SqliteCheckpointer(tmp_path / "c")
    crashing = {
        "save": Crash(save_items()),
        "facts": Crash(upsert_facts(lambda s: {"seat": s["user"]}, namespace=("u",))),
        "insert": Crash(archival_insert("user", into="note_ids")),
    }
    try:
        g = chain(
            ("load", load_history()),
            ("agent", echo_agent),
            *crashing.items(),
            memory=mem,
            checkpointer=cp,
        )
        inp = {"session_id": "s", "user": "window"}
        with pytest.raises(asyncio.CancelledError):
            await g.ainvoke(inp, thread_id="t")
        for _ in range(2):  # each resume gets one step further before the next crash
            with pytest.raises(asyncio.CancelledError):
                await g.ainvoke(None, thread_id="t")
        out = await g.ainvoke(None, thread_id="t")
    finally:
        if backend != "memory":
            await cp.aclose()
    assert [c.calls for c in crashing.values()] == [2, 2, 2]
    assert [m["content"] for m in await mem.session("s").get_items()] == [
        "window",
        "you said window",
    ]
    assert [v.value for v in await mem.facts.history(("u",), "seat")] == ["window"]
    page = await mem.archival.list()
    assert [h.passage.text for h in page.hits] == ["window"]
    assert out["note_ids"] == [page.hits[0].passage.id]


async def test_custom_node_with_op_key_survives_crash(mem: Memory) -> None:
    calls = 0

    async def remember(state: Chat, ctx: NodeContext) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        key = ctx.idempotency_key
        await mem.session("s").add_items([{"role": "user", "content": "hi"}], op_key=key)
        await mem.facts.put(("u",), "k", calls, op_key=key)
        await mem.archival.insert("a passage", op_key=key)
        if calls == 1:
            raise asyncio.CancelledError
        return {}

    g = chain(("remember", remember), memory=mem)
    with pytest.raises(asyncio.CancelledError):
        await g.ainvoke({}, thread_id="t")
    await g.ainvoke(None, thread_id="t")
    assert calls == 2
    assert len(await mem.session("s").get_items()) == 1
    assert [v.value for v in await mem.facts.history(("u",), "k")] == [1]
    assert len((await mem.archival.list()).hits) == 1


# -- compaction -----------------------------------------------------------------------------------


def long_turns(n: int) -> list[dict[str, Any]]:
    cities = ["Lisbon", "Porto", "Madrid", "Seville", "Rome", "Paris", "Berlin", "Vienna"]
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"Turn {i} talks about {cities[i % len(cities)]} museums and trains. "
            + "More detail here. " * 5,
        }
        for i in range(n)
    ]


async def test_compact_below_threshold_does_nothing(mem: Memory) -> None:
    await mem.session("s").add_items(long_turns(4))
    g = chain(("compact", compact(budget_tokens=10_000, into="compaction")), memory=mem)
    out = await g.ainvoke({"session_id": "s"}, thread_id="t")
    assert out["compaction"] is None
    assert len(await mem.session("s").get_items()) == 4


async def test_compact_past_threshold_summarises_and_evicts(mem: Memory) -> None:
    session = mem.session("s")
    await session.add_items(long_turns(12))
    before = await session.get_items()
    per_item = -(-len(before[0]["content"]) // 4)
    budget = per_item * 10  # 12 items > 0.7 * budget
    g = chain(
        ("compact", compact(budget_tokens=budget, keep_last=4, into="compaction")), memory=mem
    )
    out = await g.ainvoke({"session_id": "s"}, thread_id="t")
    report = out["compaction"]
    assert report is not None and len(report["evicted"]) >= 2
    after = await session.get_items()
    summary, *rest = after
    assert summary["role"] == "system" and summary["replaces"] == report["evicted"]
    assert summary["content"] == report["summary"] and "Turn 0" in summary["content"]
    assert rest == before[len(report["evicted"]) :]
    assert len(rest) >= 4
    # evicted items are still found by recall
    hits = await mem.recall.search("Turn 1 Porto", session_id="s")
    assert any(h.evicted and "Turn 1 talks" in h.item["content"] for h in hits)


async def test_compact_with_custom_summarizer_and_counter(mem: Memory) -> None:
    class OnePerItem:
        def count(self, text: str) -> int:
            return 1

    seen: list[int] = []

    async def summarize(items: Any, max_chars: int) -> str:
        seen.append(len(items))
        return f"{len(items)} old turns"

    await mem.session("s").add_items(long_turns(10))
    node = compact(
        budget_tokens=10, threshold=0.7, summarizer=summarize, counter=OnePerItem(), keep_last=4
    )
    g = chain(("compact", node), memory=mem)
    await g.ainvoke({"session_id": "s"}, thread_id="t")
    items = await mem.session("s").get_items()
    # 10 > 7 tokens: evict down to target 0.4 * 10 = 4 -> 6 evicted, 4 kept + summary
    assert seen == [6] and len(items) == 5 and items[0]["content"] == "6 old turns"
    assert len(items[0]["replaces"]) == 6


async def test_compact_keeps_keep_last(mem: Memory) -> None:
    await mem.session("s").add_items(long_turns(3))
    g = chain(("compact", compact(budget_tokens=10, keep_last=4, into="compaction")), memory=mem)
    out = await g.ainvoke({"session_id": "s"}, thread_id="t")
    assert out["compaction"] is None and len(await mem.session("s").get_items()) == 3


def test_compact_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        compact(budget_tokens=0)
    with pytest.raises(ValueError):
        compact(threshold=0.5, target=0.6)


# -- sleep-time consolidation -------------------------------------------------------------------


async def test_sleeptime_runs_every_n_and_per_session(mem: Memory) -> None:
    runs: list[tuple[str, int]] = []

    async def consolidate(memory: Any, state: Mapping[str, Any]) -> None:
        assert memory is mem
        runs.append((state["session_id"], len(runs)))
        await memory.facts.put(("merged",), state["session_id"], len(runs))

    g = chain(("sleep", sleeptime(consolidate, every=3)), memory=mem)
    for i in range(7):
        await g.ainvoke({"session_id": "a"}, thread_id=f"a{i}")
    await g.ainvoke({"session_id": "b"}, thread_id="b0")
    assert [s for s, _ in runs] == ["a", "a"]
    fact = await mem.facts.get(("graphexec", "sleeptime", "sleep"), "a")
    assert fact is not None and fact.value == 7


async def test_sleeptime_crash_does_not_double_count(mem: Memory) -> None:
    calls: list[int] = []
    g = chain(
        ("sleep", Crash(sleeptime(lambda m, s: calls.append(1), every=1))),
        memory=mem,
    )
    with pytest.raises(asyncio.CancelledError):
        await g.ainvoke({"session_id": "a"}, thread_id="t")
    await g.ainvoke(None, thread_id="t")
    fact = await mem.facts.get(("graphexec", "sleeptime", "sleep"), "a")
    assert fact is not None and fact.value == 1
    assert calls == [1]


def test_node_names_follow_the_factory() -> None:
    assert load_history().__name__ == "load_history"
    assert compact().__name__ == "compact"
