"""SQLite memory beyond the contract: processes sharing a file, graphs sharing a block, hygiene."""

from __future__ import annotations

import ast
import asyncio
import gc
import json
import operator
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

import memory
from graphexec import END, START, NodeContext, StateGraph
from graphexec.errors import MemoryStoreError, StorageError
from graphexec.testing import assert_eventually
from memory import Block, SqliteMemory, SqliteSession

ROOT = Path(__file__).resolve().parents[2]
MINE = [
    ROOT / "memory" / "__init__.py",
    ROOT / "memory" / "sqlite.py",
    ROOT / "memory" / "_sqlite_common.py",
    ROOT / "memory" / "_sqlite_session.py",
    ROOT / "memory" / "_sqlite_stores.py",
]

# A child process: ``python -c CHILD DB INDEX ROUNDS`` appends to a shared block, puts a shared
# fact and adds session items, ROUNDS times each, then prints what it saw as one JSON line.
CHILD = """
import asyncio, json, sys
from memory import SqliteMemory

async def main(path, index, rounds):
    async with SqliteMemory.open(path) as mem:
        for i in range(rounds):
            await mem.blocks.append("log", f"p{index} line {i}")
            await mem.facts.put(("shared",), "counter", [index, i], source=f"p{index}")
            await mem.session("chat").add_items([{"role": "user", "content": f"p{index} m{i}"}])
        await mem.facts.put(("proc", str(index)), "done", True)
        parent = await mem.facts.get(("parent",), "greeting")
        print(json.dumps({"parent": None if parent is None else parent.value}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def spawn(db: Path, index: int, rounds: int) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db), str(index), str(rounds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def finish(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


async def test_processes_sharing_a_file_see_each_other(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    async with SqliteMemory.open(db) as mem:
        await mem.blocks.create(Block("log", "start", limit=100_000))
        await mem.facts.put(("parent",), "greeting", "hello from the parent")
        result = await asyncio.to_thread(finish, spawn(db, 0, 3))
        assert result == {"parent": "hello from the parent"}
        block = await mem.blocks.get("log")
        assert block is not None and block.value.split("\n") == [
            "start",
            "p0 line 0",
            "p0 line 1",
            "p0 line 2",
        ]
        fact = await mem.facts.get(("shared",), "counter")
        assert fact is not None and (fact.value, fact.source, fact.version) == ([0, 2], "p0", 3)
        assert len(await mem.session("chat").get_items()) == 3


async def test_concurrent_processes_lose_no_update(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    procs, rounds = 4, 25
    async with SqliteMemory.open(db) as mem:
        await mem.blocks.create(Block("log", "", limit=100_000))
    children = [spawn(db, i, rounds) for i in range(procs)]
    for child in children:
        await asyncio.to_thread(finish, child)
    async with SqliteMemory.open(db) as mem:
        block = await mem.blocks.get("log")
        assert block is not None and block.version == 1 + procs * rounds
        expected = {f"p{p} line {i}" for p in range(procs) for i in range(rounds)}
        lines = block.value.split("\n")
        assert len(lines) == len(expected) and set(lines) == expected
        for p in range(procs):  # each process's lines are in its own order
            mine = [line for line in lines if line.startswith(f"p{p} ")]
            assert mine == [f"p{p} line {i}" for i in range(rounds)]
        history = await mem.facts.history(("shared",), "counter")
        assert [h.version for h in history] == list(range(1, procs * rounds + 1))
        items = await mem.session("chat").get_items()
        assert sorted(i["content"] for i in items) == sorted(
            f"p{p} m{i}" for p in range(procs) for i in range(rounds)
        )
        hits = await mem.recall.search("m0", session_id="chat", top_k=100)
        assert len(hits) == procs  # "m0" is one token
        positions = [h.position for h in await mem.recall.search("p0 p1 p2 p3", top_k=1000)]
        assert sorted(positions) == list(range(procs * rounds))


class Notes(TypedDict):
    text: str
    seen: Annotated[list[str], operator.add]


def build_writer() -> Any:
    async def remember(state: Notes, ctx: NodeContext) -> dict[str, Any]:
        await ctx.memory.blocks.append("human", state["text"])
        return {"seen": ["written"]}

    builder = StateGraph(Notes)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    return builder


def build_reader() -> Any:
    async def read(state: Notes, ctx: NodeContext) -> dict[str, Any]:
        return {"seen": [await ctx.memory.blocks.render(["human"])]}

    builder = StateGraph(Notes)
    builder.add_node("read", read)
    builder.add_edge(START, "read")
    builder.add_edge("read", END)
    return builder


async def test_a_block_attached_to_several_graphs_is_one_record(tmp_path: Path) -> None:
    db = tmp_path / "blocks.db"
    async with SqliteMemory.open(db) as mem_a, SqliteMemory.open(db) as mem_b:
        await mem_a.blocks.create(Block("human", "Name: Ada", limit=500))
        writer = build_writer().compile(memory=mem_a)
        reader_same = build_reader().compile(memory=mem_a)
        reader_other = build_reader().compile(memory=mem_b)
        await writer.ainvoke({"text": "Prefers aisle seats", "seen": []})
        for reader in (reader_same, reader_other):
            out = await reader.ainvoke({"text": "", "seen": []})
            assert "Name: Ada\nPrefers aisle seats" in out["seen"][0]
        await mem_b.blocks.update("human", "Name: Ada Lovelace")
        out = await reader_same.ainvoke({"text": "", "seen": []})
        assert "<value>Name: Ada Lovelace</value>" in out["seen"][0]


async def test_two_objects_on_one_file_interleave_writes(tmp_path: Path) -> None:
    db = tmp_path / "two.db"
    async with SqliteMemory.open(db) as a, SqliteMemory.open(db) as b:
        await a.blocks.create(Block("log", "", limit=10_000))
        await asyncio.gather(
            *(
                store.blocks.append("log", f"{name}{i}")
                for i in range(15)
                for name, store in (("a", a), ("b", b))
            )
        )
        block = await b.blocks.get("log")
        assert block is not None and block.version == 31 and len(block.value.split("\n")) == 30
        await asyncio.gather(
            *(m.session("s").add_items([{"n": i}]) for i in range(10) for m in (a, b))
        )
        assert len(await a.session("s").get_items()) == 20


async def test_standalone_session_reloads_its_history(tmp_path: Path) -> None:
    db = tmp_path / "agents.db"
    session = SqliteSession("user-1", db)  # used without setup(), as in the Agents SDK
    await session.add_items([{"role": "user", "content": "day one"}])
    await session.aclose()
    async with SqliteSession.open("user-1", db) as again:
        assert await again.get_items() == [{"role": "user", "content": "day one"}]
        branch = await again.branch_from(1, "user-1-alt")
        await branch.aclose()  # borrows its parent's connections: closing it is a no-op
        assert await branch.get_items() == [{"role": "user", "content": "day one"}]
    async with SqliteMemory.open(db) as mem:
        hits = await mem.recall.search("day", session_id="user-1-alt")
        assert [h.item["content"] for h in hits] == ["day one"]


async def test_in_memory_databases_are_private(tmp_path: Path) -> None:
    async with SqliteSession.open("s") as a, SqliteSession.open("s") as b:
        await a.add_items([{"n": 1}])
        assert await b.get_items() == []
    async with SqliteMemory.open() as m1, SqliteMemory.open() as m2:
        assert m1.path is None
        await m1.facts.put(("ns",), "k", 1)
        assert await m2.facts.get(("ns",), "k") is None
        assert await m1.facts.get(("ns",), "k") is not None


async def test_a_leaked_memory_warns_and_stops_its_threads(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    mem = SqliteMemory(tmp_path / "leak.db")
    await mem.facts.put(("ns",), "k", 1)
    await mem.session("s").add_items([{"n": 1}])
    await mem.blocks.list()
    assert set(threading.enumerate()) - before  # the connections' threads
    with pytest.warns(ResourceWarning, match="SqliteMemory"):
        del mem
        gc.collect()

    async def stopped() -> None:
        assert not set(threading.enumerate()) - before

    await assert_eventually(stopped)


async def test_a_closed_memory_refuses_work(tmp_path: Path) -> None:
    mem = SqliteMemory(tmp_path / "closed.db")
    async with mem:
        await mem.facts.put(("ns",), "k", 1)
    await mem.aclose()  # twice is fine
    with pytest.raises(StorageError, match="closed"):
        await mem.facts.get(("ns",), "k")
    with pytest.raises(StorageError, match="closed"):
        mem.session("s")
    with pytest.raises(StorageError, match="closed"):
        _ = mem.archival


async def test_tables_survive_injection_attempts(tmp_path: Path) -> None:
    evil = "x'); DROP TABLE graphexec_mem_items; --"
    async with SqliteMemory.open(tmp_path / "evil.db") as mem:
        await mem.session(evil).add_items([{"role": evil, "content": evil}])
        await mem.facts.put((evil,), evil, evil, source=evil)
        await mem.facts.search((evil,), evil)
        await mem.recall.search(evil, session_id=evil)
        with pytest.raises(MemoryStoreError):
            await mem.blocks.get(evil)
    async with SqliteMemory.open(tmp_path / "evil.db") as mem:
        assert await mem.session(evil).get_items() == [{"role": evil, "content": evil}]
        fact = await mem.facts.get((evil,), evil)
        assert fact is not None and fact.source == evil


def test_memory_is_a_package_with_a_pinned_api() -> None:
    assert set(memory.__all__) == {
        "Session",
        "FactStore",
        "BlockStore",
        "ArchivalStore",
        "RecallStore",
        "Namespace",
        "Block",
        "Fact",
        "FactVersion",
        "Passage",
        "ArchivalHit",
        "SearchPage",
        "RecallHit",
        "SqliteMemory",
        "SqliteSession",
        "SqliteFactStore",
        "SqliteBlockStore",
        "SqliteRecallStore",
        "SqliteArchivalStore",
        "NewPassage",
        "PostgresMemory",
        "PostgresSession",
        "PostgresFactStore",
        "PostgresBlockStore",
        "PostgresRecallStore",
        "PostgresArchivalStore",
        "MemoryStoreError",
        "MemoryConflictError",
        "TokenCounter",
        "EstimatingTokenCounter",
        "estimate_tokens",
        "extractive_summary",
        "Embedder",
        "HashingEmbedder",
        "MiniLMEmbedder",
    }
    for name in memory.__all__:
        assert getattr(memory, name) is not None  # lazily exported names resolve too
    assert len(memory.__all__) == len(set(memory.__all__))
    with pytest.raises(AttributeError):
        _ = memory.NoSuchThing


def test_graphexec_does_not_import_memory() -> None:
    code = "import sys, graphexec, graphexec.testing; print('memory' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "False"


# -- SQL hygiene: every statement is a constant; caller data only ever travels as parameters ----

_SQL_WORDS = ("SELECT ", "INSERT ", "UPDATE ", "DELETE ", "CREATE ", " WHERE ", " FROM ")
_SQL_CALLS = {"execute": 0, "executemany": 0, "fetch": 1, "read": 1}


def _constants(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(
                t.id for t in targets if isinstance(t, ast.Name) and t.id.lstrip("_").isupper()
            )
        if isinstance(node, ast.ImportFrom) and node.module == "memory._sqlite_common":
            names.update(a.asname or a.name for a in node.names if a.name.isupper())
    return names


@pytest.mark.parametrize("path", MINE, ids=lambda p: p.name)
def test_sql_is_built_from_constants_only(path: Path) -> None:
    tree = ast.parse(path.read_text())
    constants = _constants(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if any(word in text for word in _SQL_WORDS):
                for value in node.values:
                    if isinstance(value, ast.FormattedValue):
                        assert isinstance(value.value, ast.Name) and value.value.id in constants, (
                            f"{path.name}:{node.lineno}: SQL f-string interpolates "
                            f"{ast.unparse(value.value)}, which is not a module constant"
                        )
        if isinstance(node, ast.Call):
            name = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else getattr(node.func, "id", "")
            )
            index = _SQL_CALLS.get(name)
            if index is not None and len(node.args) > index:
                sql = node.args[index]
                assert isinstance(sql, ast.Name) and sql.id in constants, (
                    f"{path.name}:{node.lineno}: {name}() is given {ast.unparse(sql)} as SQL; "
                    "use a module-level constant"
                )
