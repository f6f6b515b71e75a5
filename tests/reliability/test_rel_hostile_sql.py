"""SQL-injection strings and namespace confusion, on every store, as data and only as data.

Each injection string (``rel_support.INJECTIONS``, each tagged with a unique ``gxinj`` marker) is
used as a thread id, checkpoint id, checkpoint namespace, metadata key and value, state value,
session id, fact namespace/key/value/source, block label, archival tag and search query. Each
must round-trip exactly, leave every table in place and every other thread/namespace untouched.
Namespace confusion (``foo`` vs ``foobar``, ``%``, ``_``, separators) must never let one id see,
list or delete another's rows (the ``LIKE``-prefix class of bugs). The SQL-text audit
(``test_rel_zz_sql_audit``) then checks that none of these strings ever reached SQL text.
"""

from __future__ import annotations

import operator
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from rel_backends import MEMORY_FACTORIES, Backend, backend_params, make_backend, memory_params
from rel_support import INJECTIONS, STATS

from graphexec import (
    END,
    START,
    BaseCheckpointer,
    CheckpointNotFoundError,
    CompiledGraph,
    GraphExecError,
    MemoryStoreError,
    StateGraph,
)
from graphexec.testing import put_chain

CONFUSABLE = ["foo", "foobar", "fo%", "f_o", "%", "_", "foo%", "foo_", "FOO", "foo ", "fo", "f"]
"""Ids that a prefix/``LIKE``/case-folding lookup would confuse with one another."""


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]
    owner: str


def notes_graph(cp: BaseCheckpointer) -> CompiledGraph[Any]:
    def write(state: Notes) -> dict[str, Any]:
        return {"notes": [f"note of {state['owner']}"]}

    b = StateGraph(Notes)
    b.add_node("write", write)
    b.add_edge(START, "write")
    b.add_edge("write", END)
    return b.compile(checkpointer=cp)


@pytest.fixture(params=backend_params())
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with make_backend(request.param, tmp_path) as b:
        yield b


async def _control(graph: CompiledGraph[Any]) -> None:
    await graph.ainvoke({"notes": [], "owner": "control"}, thread_id="control")


async def _assert_control_intact(graph: CompiledGraph[Any], backend: Backend, tables: Any) -> None:
    state = await graph.aget_state("control")
    assert state is not None and state.values == {"notes": ["note of control"], "owner": "control"}
    assert backend.tables() == tables, "a table was created or dropped"
    assert backend.integrity_problems() == []


async def test_injection_strings_as_thread_ids(backend: Backend) -> None:
    async with backend.open() as cp:
        graph = notes_graph(cp)
        await _control(graph)
        tables = backend.tables()
        for s in INJECTIONS:
            done = await graph.ainvoke({"notes": [], "owner": s}, thread_id=s)
            assert done == {"notes": [f"note of {s}"], "owner": s}
            STATS.add("hostile", kind="hostile SQL strings")
        listed = {t.thread_id for t in await graph.alist_threads()}
        assert listed == {*INJECTIONS, "control"}
        for s in INJECTIONS:
            state = await graph.aget_state(s)
            assert state is not None and state.values["owner"] == s
            assert len(await graph.alist_branches(s)) == 1
        await graph.adelete_thread(INJECTIONS[1])  # the DROP TABLE one
        assert await graph.aget_state(INJECTIONS[1]) is None
        assert {t.thread_id for t in await graph.alist_threads()} == (
            {*INJECTIONS, "control"} - {INJECTIONS[1]}
        )
        await _assert_control_intact(graph, backend, tables)


async def test_injection_strings_as_checkpoint_ids(backend: Backend) -> None:
    async with backend.open() as cp:
        graph = notes_graph(cp)
        await _control(graph)
        tables = backend.tables()
        for s in INJECTIONS:
            assert await cp.get("control", "", s) is None
            with pytest.raises(CheckpointNotFoundError):
                await graph.ainvoke(None, thread_id="control", checkpoint_id=s)
            with pytest.raises(CheckpointNotFoundError):
                await graph.afork("control", s, "forked")
            assert await cp.list("control", before=s) == []
            STATS.add("hostile", kind="hostile SQL strings")
        assert await graph.aget_state("forked") is None
        await _assert_control_intact(graph, backend, tables)


async def test_injection_strings_as_metadata_keys_and_values(backend: Backend) -> None:
    async with backend.open() as cp:
        graph = notes_graph(cp)
        await _control(graph)
        tables = backend.tables()
        metadata = {s: s for s in INJECTIONS} | {"plain": INJECTIONS}
        await graph.ainvoke({"notes": [], "owner": "m"}, thread_id="m", metadata=metadata)
        STATS.add("hostile", 2 * len(INJECTIONS), kind="hostile SQL strings")
        for snap in await graph.aget_state_history("m"):
            for k, v in metadata.items():
                assert snap.metadata[k] == v
        await _assert_control_intact(graph, backend, tables)


async def test_injection_strings_as_checkpoint_namespaces(backend: Backend) -> None:
    async with backend.open() as cp:
        graph = notes_graph(cp)
        await _control(graph)
        tables = backend.tables()
        chains = {}
        for s in INJECTIONS:
            chains[s] = await put_chain(cp, "ns-thread", 2, ns=s)
            STATS.add("hostile", kind="hostile SQL strings")
        for s, chain in chains.items():
            got = await cp.get("ns-thread", s)
            assert got is not None and got.checkpoint.checkpoint_id == chain[-1].checkpoint_id
            assert [c.checkpoint_id for c in await cp.list("ns-thread", s)] == [
                c.checkpoint_id for c in reversed(chain)
            ]
        assert await cp.get("ns-thread", "") is None
        assert await cp.get("ns-thread", "%") is None
        await _assert_control_intact(graph, backend, tables)


async def test_confusable_thread_ids_never_see_each_other(backend: Backend) -> None:
    async with backend.open() as cp:
        graph = notes_graph(cp)
        tables = backend.tables()
        for t in CONFUSABLE:
            await graph.ainvoke({"notes": [], "owner": t}, thread_id=t)
        for t in CONFUSABLE:
            state = await graph.aget_state(t)
            assert state is not None and state.values["owner"] == t, t
            assert len(await graph.aget_state_history(t)) == 2, t
            STATS.add("hostile", kind="namespace confusion")
        for t in ("%", "_", "fo%", "f_o"):  # wildcard-looking ids delete exactly themselves
            await graph.adelete_thread(t)
            left = {x.thread_id for x in await graph.alist_threads()}
            assert t not in left
            assert {"foo", "foobar", "FOO", "fo", "f"} <= left, f"deleting {t!r} took: {left}"
        assert await graph.aprune("foo%", keep_last=1) == 1  # its own input checkpoint only
        assert len(await graph.aget_state_history("foo")) == 2
        assert len(await graph.aget_state_history("foobar")) == 2
        assert len(await graph.aget_state_history("foo%")) == 1
        with pytest.raises(GraphExecError):
            await graph.aprune("zzz%", keep_last=0)
        assert backend.tables() == tables


async def test_confusable_checkpoint_namespaces(backend: Backend) -> None:
    async with backend.open() as cp:
        heads = {}
        for i, ns in enumerate(CONFUSABLE):
            heads[ns] = (await put_chain(cp, "t", 1 + i % 3, ns=ns))[-1]
        for ns, head in heads.items():
            got = await cp.get("t", ns)
            assert got is not None and got.checkpoint.checkpoint_id == head.checkpoint_id, ns
            assert len(await cp.list("t", ns)) == head.step + 1, ns
            STATS.add("hostile", kind="namespace confusion")


# -- memory stores ---------------------------------------------------------------------------


@pytest.fixture(params=memory_params())
async def mem(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async with MEMORY_FACTORIES[request.param](tmp_path) as m:
        yield m


async def test_injection_strings_in_memory_stores(mem: Any) -> None:
    from memory import Block

    control = mem.session("control")
    await control.add_items([{"role": "user", "content": "control item"}])
    await mem.facts.put(("control",), "k", "control value")
    for s in INJECTIONS:
        session = mem.session(s)
        await session.add_items([{"role": "user", "content": s, s: s}])
        assert await session.get_items() == [{"role": "user", "content": s, s: s}]
        fact = await mem.facts.put((s, s), s, {s: s}, source=s)
        assert fact.value == {s: s} and fact.source == s
        got = await mem.facts.get((s, s), s)
        assert got is not None and got.value == {s: s}
        assert [f.key for f in await mem.facts.list((s, s))] == [s]
        await mem.facts.search((s, s), s)
        await mem.facts.search(("control",), s)
        assert len(await mem.facts.history((s, s), s)) == 1
        with pytest.raises(MemoryStoreError, match="invalid block label"):
            await mem.blocks.create(Block(s, "x", limit=1000))
        with pytest.raises(MemoryStoreError, match="invalid block label"):
            await mem.blocks.get(s)
        await mem.blocks.create(Block(f"label_{len(s)}_{INJECTIONS.index(s)}", s, limit=1000))
        block = await mem.blocks.get(f"label_{len(s)}_{INJECTIONS.index(s)}")
        assert block is not None and block.value == s
        await mem.recall.search(s)
        await mem.recall.search(s, session_id=s)
        STATS.add("hostile", 12, kind="hostile SQL strings (memory)")
    assert await control.get_items() == [{"role": "user", "content": "control item"}]
    control_fact = await mem.facts.get(("control",), "k")
    assert control_fact is not None and control_fact.value == "control value"


async def test_injection_strings_in_archival(mem: Any) -> None:
    archival = mem.archival
    ids = {}
    for s in INJECTIONS:
        ids[s] = await archival.insert(f"passage about {s}", tags=[s], metadata={s: s})
    for s in INJECTIONS:
        page = await archival.search(s, tags=[s])
        assert [h.passage.id for h in page.hits] == [ids[s]], s
        passage = await archival.get(ids[s])
        assert passage is not None and passage.metadata == {s: s} and passage.tags == (s,)
        await archival.search(s, tags=[s, "%"], tag_mode="all")
        STATS.add("hostile", 3, kind="hostile SQL strings (memory)")
    assert (await archival.get(ids[INJECTIONS[1]])) is not None


async def test_confusable_memory_namespaces_never_see_each_other(mem: Any) -> None:
    namespaces = [(x,) for x in CONFUSABLE] + [
        ("foo", "bar"),
        ("foo/bar",),
        ("foo.bar",),
        ("foo\\",),
        ("foo", "%"),
    ]
    for ns in namespaces:
        await mem.facts.put(ns, "k", repr(ns))
        item = {"role": "user", "content": repr(ns)}
        await mem.session("|".join(ns) or "empty").add_items([item])
        await mem.archival_for(ns).insert(f"archival {ns!r}", tags=list(ns))
    for ns in namespaces:
        facts = await mem.facts.list(ns)
        assert [f.value for f in facts] == [repr(ns)], ns
        found = await mem.facts.search(ns, "k")
        assert [f.value for f in found] in ([repr(ns)], []), ns
        summary = await mem.facts.summary(ns, 10_000)
        assert summary.count("- k:") == 1, (ns, summary)
        items = await mem.session("|".join(ns) or "empty").get_items()
        assert items == [{"role": "user", "content": repr(ns)}], ns
        listed = await mem.archival_for(ns).list()
        assert [h.passage.text for h in listed.hits] == [f"archival {ns!r}"], ns
        STATS.add("hostile", 4, kind="namespace confusion")
    for bad in (("foo", ""), ("",), ("foo", 1)):
        with pytest.raises(MemoryStoreError, match="namespace"):
            await mem.facts.put(bad, "k", "v")
    # wildcard tags and session ids match themselves only
    archival = mem.archival_for(("tags",))
    for tag in ("a", "a%", "%", "_", "ab"):
        await archival.insert(f"tagged {tag}", tags=[tag])
    for tag in ("%", "_", "a%"):
        page = await archival.search("tagged", tags=[tag])
        assert [h.passage.text for h in page.hits] == [f"tagged {tag}"], tag
    hits = await mem.recall.search("foo", session_id="%")
    assert all(h.session_id == "%" for h in hits)
    STATS.add("hostile", 4, kind="namespace confusion")


@pytest.mark.postgres
async def test_injection_strings_in_the_run_queue(tmp_path: Path) -> None:
    import psycopg
    from pg import fresh_schema, postgres_dsn, schema_dsn

    from checkpointers.queue import RunQueue

    async with fresh_schema() as name:
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA "{name}"')
        queue = RunQueue(schema_dsn(name))
        try:
            await queue.setup()
            control = await queue.enqueue("g", {"x": 1}, thread_id="control", run_id="control")
            for s in INJECTIONS:
                rid = await queue.enqueue(s, {s: s}, thread_id=s, run_id=s)
                assert rid == s
                run = await queue.get(s)
                assert run is not None and (run.graph_name, run.thread_id) == (s, s)
                assert [r.run_id for r in await queue.list(thread_id=s)] == [s]
                assert await queue.list(thread_id=s + "%") == []
                cancelled = await queue.cancel(s)
                assert cancelled.status == "cancelled"
                STATS.add("hostile", 4, kind="hostile SQL strings (queue)")
            assert await queue.get("%") is None
            runs = await queue.list(limit=1000)
            assert len(runs) == len(INJECTIONS) + 1
            kept = await queue.get(control)
            assert kept is not None and kept.status == "queued"
        finally:
            await queue.aclose()
