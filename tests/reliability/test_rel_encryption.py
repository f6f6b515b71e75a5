"""Encrypted checkpoints under attack, one row per test, on SQLite and PostgreSQL.

Rows: the wrong key (unknown key id; same id, other key material), a tampered ciphertext byte,
a plaintext row in an encrypted store, an encrypted row read without keys, and blobs (channel
values, metadata, frontier, pending writes) moved between threads or checkpoints. Every read must
raise :class:`~graphexec.DeserializationError` saying why; no data is returned for such a row,
and rows nobody touched stay readable.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from rel_backends import Backend, backend_params, make_backend
from rel_support import STATS

from checkpointers import Encryption
from graphexec import (
    END,
    START,
    BaseCheckpointer,
    CompiledGraph,
    DeserializationError,
    Send,
    StateGraph,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(100, 132))
SECRET = "patient-4711"


def enc(key_id: str = "k1", key: bytes = KEY_A) -> Encryption:
    return Encryption(keys={key_id: key}, active=key_id)


class Notes(TypedDict):
    notes: Annotated[list[str], operator.add]
    summary: str


def graph_for(cp: BaseCheckpointer, *, fail: bool = False) -> CompiledGraph[Any]:
    async def part(i: int) -> dict[str, Any]:
        if fail and i == 1:
            await asyncio.sleep(0.02)
            raise RuntimeError("down")
        return {"notes": [f"{SECRET} {i}"]}

    b = StateGraph(Notes)
    b.add_node("part", part)
    b.add_node("sum", lambda s: {"summary": f"{len(s['notes'])} about {SECRET}"})
    b.add_conditional_edges(START, lambda s: [Send("part", i) for i in range(2)])
    b.add_edge("part", "sum")
    b.add_edge("sum", END)
    return b.compile(checkpointer=cp)


INPUT = {"notes": [], "summary": ""}


async def write_threads(backend: Backend, encryption: Encryption | None) -> None:
    async with backend.open(encryption=encryption) as cp:
        for t in ("a", "b", "untouched"):
            await graph_for(cp).ainvoke(INPUT, thread_id=t, metadata={"who": SECRET})
        await graph_for(cp, fail=True).arun(INPUT, thread_id="p")  # leaves pending writes
        await graph_for(cp, fail=True).arun(INPUT, thread_id="q")


def _latest(backend: Backend, thread: str) -> int:
    [(seq,)] = backend.raw_sql(
        "SELECT max(cp_seq) FROM graphexec_checkpoints WHERE thread_id = %s", (thread,)
    )
    return int(seq)


def move(table: str, column: str, where: str) -> Callable[[Backend], str]:
    """Copy ``column`` of thread b's matching row over thread a's; returns the thread to read."""

    def tamper(backend: Backend) -> str:
        src, dst = ("q", "p") if table == "graphexec_writes" else ("b", "a")
        key = "cp_seq"
        [(blob,)] = backend.raw_sql(
            f"SELECT {column} FROM {table} WHERE {key} = %s AND {where}", (_latest(backend, src),)
        )
        backend.raw_sql(
            f"UPDATE {table} SET {column} = %s WHERE {key} = %s AND {where}",
            (blob, _latest(backend, dst)),
        )
        return dst

    return tamper


def flip_byte(backend: Backend) -> str:
    seq = _latest(backend, "a")
    [(data,)] = backend.raw_sql(
        "SELECT data FROM graphexec_channels WHERE cp_seq = %s AND channel = 'summary' "
        "AND role = 'd'",
        (seq,),
    )
    data = bytes(data)
    backend.raw_sql(
        "UPDATE graphexec_channels SET data = %s WHERE cp_seq = %s AND channel = 'summary' "
        "AND role = 'd'",
        (data[:-1] + bytes([data[-1] ^ 1]), seq),
    )
    return "a"


def nothing(backend: Backend) -> str:
    return "a"


@dataclass(frozen=True)
class Row:
    written_with: Encryption | None
    read_with: Encryption | None
    tamper: Callable[[Backend], str]
    match: str


ROWS: dict[str, Row] = {
    "wrong key id": Row(enc("k1"), enc("k2", KEY_B), nothing, "key id 'k1'"),
    "wrong key material, same id": Row(enc("k1"), enc("k1", KEY_B), nothing, "authentication"),
    "tampered ciphertext": Row(enc(), enc(), flip_byte, "failed authentication"),
    "plaintext row in an encrypted store": Row(None, enc(), nothing, "not encrypted"),
    "encrypted row read without keys": Row(enc(), None, nothing, "is encrypted"),
    "channel blob moved between threads": Row(
        enc(),
        enc(),
        move("graphexec_channels", "data", "channel = 'summary' AND role = 'd'"),
        "failed authentication",
    ),
    "metadata moved between threads": Row(
        enc(), enc(), move("graphexec_checkpoints", "metadata", "1 = 1"), "failed authentication"
    ),
    "frontier moved between threads": Row(
        enc(), enc(), move("graphexec_checkpoints", "frontier", "1 = 1"), "failed authentication"
    ),
    "pending write moved between threads": Row(
        enc(),
        enc(),
        move("graphexec_writes", "data", "channel = '__route__'"),
        "failed authentication",
    ),
}


@pytest.mark.parametrize("row", sorted(ROWS))
@pytest.mark.parametrize("kind", backend_params())
async def test_encrypted_rows_under_attack_are_refused(kind: str, row: str, tmp_path: Path) -> None:
    spec = ROWS[row]
    async with make_backend(kind, tmp_path) as backend:
        await write_threads(backend, spec.written_with)
        thread = spec.tamper(backend)
        async with backend.open(encryption=spec.read_with) as cp:
            graph = graph_for(cp)
            with pytest.raises(DeserializationError, match=spec.match):
                await graph.aget_state(thread)
            with pytest.raises(DeserializationError, match=spec.match):
                await graph.ainvoke(None, thread_id=thread)
            STATS.add("hostile", 2, kind="hostile encrypted rows")
            if (
                spec.read_with is not None
                and spec.written_with is not None
                and (spec.read_with.key_ids == spec.written_with.key_ids)
                and row != "wrong key material, same id"
            ):
                state = await graph.aget_state("untouched")  # other rows still read
                assert state is not None and state.values["summary"] == f"2 about {SECRET}"
