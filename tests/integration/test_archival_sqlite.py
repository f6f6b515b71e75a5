"""SQLite archival store on real files: reopen, caches across instances, bulk loads, lifecycle."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import sqlite3
import threading
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import memory._archival_common as common
import memory._sqlite_archival as arch
import memory._sqlite_passages as passages
from checkpointers import SqliteCheckpointer
from graphexec.errors import MemoryStoreError, StorageError
from graphexec.testing import assert_eventually
from memory import _vectors
from memory._archival_common import NewPassage
from memory._base import SearchPage
from memory._sqlite_archival import SqliteArchivalStore
from memory.embedders import Vector

TEXTS = [
    "The user prefers window seats on long-haul flights.",
    "Customer asked for a refund because the blender arrived cracked.",
    "Our office Wi-Fi password rotates on the first Monday of every month.",
    "The quarterly budget review moved to Thursday afternoon.",
    "Grandma's lasagna recipe needs fresh basil and ricotta.",
]


def _ids(page: SearchPage) -> list[str]:
    return [h.passage.id for h in page.hits]


def fts_integrity(path: Path) -> None:
    """FTS5's own check that the index matches the passages table (raises if not)."""
    db = sqlite3.connect(path)
    try:
        db.execute("INSERT INTO archival_fts (archival_fts) VALUES ('integrity-check')")
    finally:
        db.close()


async def test_reopen_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with SqliteArchivalStore.open(path, namespace=("u",)) as store:
        ids = await store.insert_many(TEXTS)
        pid = await store.insert("Tagged.", tags=["t"], metadata={"k": [1]}, op_key="once")
        before = await store.get(pid)
        assert store.path == path.resolve()
    async with SqliteArchivalStore.open(str(path), namespace=("u",)) as store:
        assert await store.get(pid) == before
        assert await store.insert("Again.", op_key="once") == pid
        assert _ids(await store.search("money back for a broken kitchen appliance", top_k=1)) == [
            ids[1]
        ]
        assert [h.passage.id for h in (await store.list(tags=["t"])).hits] == [pid]
    db = sqlite3.connect(path)
    try:
        [(version,)] = db.execute(f"SELECT max(version) FROM {passages.VERSION_TABLE}").fetchall()
    finally:
        db.close()
    assert version == len(passages.MIGRATIONS) - 1
    fts_integrity(path)


async def test_shares_a_file_with_the_checkpointer(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    async with SqliteCheckpointer.open(path) as cp, SqliteArchivalStore.open(path) as store:
        await cp.setup()
        pid = await store.insert("Both stores live in one file.")
        assert await store.get(pid) is not None


async def test_in_memory_store_is_private(tmp_path: Path) -> None:
    async with SqliteArchivalStore.open(None) as one, SqliteArchivalStore.open(None) as two:
        assert one.path is None
        await one.insert("Only in the first.")
        assert (await two.list()).hits == []

        def from_another_loop() -> int:
            return len(asyncio.run(one.list()).hits)

        assert await asyncio.to_thread(from_another_loop) == 1


async def test_other_instances_writes_reach_the_vector_cache(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with (
        SqliteArchivalStore.open(path) as reader,
        SqliteArchivalStore.open(path) as writer,
    ):
        ids = await writer.insert_many(TEXTS)
        query = "when does the wireless network key change"
        assert _ids(await reader.search(query, top_k=1)) == [ids[2]]
        assert len(reader._shared.caches) == 1

        new = await writer.insert("The router passphrase changes every month.")
        assert new in _ids(await reader.search(query, top_k=3))

        await writer.update(ids[2], text="Lasagna needs a hot oven.")
        assert ids[2] not in _ids(await reader.search("wireless network key", top_k=5))
        assert ids[2] in _ids(await reader.search("lasagna oven", top_k=2))

        await writer.delete(new)
        assert new not in _ids(await reader.search(query, top_k=10))
        fts_integrity(path)


async def test_pure_python_vectors_match_numpy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        await store.insert_many(
            [NewPassage(t, tags=["even" if i % 2 else "odd"]) for i, t in enumerate(TEXTS * 3)]
        )
        middle = (await store.list(limit=8)).hits[-1].passage.created_at
        cases: list[dict[str, Any]] = [{}, {"tags": ["odd"]}, {"after": middle}]
        queries = ["refund for cracked blender", "password", "budget review lasagna"]
        expected = [[_ids(await store.search(q, **kw)) for kw in cases] for q in queries]
        monkeypatch.setattr(arch, "np", None)
        monkeypatch.setattr(_vectors, "_CHUNK", 4)  # several chunks per scan
        got = [[_ids(await store.search(q, **kw)) for kw in cases] for q in queries]
    assert got == expected


async def test_insert_many_validates_everything_first(tmp_path: Path) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        with pytest.raises(MemoryStoreError):
            await store.insert_many(["fine", NewPassage("also fine", tags=[""]), "never"])
        with pytest.raises(MemoryStoreError):
            await store.insert_many(["fine", 3])  # type: ignore[list-item]
        with pytest.raises(MemoryStoreError):
            await store.insert_many(["fine"], batch_size=0)
        assert (await store.list()).hits == []

        items = [NewPassage(f"Bulk passage {i}.", op_key=f"k{i % 7}") for i in range(20)]
        ids = await store.insert_many(items, batch_size=3)
        assert len(ids) == 20
        assert ids[:7] == ids[7:14]
        assert ids[14:] == ids[:6]
        assert len(set(ids)) == 7
        assert len((await store.list()).hits) == 7
        assert await store.insert_many([]) == []


async def test_concurrent_searches_and_inserts(tmp_path: Path) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        await store.insert_many([f"Seed note {i} about harbours." for i in range(200)])

        async def search() -> list[str]:
            return _ids(await store.search("harbours note", top_k=50))

        results = await asyncio.gather(
            *(search() for _ in range(10)),
            *(store.insert(f"Late note {i} about harbours.") for i in range(20)),
            *(search() for _ in range(10)),
        )
        for ids in results:
            if isinstance(ids, list):
                assert len(ids) == len(set(ids)) == 50
        cache = next(iter(store._shared.caches.values()))
        assert cache.snapshot()[1].tolist() == sorted(set(cache.snapshot()[1].tolist()))


async def test_a_leaked_store_warns(tmp_path: Path) -> None:
    def connection_threads() -> int:  # not the default executor's (embedding) threads
        return sum(not t.name.startswith("asyncio_") for t in threading.enumerate())

    threads_before = connection_threads()
    store = SqliteArchivalStore(tmp_path / "memory.db")
    await store.insert("Leaked.")
    with pytest.warns(ResourceWarning, match="garbage-collected with open connections"):
        del store
        gc.collect()

    async def connections_stopped() -> None:
        assert connection_threads() == threads_before

    await assert_eventually(connections_stopped)


async def test_a_closed_store_refuses_work(tmp_path: Path) -> None:
    store = SqliteArchivalStore(tmp_path / "memory.db")
    view = store.for_namespace(("other",))
    async with store:
        await view.insert("Through the view.")
    with pytest.raises(StorageError, match="closed"):
        await store.search("view")
    with pytest.raises(StorageError, match="closed"):
        await view.insert("After close.")
    assert "other" in repr(view)


async def test_cache_paths_give_the_same_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        await store.insert_many([NewPassage(t, tags=["t"]) for t in TEXTS])
        queries = ["refund blender", "wireless password", "budget meeting"]
        expected = [_ids(await store.search(q)) for q in queries]
        store._shared.caches.clear()
        monkeypatch.setattr(_vectors, "_CHUNK", 2)  # the cache loads in several chunks
        monkeypatch.setattr(arch, "PARALLEL_ROWS", 1)  # scoring runs in a worker thread
        assert [_ids(await store.search(q)) for q in queries] == expected
        assert [_ids(await store.search(q, tags=["t"])) for q in queries] == expected


async def test_common_words_are_left_to_vector_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        ids = await store.insert_many(TEXTS)
        monkeypatch.setattr(passages, "COMMON_TERM_FLOOR", 0)
        monkeypatch.setattr(passages, "COMMON_TERM_SHARE", 0.0)  # every word counts as common
        st = common.state_of(
            await store._shared.db.read("t", passages.SEARCH_STATE, {"ns": store._ns})
        )
        assert st is not None
        filters = passages.Filters(None, "any", None, None)
        assert await store._keyword_candidates("blender refund", st, filters, 50) == []
        assert _ids(await store.search("blender refund", top_k=1)) == [ids[1]]


@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"tags": ["t1"]},
        {"tags": ["t1", "t2"], "tag_mode": "all"},
        {"after": datetime(2000, 1, 1, tzinfo=UTC)},
    ],
    ids=repr,
)
async def test_keyword_search_is_the_same_alone_in_the_file_or_not(
    tmp_path: Path, filters: dict[str, Any]
) -> None:
    """The single-namespace shortcut (no join) finds what the joined query finds."""
    texts = [f"Invoice {i} for the blender refund, batch {i % 7}." for i in range(60)]
    tags = [[f"t{i % 3}", f"t{i % 2 + 1}"] for i in range(60)]
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as alone:
        for text, tag in zip(texts, tags, strict=True):
            await alone.insert(text, tags=tag)
        only = [
            h.passage.text
            for h in (await alone.search("blender refund batch", top_k=30, **filters)).hits
        ]
        other = alone.for_namespace(("other",))
        await other.insert("Unrelated blender refund note.")
        shared = [
            h.passage.text
            for h in (await alone.search("blender refund batch", top_k=30, **filters)).hits
        ]
    assert only == shared and only


async def test_term_counts_are_cached_until_the_file_changes(tmp_path: Path) -> None:
    async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
        await store.insert_many([f"Blender refund {i}." for i in range(5)])
        await store.search("blender refund")
        cached = dict(store._shared.term_counts)
        assert cached and set(cached.values()) == {5}
        await store.for_namespace(("elsewhere",)).insert("Blender again.")
        await store.search("blender refund")
        assert store._shared.term_counts['"blender"'] == 6


async def test_a_broken_embedder_is_reported(tmp_path: Path) -> None:
    class Short:
        name = "short"
        dim = 8

        def embed(self, texts: Sequence[str]) -> list[Vector]:
            return [array("f", [1.0] * 4) for _ in texts]

    async with SqliteArchivalStore.open(None, embedder=Short()) as store:
        with pytest.raises(MemoryStoreError, match="'short' returned"):
            await store.insert("Anything.")
        assert (await store.list()).hits == []


async def test_a_tampered_cursor_is_refused(tmp_path: Path) -> None:
    async with SqliteArchivalStore.open(None) as store:
        await store.insert_many([f"Invoice {i} paid." for i in range(8)])
        page = await store.search("invoice", top_k=2)
        assert page.cursor is not None
        payload = json.loads(base64.urlsafe_b64decode(page.cursor + "=" * (-len(page.cursor) % 4)))
        for depth in (0, 10**9):
            forged = common.encode_cursor({**payload, "d": depth})
            with pytest.raises(MemoryStoreError, match="invalid archival cursor"):
                await store.search("invoice", top_k=2, cursor=forged)
