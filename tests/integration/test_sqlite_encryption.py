"""Encryption at rest with the SQLite backend: nothing readable on disk, no swapped blobs."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import (
    END,
    START,
    CompiledGraph,
    DeserializationError,
    NodeExecutionError,
    Send,
    StateGraph,
)
from graphexec.testing import put_chain

SECRET = "patient-4711-diagnosis"
KEY_1 = bytes(range(32))
KEY_2 = bytes(range(100, 132))


def keys(*ids: str, active: str) -> Encryption:
    material = {"k1": KEY_1, "k2": KEY_2}
    return Encryption(keys={i: material[i] for i in ids}, active=active)


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]
    summary: str


def notes_graph(cp: SqliteCheckpointer, *, fail: bool = False) -> CompiledGraph[Any]:
    async def fan(i: int) -> dict[str, Any]:
        if fail and i == 2:
            await asyncio.sleep(0.05)
            raise RuntimeError("tool down")
        return {"notes": [f"{SECRET} part {i}"]}

    def summarize(state: Notes) -> dict[str, Any]:
        return {"summary": f"{len(state['notes'])} notes about {SECRET}"}

    b = StateGraph(Notes)
    b.add_node("fan", fan)
    b.add_node("summarize", summarize)
    b.add_conditional_edges(START, lambda s: [Send("fan", i) for i in range(3)])
    b.add_edge("fan", "summarize")
    b.add_edge("summarize", END)
    return b.compile(checkpointer=cp)


def file_bytes(db: Path) -> bytes:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return b"".join(p.read_bytes() for p in sorted(db.parent.glob(db.name + "*")))


@contextlib.contextmanager
def raw(db: Path) -> Any:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


@pytest.mark.parametrize("encrypted", [False, True])
async def test_nothing_readable_on_disk_when_encrypted(tmp_path: Path, encrypted: bool) -> None:
    db = tmp_path / "cp.db"
    encryption = keys("k1", active="k1") if encrypted else None
    async with SqliteCheckpointer.open(db, encryption=encryption) as cp:
        done = await notes_graph(cp).ainvoke(
            {"notes": [], "summary": ""}, thread_id="t", metadata={"who": SECRET}
        )
        assert done["summary"] == f"3 notes about {SECRET}"
        # a failed parallel step leaves the finished tasks' writes stored as pending writes
        with pytest.raises(NodeExecutionError):
            await notes_graph(cp, fail=True).ainvoke({"notes": [], "summary": ""}, thread_id="u")
        head = await cp.get("u")
        assert head is not None
        assert any(SECRET.encode() in w.data for w in head.pending_writes)
        state = await notes_graph(cp).aget_state("t")
        assert state is not None and state.metadata["who"] == SECRET
    assert (SECRET.encode() in file_bytes(db)) is not encrypted


async def _two_checkpoints(db: Path, encryption: Encryption | None) -> None:
    async with SqliteCheckpointer.open(db, encryption=encryption) as cp:
        cps = await put_chain(cp, "t", 3, snapshot_steps={1})
        await put_chain(cp, "other", 2)
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task-a", [("x", b"a")])
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task-b", [("x", b"b")])


SWAPS = {
    "deltas of two checkpoints": (
        "graphexec_channels",
        "data",
        "cp_seq = 2 AND role = 'd' AND channel = 'messages'",
        "cp_seq = 3 AND role = 'd' AND channel = 'messages'",
    ),
    "a delta and a snapshot": (
        "graphexec_channels",
        "data",
        "cp_seq = 2 AND role = 'd' AND channel = 'messages'",
        "cp_seq = 2 AND role = 's' AND channel = 'messages'",
    ),
    "two channels": (
        "graphexec_channels",
        "data",
        "cp_seq = 3 AND role = 'd' AND channel = 'messages'",
        "cp_seq = 3 AND role = 'd' AND channel = 'counter'",
    ),
    "pending writes of two tasks": (
        "graphexec_writes",
        "data",
        "task_id = 'task-a'",
        "task_id = 'task-b'",
    ),
    "metadata of two checkpoints": (
        "graphexec_checkpoints",
        "metadata",
        "cp_seq = 2",
        "cp_seq = 3",
    ),
    "frontiers of two threads": ("graphexec_checkpoints", "frontier", "cp_seq = 3", "cp_seq = 5"),
}


@pytest.mark.parametrize("swap", sorted(SWAPS))
async def test_blobs_swapped_between_rows_are_detected(tmp_path: Path, swap: str) -> None:
    db = tmp_path / "cp.db"
    encryption = keys("k1", active="k1")
    await _two_checkpoints(db, encryption)
    table, column, first, second = SWAPS[swap]
    with raw(db) as conn:
        [(a,)] = conn.execute(f"SELECT {column} FROM {table} WHERE {first}").fetchall()
        [(b,)] = conn.execute(f"SELECT {column} FROM {table} WHERE {second}").fetchall()
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {first}", (b,))
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE {second}", (a,))
    async with SqliteCheckpointer.open(db, encryption=encryption) as cp:
        with pytest.raises(DeserializationError, match="failed authentication"):
            await cp.get("t")
            await cp.get("other")


async def test_a_tampered_byte_is_detected(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    encryption = keys("k1", active="k1")
    await _two_checkpoints(db, encryption)
    with raw(db) as conn:
        [(data,)] = conn.execute("SELECT data FROM graphexec_channels WHERE cp_seq = 3 LIMIT 1")
        flipped = data[:-1] + bytes([data[-1] ^ 1])
        conn.execute("UPDATE graphexec_channels SET data = ? WHERE data = ?", (flipped, data))
    async with SqliteCheckpointer.open(db, encryption=encryption) as cp:
        with pytest.raises(DeserializationError, match="failed authentication"):
            await cp.get("t")


async def test_plaintext_rows_are_refused_when_encryption_is_on(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    await _two_checkpoints(db, None)
    async with SqliteCheckpointer.open(db, encryption=keys("k1", active="k1")) as cp:
        with pytest.raises(DeserializationError, match="not encrypted"):
            await cp.get("t")
        with pytest.raises(DeserializationError, match="not encrypted"):
            await cp.list("other")


async def test_encrypted_rows_are_refused_without_encryption(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    await _two_checkpoints(db, keys("k1", active="k1"))
    async with SqliteCheckpointer.open(db) as cp:
        with pytest.raises(DeserializationError, match="is encrypted"):
            await cp.get("t")


async def test_keys_rotate_and_unknown_key_ids_are_named(tmp_path: Path) -> None:
    db = tmp_path / "cp.db"
    async with SqliteCheckpointer.open(db, encryption=keys("k1", active="k1")) as cp:
        old = await put_chain(cp, "old", 2)
    async with SqliteCheckpointer.open(db, encryption=keys("k1", "k2", active="k2")) as cp:
        new = await put_chain(cp, "new", 2)
        got_old = await cp.get("old")  # written with k1, still readable
        assert got_old is not None and got_old.checkpoint.checkpoint_id == old[-1].checkpoint_id
        more = await put_chain(cp, "old", 1, after=old[-1])
    with raw(db) as conn:
        rows = conn.execute(
            "SELECT c.thread_id, c.step, substr(c.metadata, 3, 2) FROM graphexec_checkpoints AS c"
        ).fetchall()
    written_with = {(t, s): key.decode() for t, s, key in rows}
    assert written_with == {
        ("old", 0): "k1",
        ("old", 1): "k1",
        ("old", 2): "k2",
        **{("new", 0): "k2", ("new", 1): "k2"},
    }
    async with SqliteCheckpointer.open(db, encryption=keys("k2", active="k2")) as cp:
        got_new = await cp.get("new")
        assert got_new is not None and got_new.checkpoint.checkpoint_id == new[-1].checkpoint_id
        with pytest.raises(DeserializationError, match="key id 'k1'"):
            await cp.get("old", "", more[0].checkpoint_id)  # its chain reaches k1 rows


TAMPERING = {
    "snapshot flag set": "UPDATE graphexec_checkpoints SET has_snapshot = 1 WHERE cp_seq = 3",
    "step changed": "UPDATE graphexec_checkpoints SET step = 99 WHERE cp_seq = 3",
    "parent rewired": (
        "UPDATE graphexec_checkpoints SET parent_id = "
        "(SELECT checkpoint_id FROM graphexec_checkpoints WHERE cp_seq = 1) WHERE cp_seq = 3"
    ),
    "delta row deleted": "DELETE FROM graphexec_channels WHERE cp_seq = 3 AND channel = 'counter'",
    "delta op flipped": (
        "UPDATE graphexec_channels SET op = 'set' WHERE cp_seq = 3 AND channel = 'messages'"
    ),
    "snapshot row made a marker": (
        "UPDATE graphexec_channels SET op = 'same' "
        "WHERE cp_seq = 2 AND role = 's' AND channel = 'messages'"
    ),
}


@pytest.mark.parametrize("tampering", sorted(TAMPERING))
async def test_edited_structure_is_detected(tmp_path: Path, tampering: str) -> None:
    db = tmp_path / "cp.db"
    encryption = keys("k1", active="k1")
    await _two_checkpoints(db, encryption)
    with raw(db) as conn:
        assert conn.execute(TAMPERING[tampering]).rowcount == 1
    async with SqliteCheckpointer.open(db, encryption=encryption) as cp:
        with pytest.raises(DeserializationError, match="failed authentication"):
            await cp.get("t")
        assert await cp.get("other") is not None  # untouched rows still read
