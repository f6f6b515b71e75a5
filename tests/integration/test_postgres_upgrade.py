"""A PostgreSQL database written by an earlier graphexec upgrades in place and keeps working.

Schema changes ship as new migrations appended to :data:`checkpointers._sql.MIGRATIONS`
(functions as ``CREATE OR REPLACE``); opening an older database applies just those.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypedDict

import pytest
from pg import admin_connection, fresh_schema, postgres_dsn

from checkpointers import PostgresCheckpointer, _pg_sql
from checkpointers import _sql as sql
from checkpointers._pg_db import PostgresDatabase
from graphexec import END, START, Command, PendingWrite, StateGraph, ThreadBusyError, interrupt
from graphexec.testing import put_chain

pytestmark = pytest.mark.postgres

RELEASED = 16
"""Migrations of the release before the faster run starts and pauses (versions 0-15)."""


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


class Ask(TypedDict):
    question: str
    answer: str


async def test_a_database_of_the_previous_release_upgrades_and_keeps_its_threads(
    schema: str,
) -> None:
    released = sql.migrations(_pg_sql.POSTGRES)[:RELEASED]
    old = PostgresCheckpointer(postgres_dsn(), schema=schema)
    old._db = PostgresDatabase(  # the store as the previous release opened it
        postgres_dsn(),
        owner="old",
        migrations=released,
        version_table=sql.VERSION_TABLE,
        schema=schema,
        param_types=old._db._types,
    )
    try:
        lease = await old.acquire_lease("t", owner="old-run", ttl=60)
        cps = await put_chain(old, "t", 3, lease=lease)
        await old.put_writes("t", "", cps[-1].checkpoint_id, "k", [("a", b"1")], lease=lease)
        await old.release_lease(lease)
        before = await old.get("t")
    finally:
        await old.aclose()
    query = f'SELECT version FROM "{schema}".graphexec_migrations ORDER BY version'
    with admin_connection() as conn:
        assert [v for (v,) in conn.execute(query).fetchall()] == list(range(RELEASED))

    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        with admin_connection() as conn:
            versions = [v for (v,) in conn.execute(query).fetchall()]
        assert versions == list(range(len(sql.MIGRATIONS)))
        lease2, got = await cp.acquire_lease_and_get("t", owner="new-run", ttl=60)
        assert got == before and got is not None
        assert got.pending_writes == (PendingWrite("k", "a", b"1"),)
        assert lease2.epoch == lease.epoch + 1
        await cp.put_writes_final("t", "", cps[-1].checkpoint_id, "k2", [("b", b"2")], lease=lease2)
        await cp.acquire_lease("t", owner="third", ttl=60)  # released by the pause
        with pytest.raises(ThreadBusyError):
            await cp.acquire_lease_and_get("t", owner="fourth", ttl=60)

        # and a run that pauses and resumes on the upgraded schema
        b = StateGraph(Ask)
        b.add_node("ask", lambda s: {"answer": interrupt(s["question"])})
        b.add_edge(START, "ask")
        b.add_edge("ask", END)
        graph = b.compile(checkpointer=cp)
        paused = await graph.arun({"question": "q", "answer": ""}, thread_id="new")
        assert paused.status == "interrupted"
        done = await graph.ainvoke(Command(resume="a"), thread_id="new")
        assert done["answer"] == "a"
