"""Files written by an older graphexec (schema 15) upgrade in place and read back identically.

The fixtures and the reads the old version returned come from ``sqlite_upgrade_fixture.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from sqlite_upgrade_fixture import (
    ENCRYPTED,
    KEY,
    PLAIN,
    POLICY,
    READS,
    dump,
    graph,
)

from checkpointers import SqliteCheckpointer
from checkpointers import _sql as sql
from graphexec.testing import put_chain

pytest.importorskip("cryptography")


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copyfile(src, dst)
    return dst


def versions(db: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [v for (v,) in conn.execute("SELECT version FROM graphexec_migrations")]


@pytest.fixture(scope="module")
def reads() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = json.loads(READS.read_text())
    return loaded


async def test_the_fixtures_are_at_schema_15(tmp_path: Path) -> None:
    assert versions(PLAIN) == list(range(16))
    assert versions(ENCRYPTED) == list(range(16))


async def test_an_upgraded_file_reads_exactly_as_before(
    tmp_path: Path, reads: dict[str, dict[str, str]]
) -> None:
    db = copy(PLAIN, tmp_path)
    async with SqliteCheckpointer.open(db, snapshot_policy=POLICY) as cp:
        got = await dump(cp)
    assert versions(db) == list(range(len(sql.MIGRATIONS)))
    assert got.keys() == reads["plain"].keys()
    for key, want in reads["plain"].items():
        assert got[key] == want, key
    with contextlib.closing(sqlite3.connect(db)) as conn:
        kinds = dict(
            conn.execute(
                "SELECT typeof(checkpoint_id), count(*) FROM graphexec_checkpoints GROUP BY 1"
            ).fetchall()
        )
        # canonical UUIDs are now 16 bytes; the other ids ("first", an uppercase UUID, "zzz...")
        # stay text
        assert kinds == {"blob": 48, "text": 3}
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


async def test_an_upgraded_encrypted_file_reads_exactly_as_before(
    tmp_path: Path, reads: dict[str, dict[str, str]]
) -> None:
    db = copy(ENCRYPTED, tmp_path)
    async with SqliteCheckpointer.open(db, snapshot_policy=POLICY, encryption=KEY) as cp:
        got = await dump(cp)
    assert got == reads["encrypted"]


async def test_several_stores_opening_an_old_file_at_once_upgrade_it_once(
    tmp_path: Path, reads: dict[str, dict[str, str]]
) -> None:
    db = copy(PLAIN, tmp_path)
    stores = [SqliteCheckpointer(db) for _ in range(4)]
    try:
        await asyncio.gather(*(s.setup() for s in stores))
        for store in stores:
            assert await dump(store) == reads["plain"]
    finally:
        for store in stores:
            await store.aclose()
    assert versions(db) == list(range(len(sql.MIGRATIONS)))


async def test_an_upgraded_file_keeps_working(tmp_path: Path) -> None:
    db = copy(PLAIN, tmp_path)
    async with SqliteCheckpointer.open(db, snapshot_policy=POLICY) as cp:
        before = await cp.list("loop")
        # run the (finished) thread on with new input: old and new rows in one chain
        g = graph(cp, 24)
        state = await g.aget_state("loop")
        assert state is not None
        out = await g.ainvoke({"msgs": ["again"]}, thread_id="loop")
        assert out["n"] == 24
        assert out["msgs"][: len(state.values["msgs"])] == state.values["msgs"]
        after = await cp.list("loop")
        assert [c.checkpoint_id for c in after[-len(before) :]] == [c.checkpoint_id for c in before]
        assert after[len(after) - len(before)].parent_id == before[0].parent_id
        assert (await cp.get("loop", "", before[0].checkpoint_id)) is not None
        # time travel and a fork from an old (converted) checkpoint
        old = before[5]
        old_state = await g.aget_state("loop", checkpoint_id=old.checkpoint_id)
        assert old_state is not None
        await g.afork("loop", old.checkpoint_id, "loop-fork")
        forked = await g.aget_state("loop-fork")
        assert forked is not None and forked.values == old_state.values
        # prune across old and new rows: what is kept reads the same, parents included
        history = await g.aget_state_history("loop")
        assert await g.aprune("loop", keep_last=6) > 0
        kept = await g.aget_state_history("loop")
        assert [(s.checkpoint_id, s.parent_id, s.values) for s in kept] == [
            (s.checkpoint_id, s.parent_id, s.values) for s in history[:6]
        ]
        # the pruned thread of the fixture, pruned again
        pruned = await cp.list("pruned")
        assert await g.aprune("pruned", keep_last=2) == 2
        assert [c.parent_id for c in await cp.list("pruned")] == [c.parent_id for c in pruned[:2]]
        # a thread with text ids continues with text ids
        custom = await cp.get("custom")
        assert custom is not None
        [nxt] = await put_chain(cp, "custom", 1, after=custom.checkpoint)
        got = await cp.get("custom")
        assert got is not None and got.checkpoint.parent_id == "z" * 40
        assert got.checkpoint.checkpoint_id == nxt.checkpoint_id


async def test_a_process_still_on_the_old_schema_cannot_commit(tmp_path: Path) -> None:
    db = copy(PLAIN, tmp_path)
    async with SqliteCheckpointer.open(db):
        pass
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(seq,)] = conn.execute("SELECT max(cp_seq) FROM graphexec_checkpoints").fetchall()
        row = {"cp_seq": seq + 1, "role": "d", "channel": "msgs", "op": "set", "data": b"\x90"}
        with pytest.raises(sqlite3.IntegrityError, match="CHECK constraint failed"):
            conn.execute(sql.INSERT_CHANNEL, row)  # the statement schema 15 wrote with
