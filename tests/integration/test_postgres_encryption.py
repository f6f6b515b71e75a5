"""Encryption at rest with the PostgreSQL backend: nothing readable stored, no swapped blobs.

The tampering cases are the SQLite test's (same rows, same codec), applied to a schema.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pg import admin_connection, fresh_schema, postgres_dsn
from test_sqlite_encryption import SECRET, SWAPS, TAMPERING, keys, notes_graph

from checkpointers import Encryption, PostgresCheckpointer
from graphexec import DeserializationError, NodeExecutionError
from graphexec.testing import put_chain

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


def stored_bytes(schema: str) -> bytes:
    """Every value of every row of the store, as the server returns them."""
    out = []
    with admin_connection() as conn:
        for table in ("checkpoints", "channels", "heads", "writes", "leases", "threads"):
            for row in conn.execute(f'SELECT * FROM "{schema}".graphexec_{table}'):
                for value in row:
                    out.append(value if isinstance(value, bytes) else str(value).encode())
    return b"\n".join(out)


@pytest.mark.parametrize("encrypted", [False, True])
async def test_nothing_readable_is_stored_when_encrypted(schema: str, encrypted: bool) -> None:
    encryption = keys("k1", active="k1") if encrypted else None
    async with PostgresCheckpointer.open(
        postgres_dsn(), schema=schema, encryption=encryption
    ) as cp:
        done = await notes_graph(cp).ainvoke(  # type: ignore[arg-type]
            {"notes": [], "summary": ""}, thread_id="t", metadata={"who": SECRET}
        )
        assert done["summary"] == f"3 notes about {SECRET}"
        with pytest.raises(NodeExecutionError):
            await notes_graph(cp, fail=True).ainvoke(  # type: ignore[arg-type]
                {"notes": [], "summary": ""}, thread_id="u"
            )
        head = await cp.get("u")
        assert head is not None
        assert any(SECRET.encode() in w.data for w in head.pending_writes)
    assert (SECRET.encode() in stored_bytes(schema)) is not encrypted


async def _two_checkpoints(schema: str, encryption: Encryption | None) -> None:
    async with PostgresCheckpointer.open(
        postgres_dsn(), schema=schema, encryption=encryption
    ) as cp:
        cps = await put_chain(cp, "t", 3, snapshot_steps={1})
        await put_chain(cp, "other", 2)
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task-a", [("x", b"a")])
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task-b", [("x", b"b")])


@pytest.mark.parametrize("swap", sorted(SWAPS))
async def test_blobs_swapped_between_rows_are_detected(schema: str, swap: str) -> None:
    encryption = keys("k1", active="k1")
    await _two_checkpoints(schema, encryption)
    table, column, first, second = SWAPS[swap]
    with admin_connection() as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        [(a,)] = conn.execute(f"SELECT {column} FROM {table} WHERE {first}").fetchall()
        [(b,)] = conn.execute(f"SELECT {column} FROM {table} WHERE {second}").fetchall()
        conn.execute(f"UPDATE {table} SET {column} = %s WHERE {first}", (b,))
        conn.execute(f"UPDATE {table} SET {column} = %s WHERE {second}", (a,))
    async with PostgresCheckpointer.open(
        postgres_dsn(), schema=schema, encryption=encryption
    ) as cp:
        with pytest.raises(DeserializationError, match="failed authentication"):
            await cp.get("t")
            await cp.get("other")


@pytest.mark.parametrize("tampering", sorted(TAMPERING))
async def test_edited_structure_is_detected(schema: str, tampering: str) -> None:
    encryption = keys("k1", active="k1")
    await _two_checkpoints(schema, encryption)
    with admin_connection() as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        assert conn.execute(TAMPERING[tampering]).rowcount == 1
    async with PostgresCheckpointer.open(
        postgres_dsn(), schema=schema, encryption=encryption
    ) as cp:
        with pytest.raises(DeserializationError, match="failed authentication"):
            await cp.get("t")
        assert await cp.get("other") is not None  # untouched rows still read


async def test_plaintext_and_encrypted_rows_are_refused_by_the_other_mode(schema: str) -> None:
    async with fresh_schema() as other:
        await _two_checkpoints(schema, None)
        await _two_checkpoints(other, keys("k1", active="k1"))
        async with (
            PostgresCheckpointer.open(
                postgres_dsn(), schema=schema, encryption=keys("k1", active="k1")
            ) as encrypted,
            PostgresCheckpointer.open(postgres_dsn(), schema=other) as plain,
        ):
            with pytest.raises(DeserializationError, match="not encrypted"):
                await encrypted.get("t")
            with pytest.raises(DeserializationError, match="is encrypted"):
                await plain.get("t")
