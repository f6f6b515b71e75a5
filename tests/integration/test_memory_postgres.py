"""PostgreSQL memory beyond the contract: tenants, hostile input, concurrent writers, processes.

Each test gets a fresh schema (``tests/pg.py``); the store creates it.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import json
import operator
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from pg import admin_connection, fresh_schema, postgres_dsn
from psycopg import sql

from graphexec import END, START, NodeContext, StateGraph
from graphexec.errors import MemoryConflictError, MemoryStoreError, StorageError
from graphexec.testing import assert_eventually
from memory import Block, PostgresMemory, PostgresSession

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
PG_MODULES = [
    ROOT / "memory" / "postgres.py",
    ROOT / "memory" / "_pg_common.py",
    ROOT / "memory" / "_pg_session.py",
    ROOT / "memory" / "_pg_stores.py",
    ROOT / "memory" / "_pg_archival.py",
    ROOT / "memory" / "_pg_passages.py",
]

TENANTS = [
    ("user_1",),
    ("userX1",),
    ("user%1",),
    ("foo",),
    ("foobar",),
    ("%",),
    ("_",),
    ("it's",),
    ('say "hi"',),
    ("back\\slash",),
    ("a", "b"),
    ("a|b",),
]
"""Tenants whose namespaces a LIKE pattern, a prefix or a join would confuse."""

HOSTILE = [
    "x'; DROP TABLE graphexec_mem_items; --",
    "'); DELETE FROM graphexec_mem_facts; --",
    "Robert'); DROP TABLE graphexec_mem_passages;--",
    "' OR '1'='1",
    '" OR 1=1 --',
    "%",
    "_",
    "%_%",
    "\\",
    "\\'",
    "$$; DROP SCHEMA public CASCADE; $$",
    "a & b | !c <-> d:*",
    "foo:* & !bar",
    "E'\\x27'",
]
"""SQL and tsquery syntax that must be stored and returned verbatim."""


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


@pytest.fixture
async def mem(schema: str) -> AsyncIterator[PostgresMemory]:
    async with PostgresMemory.open(postgres_dsn(), schema=schema) as m:
        yield m


def _tables(schema: str) -> dict[str, int]:
    """Every table of ``schema`` and its row count, read behind the store's back."""
    with admin_connection() as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (schema,)
            )
        ]
        count = sql.SQL("SELECT count(*) FROM {}.{}")
        return {
            n: int(
                conn.execute(count.format(sql.Identifier(schema), sql.Identifier(n))).fetchall()[0][
                    0
                ]
            )
            for n in names
        }


# -- tenants -------------------------------------------------------------------------------------


async def test_tenants_with_tricky_names_never_see_each_other(mem: PostgresMemory) -> None:
    for ns in TENANTS:
        sid = json.dumps(ns)  # distinct for ("a", "b") and ("a|b",)
        await mem.session(sid).add_items([{"role": "user", "content": f"hello from {sid}"}])
        await mem.facts.put(ns, "home", sid, op_key="k")
        await mem.blocks_for(ns).create(Block("human", f"tenant {sid}", limit=100))
        await mem.archival_for(ns).insert(f"harbour ferry notes of {sid}", tags=[sid], op_key="k")
    for ns in TENANTS:
        sid = json.dumps(ns)  # distinct for ("a", "b") and ("a|b",)
        assert await mem.session(sid).get_items() == [
            {"role": "user", "content": f"hello from {sid}"}
        ]
        assert [f.value for f in await mem.facts.list(ns)] == [sid]
        assert [f.key for f in await mem.facts.search(ns, "home")] == ["home"]
        assert [b.value for b in await mem.blocks_for(ns).list()] == [f"tenant {sid}"]
        hits = (await mem.archival_for(ns).search("harbour ferry", top_k=50)).hits
        assert [h.passage.text for h in hits] == [f"harbour ferry notes of {sid}"]
        recall = await mem.recall.search("hello", session_id=sid, top_k=50)
        assert [h.session_id for h in recall] == [sid]
    assert await mem.facts.list(("user",)) == []
    assert await mem.facts.list(("fo",)) == []
    assert await mem.blocks_for(("a",)).list() == []


# -- hostile input -------------------------------------------------------------------------------


async def test_injection_strings_are_stored_verbatim_and_tables_stay(
    mem: PostgresMemory, schema: str
) -> None:
    await mem.setup()
    tables = set(_tables(schema))
    for s in HOSTILE:
        session = mem.session(s)
        await session.add_items([{"role": s, "content": s, s: [s]}], op_key=s)
        await mem.facts.put((s,), s, {s: s}, source=s, op_key=s)
        await mem.blocks_for((s,)).create(Block("notes", s, limit=1000, description=s))
        await mem.blocks_for((s,)).append("notes", s)
        await mem.archival_for((s,)).insert(f"{s} marker {s}", tags=[s], metadata={s: s}, op_key=s)
    for s in HOSTILE:
        assert await mem.session(s).get_items() == [{"role": s, "content": s, s: [s]}]
        fact = await mem.facts.get((s,), s)
        assert fact is not None and (fact.value, fact.source) == ({s: s}, s)
        await mem.facts.search((s,), s)
        block = await mem.blocks_for((s,)).get("notes")
        assert block is not None and (block.value, block.description) == (f"{s}\n{s}", s)
        store = mem.archival_for((s,))
        for query in (s, f"marker {s}"):
            page = await store.search(query, tags=[s], top_k=50)
            assert all(h.passage.tags == (s,) for h in page.hits)
        [hit] = (await store.search("marker", tags=[s], tag_mode="all")).hits
        assert (hit.passage.text, dict(hit.passage.metadata)) == (f"{s} marker {s}", {s: s})
        assert [h.passage.id for h in (await store.list(tags=[s])).hits] == [hit.passage.id]
        hits = await mem.recall.search(s, session_id=s)
        assert all(h.session_id == s for h in hits)
    after = _tables(schema)
    assert set(after) == tables
    n = len(HOSTILE)
    assert after["graphexec_mem_items"] == n
    assert after["graphexec_mem_facts"] == n
    assert after["graphexec_mem_blocks"] == n
    assert after["graphexec_mem_passages"] == n
    assert after["graphexec_mem_archival_ns"] == n


async def test_nul_characters_are_refused_before_any_write(mem: PostgresMemory) -> None:
    with pytest.raises(MemoryStoreError, match="NUL"):
        mem.session("a\x00b")
    with pytest.raises(MemoryStoreError, match="NUL"):
        await mem.facts.put(("ns",), "k\x00", 1)
    with pytest.raises(MemoryStoreError, match="NUL"):
        await mem.archival.insert("text\x00")
    await mem.session("s").add_items([{"content": "a\x00b"}])  # inside JSON it is escaped
    assert await mem.session("s").get_items() == [{"content": "a\x00b"}]
    assert (await mem.archival.search("a\x00b")).hits == []
    assert await mem.facts.list(("ns",)) == []


def test_bad_schema_names_are_refused() -> None:
    for bad in ('x"; DROP SCHEMA public; --', "a b", "1abc", "x" * 64):
        with pytest.raises(MemoryStoreError, match="schema"):
            PostgresMemory(postgres_dsn(), schema=bad)


# -- concurrent writers --------------------------------------------------------------------------


async def test_two_connections_updating_one_block_detect_the_conflict(schema: str) -> None:
    dsn = postgres_dsn()
    async with (
        PostgresMemory.open(dsn, schema=schema) as a,
        PostgresMemory.open(dsn, schema=schema) as b,
    ):
        await a.blocks.create(Block("plan", "step 1", limit=1000))
        seen_a = await a.blocks.get("plan")
        seen_b = await b.blocks.get("plan")
        assert seen_a is not None and seen_b is not None and seen_a.version == seen_b.version
        await a.blocks.update("plan", "step 1\nstep 2 (a)", expected_version=seen_a.version)
        with pytest.raises(MemoryConflictError) as err:
            await b.blocks.update("plan", "step 1\nstep 2 (b)", expected_version=seen_b.version)
        assert (err.value.expected, err.value.actual) == (1, 2)
        assert "plan" in str(err.value) and "retry" in str(err.value)
        got = await b.blocks.get("plan")
        assert got is not None and (got.value, got.version) == ("step 1\nstep 2 (a)", 2)
        results = await asyncio.gather(
            *(
                m.blocks.append("plan", f"racer {i}", expected_version=2)
                for i, m in enumerate([a, b] * 5)
            ),
            return_exceptions=True,
        )
        assert sum(isinstance(r, Block) for r in results) == 1
        assert sum(isinstance(r, MemoryConflictError) for r in results) == 9


CHILD = """
import asyncio, json, sys
from graphexec.errors import MemoryStoreError
from memory import Block, PostgresMemory

async def main(dsn, schema, index, rounds):
    async with PostgresMemory.open(dsn, schema=schema, pool_max=2) as mem:
        try:
            await mem.blocks.create(Block("log", "", limit=100_000))
        except MemoryStoreError:
            pass  # another process created it first
        for i in range(rounds):
            await mem.blocks.append("log", f"p{index} line {i}")
            await mem.facts.put(("shared",), "counter", [index, i], source=f"p{index}")
            await mem.session("chat").add_items([{"role": "user", "content": f"p{index} m{i}"}])
            await mem.archival.insert(f"passage {index} {i}", op_key=f"{index}-{i}")
        print(json.dumps({"done": index}))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
"""


def _spawn(schema: str, index: int, rounds: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, postgres_dsn(), schema, str(index), str(rounds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _finish(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=110)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


async def test_processes_on_a_fresh_schema_lose_no_update(schema: str) -> None:
    """Processes create the schema and the block at once, then all write the same records."""
    procs, rounds = 3, 15
    children = [_spawn(schema, i, rounds) for i in range(procs)]
    await asyncio.gather(*(asyncio.to_thread(_finish, c) for c in children))
    async with PostgresMemory.open(postgres_dsn(), schema=schema) as mem:
        block = await mem.blocks.get("log")
        assert block is not None and block.version == 1 + procs * rounds
        lines = block.value.split("\n")
        for p in range(procs):
            assert [x for x in lines if x.startswith(f"p{p} ")] == [
                f"p{p} line {i}" for i in range(rounds)
            ]
        history = await mem.facts.history(("shared",), "counter")
        assert [h.version for h in history] == list(range(1, procs * rounds + 1))
        hits = await mem.recall.search("p0 p1 p2", session_id="chat", top_k=1000)
        assert sorted(h.position for h in hits) == list(range(procs * rounds))
        listed = await mem.archival.list(limit=1000)
        assert len(listed.hits) == procs * rounds
        # Every process's vectors reach a searcher that cached the namespace early.
        assert len((await mem.archival.search("passage", top_k=1000)).hits) == procs * rounds


# -- graphs, sessions, lifecycle -----------------------------------------------------------------


class Notes(TypedDict):
    text: str
    seen: Annotated[list[str], operator.add]


def _graph(node: Any) -> Any:
    builder = StateGraph(Notes)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    return builder


async def test_a_block_shared_by_graphs_on_two_pools_is_one_record(schema: str) -> None:
    async def write(state: Notes, ctx: NodeContext) -> dict[str, Any]:
        await ctx.memory.blocks.append("human", state["text"])
        return {"seen": ["written"]}

    async def read(state: Notes, ctx: NodeContext) -> dict[str, Any]:
        return {"seen": [await ctx.memory.blocks.render(["human"])]}

    dsn = postgres_dsn()
    async with (
        PostgresMemory.open(dsn, schema=schema) as a,
        PostgresMemory.open(dsn, schema=schema) as b,
    ):
        await a.blocks.create(Block("human", "Name: Ada", limit=500))
        await _graph(write).compile(memory=a).ainvoke({"text": "Prefers aisle seats", "seen": []})
        out = await _graph(read).compile(memory=b).ainvoke({"text": "", "seen": []})
        assert "Name: Ada\nPrefers aisle seats" in out["seen"][0]


async def test_standalone_session_reloads_and_branches(schema: str) -> None:
    dsn = postgres_dsn()
    session = PostgresSession("user-1", dsn, schema=schema)  # no setup(), as in the Agents SDK
    await session.add_items([{"role": "user", "content": "day one"}])
    await session.aclose()
    async with PostgresSession.open("user-1", dsn, schema=schema) as again:
        assert await again.get_items() == [{"role": "user", "content": "day one"}]
        branch = await again.branch_from(1, "user-1-alt")
        await branch.aclose()  # borrows its parent's pool: closing it is a no-op
        assert await branch.get_items() == [{"role": "user", "content": "day one"}]
        assert await again.purge() == 1
        assert await again.get_items() == []
    async with PostgresMemory.open(dsn, schema=schema) as mem:
        hits = await mem.recall.search("day")
        assert [h.session_id for h in hits] == ["user-1-alt"]


async def test_a_closed_memory_refuses_work(schema: str) -> None:
    mem = PostgresMemory(postgres_dsn(), schema=schema)
    async with mem:
        await mem.facts.put(("ns",), "k", 1)
    await mem.aclose()  # twice is fine
    with pytest.raises(StorageError, match="closed"):
        await mem.facts.get(("ns",), "k")
    with pytest.raises(StorageError, match="closed"):
        mem.session("s")
    with pytest.raises(StorageError, match="closed"):
        _ = mem.archival


def test_import_memory_works_without_psycopg() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; sys.modules['psycopg_pool'] = None\n"
        "import memory\n"
        "assert memory.SqliteMemory and memory.MemoryConflictError\n"
        "try:\n"
        "    memory.PostgresMemory\n"
        "except ImportError:\n"
        "    print('refused')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "refused"


# -- SQL hygiene: statements are constants; caller data only ever travels as parameters -------

_SQL_WORDS = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "CREATE ", " WHERE ", " FROM ")


def _constants(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(
                t.id for t in targets if isinstance(t, ast.Name) and t.id.lstrip("_").isupper()
            )
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names if a.name.lstrip("_").isupper())
    return names


def _is_constant_sql(node: ast.expr, constants: set[str]) -> bool:
    """A literal, a module constant, or a constant ``.format()``-ed with constant fragments."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in constants or node.id == "sql"  # a local: checked where it is built
    if isinstance(node, ast.IfExp):
        return _is_constant_sql(node.body, constants) and _is_constant_sql(node.orelse, constants)
    if isinstance(node, ast.BinOp):
        return _is_constant_sql(node.left, constants) and _is_constant_sql(node.right, constants)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "format":
            return _is_constant_sql(node.func.value, constants) and all(
                _is_constant_sql(k.value, constants) for k in node.keywords
            )
        # _Filters.sql() concatenates module constants only (checked in its own body).
        return node.func.attr == "sql" and not node.args
    return False


@pytest.mark.parametrize("path", PG_MODULES, ids=lambda p: p.name)
def test_sql_is_built_from_constants_only(path: Path) -> None:
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if any(word in text for word in _SQL_WORDS):
                for value in node.values:
                    if isinstance(value, ast.FormattedValue):
                        assert _is_constant_sql(value.value, constants), (
                            f"{path.name}:{node.lineno}: SQL f-string interpolates "
                            f"{ast.unparse(value.value)}, which is not a constant"
                        )
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "sql" for t in node.targets
        ):
            assert _is_constant_sql(node.value, constants - {"sql"}), (
                f"{path.name}:{node.lineno}: sql = {ast.unparse(node.value)} is not constant"
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("fetch", "fetch_one", "execute_many") and node.args:
                # db.fetch(op, sql, params) or conn.fetch(sql, params)
                first = node.args[0]
                op_name = isinstance(first, ast.Constant) and not any(
                    word in str(first.value) for word in _SQL_WORDS
                )
                sql = node.args[1] if op_name and len(node.args) > 1 else first
                assert _is_constant_sql(sql, constants), (
                    f"{path.name}:{node.lineno}: {node.func.attr}() is given "
                    f"{ast.unparse(sql)} as SQL; use a constant"
                )


# -- archival across pools and the search_path ------------------------------------------------


async def test_a_searchers_vector_cache_sees_concurrent_writers(schema: str) -> None:
    """Passages committed by another pool's concurrent transactions all reach the cache."""
    dsn = postgres_dsn()
    async with (
        PostgresMemory.open(dsn, schema=schema) as reader,
        PostgresMemory.open(dsn, schema=schema, pool_max=8) as writer,
    ):
        await reader.archival.insert("Passage zero about ferries.")
        query = "ferries"

        async def write(i: int) -> None:
            await writer.archival.insert(f"Passage {i} about ferries.")

        async def read() -> None:
            for _ in range(5):
                await reader.archival.search(query, top_k=100)
                await asyncio.sleep(0)

        await asyncio.gather(*(write(i) for i in range(1, 41)), read())
        hits = (await reader.archival.search(query, top_k=100)).hits
        assert len(hits) == 41
        # The reader's in-process vectors are exactly the stored ones: none was skipped by a
        # transaction that committed after a later-numbered one was already cached.
        [cache] = reader.archival._shared.caches.values()
        cached = [int(s) for s in cache.snapshot()[1]]
        with admin_connection() as conn:
            table = sql.SQL("SELECT seq FROM {}.graphexec_mem_passages ORDER BY seq")
            stored = [r[0] for r in conn.execute(table.format(sql.Identifier(schema)))]
        assert cached == stored and len(stored) == 41


async def test_the_search_path_schema_is_used_without_schema(schema: str) -> None:
    from pg import schema_dsn

    async with PostgresMemory.open(postgres_dsn(), schema=schema) as mem:
        await mem.facts.put(("ns",), "k", "v")  # creates the schema and its tables
    async with PostgresMemory.open(schema_dsn(schema)) as mem:
        assert mem.schema is None
        fact = await mem.facts.get(("ns",), "k")
        assert fact is not None and fact.value == "v"


async def test_limits_beyond_bigint_mean_all(mem: PostgresMemory) -> None:
    session = mem.session("s")
    await session.add_items([{"content": "hello world"}])
    assert await session.get_items(limit=2**70) == [{"content": "hello world"}]
    assert len(await mem.recall.search("hello", top_k=2**70)) == 1
    await mem.facts.put(("a",), "greeting", "hello")
    assert len(await mem.facts.search(("a",), "hello", limit=2**70)) == 1
    with pytest.raises(MemoryStoreError, match="cannot evict"):
        await session.evict_oldest(2**70)


async def test_a_leaked_memory_warns_and_closes_its_pool(schema: str) -> None:
    mem = PostgresMemory(postgres_dsn(), schema=schema)
    await mem.facts.put(("ns",), "k", 1)
    with pytest.warns(ResourceWarning, match="PostgresMemory"):
        del mem
        gc.collect()

    async def closed() -> None:
        with admin_connection() as conn:
            rows = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = ''"
                " AND datname = current_database() AND state = 'idle'"
                " AND query LIKE %s",
                (f"%{schema}%",),
            ).fetchall()
        assert rows[0][0] == 0

    await assert_eventually(closed)
