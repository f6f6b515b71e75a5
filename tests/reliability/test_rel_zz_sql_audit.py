"""The SQL-text audit: no user-supplied string ever appears in the SQL a store sends.

The reliability conftest records every statement text the stores send to SQLite (through the
connection their transaction bodies get) and to PostgreSQL (psycopg's async cursors) before
parameters are bound, for the whole session. This module runs last (``zz``): it drives every
injection string through every store once more (so it means something when run alone, too),
then asserts that no recorded SQL text contains any injection string or its ``gxinj`` marker:
user data travels only as bound parameters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TypedDict

import pytest
from rel_backends import MEMORY_FACTORIES, backend_params, make_backend
from rel_support import INJECTIONS, MARKER, RECORDER, STATS

from graphexec import END, START, StateGraph
from graphexec.testing import put_chain


class _State(TypedDict):
    v: str


async def _exercise_checkpointer(kind: str, folder: Path) -> None:
    b = StateGraph(_State)
    b.add_node("n", lambda s: {"v": s["v"] + "!"})
    b.add_edge(START, "n")
    b.add_edge("n", END)
    async with make_backend(kind, folder) as backend, backend.open() as cp:
        graph = b.compile(checkpointer=cp)
        for s in INJECTIONS:
            await graph.ainvoke({"v": s}, thread_id=s, metadata={s: s})
            await put_chain(cp, s, 1, ns=s)
            assert await cp.get(s, "", s) is None
            await graph.aget_state_history(s)
            await cp.set_ttl(s, 3600)
            await graph.adelete_thread(s)


async def _exercise_memory(name: str, folder: Path) -> None:
    async with MEMORY_FACTORIES[name](folder) as mem:
        for s in INJECTIONS:
            await mem.session(s).add_items([{"role": "user", "content": s}])
            await mem.facts.put((s,), s, s, source=s)
            await mem.facts.search((s,), s)
            await mem.archival.insert(s, tags=[s], metadata={s: s})
            await mem.archival.search(s, tags=[s])
            await mem.recall.search(s, session_id=s)


@pytest.mark.parametrize("kind", backend_params())
async def test_no_user_string_reaches_sql_text(kind: str, tmp_path: Path) -> None:
    before = RECORDER.total
    await _exercise_checkpointer(kind, tmp_path / "cp")
    if kind == "sqlite":
        for name in sorted(MEMORY_FACTORIES):
            if "postgres" in name and not os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN"):
                continue  # without a server (never in CI, where it is required)
            await _exercise_memory(name, tmp_path / name)
    assert RECORDER.total - before >= 100, "the recorder saw too few statements"
    texts = list(RECORDER.statements)
    assert any("graphexec_heads" in t for t in texts), "checkpointer statements were not recorded"
    leaks = [t for t in texts if MARKER in t or any(s in t for s in INJECTIONS)]
    STATS.sql_checked = RECORDER.total
    assert not leaks, "user strings pasted into SQL text:\n" + "\n".join(leaks[:5])
