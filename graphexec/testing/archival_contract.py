"""Contract test suite that every archival store backend passes unmodified.

A backend's test module is a subclass plus two fixtures: ``archival`` yields a fresh, empty
store that uses the backend's default embedder, and ``archival_factory`` returns a function
giving stores for other namespaces on the same database::

    class TestSqliteArchival(ArchivalContract):
        @pytest.fixture
        async def archival(self, tmp_path: Path) -> AsyncIterator[ArchivalStore]:
            async with SqliteArchivalStore.open(tmp_path / "memory.db") as store:
                yield store

        @pytest.fixture
        def archival_factory(
            self, archival: SqliteArchivalStore
        ) -> Callable[[Namespace], ArchivalStore]:
            return archival.for_namespace

The suite uses only :class:`memory._base.ArchivalStore`. The class name has no ``Test``
prefix, so pytest collects only the subclasses. Search quality is checked on the shared eval
set (``shared/eval/archival_eval.jsonl``); that test is skipped, saying why, when the file is
not there.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import graphexec.testing
from graphexec.errors import MemoryStoreError
from memory._base import ArchivalHit, ArchivalStore, Namespace, SearchPage

__all__ = [
    "EVAL_PATH",
    "HOSTILE_STRINGS",
    "TRICKY_NAMESPACES",
    "ArchivalContract",
    "all_pages",
    "distractors",
    "load_eval",
    "timezone_shifted",
]

EVAL_PATH = (
    Path(graphexec.testing.__file__).resolve().parents[3] / "shared/eval/archival_eval.jsonl"
)
"""The shared paraphrase eval set (40 passages, one query each)."""

HOSTILE_STRINGS: tuple[str, ...] = (
    "'; DROP TABLE archival_passages; --",
    "Robert'); DROP TABLE students;--",
    '" OR 1=1 --',
    "%",
    "_",
    "%_%",
    "\\",
    '"',
    "'",
    "*",
    "NEAR(",
    "NEAR(a b, 2)",
    "AND",
    "OR NOT",
    "-",
    "-foo",
    ":",
    "text:foo",
    "^",
    "^start",
    "{a b}: c",
    "a* OR b*",
    "(",
    ")",
    "[]",
    "café ☕ 東京",
)
"""SQL and full-text syntax that must be stored and searched as plain text."""

TRICKY_NAMESPACES: tuple[tuple[Namespace, Namespace], ...] = (
    (("user_1",), ("userX1",)),
    (("foo",), ("foobar",)),
    (("foobar",), ("foo",)),
    (("%",), ("x",)),
    (("_",), ("a",)),
    (("a", "b"), ("a|b",)),
    (("a", "b"), ("a.b",)),
    (("a",), ("a", "b")),
    (("it's",), ('it"s',)),
    (("'; DROP TABLE x; --",), ("x",)),
)
"""Pairs of namespaces that must not see each other's passages."""

_SUBJECTS = ("The auditor", "Our landlord", "The night shift", "The vendor", "My neighbour")
_VERBS = ("reviewed", "postponed", "printed", "archived", "repaired", "ordered")
_OBJECTS = ("the parking permits", "the fire drill notes", "the supply order", "the spare keys")
_WHEN = ("last week", "this morning", "on Monday", "before lunch", "over the weekend")


def distractors(n: int, *, seed: int = 7) -> list[str]:
    """Generic everyday passages for recall tests, the same on every run.

    Args:
        n: How many (at most the number of distinct combinations, 600).
        seed: Seed of the shuffle.

    Returns:
        Distinct sentences.
    """
    sentences = [
        f"{s} {v} {o} {w}." for s in _SUBJECTS for v in _VERBS for o in _OBJECTS for w in _WHEN
    ]
    random.Random(seed).shuffle(sentences)
    return sentences[:n]


def load_eval(path: Path = EVAL_PATH) -> list[tuple[str, str]]:
    """``(passage, query)`` pairs of the shared eval file, in file order."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [(row["passage"], row["query"]) for row in rows]


async def all_pages(
    store: ArchivalStore, query: str, *, top_k: int, **filters: Any
) -> list[SearchPage]:
    """Every page of a search, following cursors (at most 1,000 pages)."""
    pages = [await store.search(query, top_k=top_k, **filters)]
    while pages[-1].cursor is not None:
        assert len(pages) < 1000, "search pagination does not end"
        pages.append(await store.search(query, top_k=top_k, cursor=pages[-1].cursor, **filters))
    return pages


def _ids(hits: Sequence[ArchivalHit]) -> list[str]:
    return [h.passage.id for h in hits]


async def _insert_all(store: ArchivalStore, texts: Sequence[str], **kw: Any) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(texts), 100):
        chunk = texts[start : start + 100]
        ids += await asyncio.gather(*(store.insert(t, **kw) for t in chunk))
    return ids


class ArchivalContract:
    """The archival store contract. Subclass it and override the two fixtures."""

    @pytest.fixture
    def archival(self) -> ArchivalStore:
        """A fresh, empty store with the backend's default embedder (override this)."""
        raise NotImplementedError("override the 'archival' fixture to yield an empty store")

    @pytest.fixture
    def archival_factory(self, archival: ArchivalStore) -> Callable[[Namespace], ArchivalStore]:
        """Stores for other namespaces on ``archival``'s database (override this)."""
        raise NotImplementedError("override 'archival_factory' to return namespace views")

    # -- round trip, ids, idempotency -------------------------------------------------------

    async def test_insert_get_round_trip(self, archival: ArchivalStore) -> None:
        """A passage comes back as written: text, tags (deduplicated, in order), metadata."""
        before = datetime.now(UTC)
        metadata = {"source": "chat", "n": 3, "nested": {"ok": [1, 2.5, None, True]}, "é": "ü"}
        pid = await archival.insert(
            "The user prefers window seats on long-haul flights.",
            tags=["travel", "prefs", "travel"],
            metadata=metadata,
        )
        after = datetime.now(UTC)
        got = await archival.get(pid)
        assert got is not None
        assert got.id == pid
        assert got.text == "The user prefers window seats on long-haul flights."
        assert got.tags == ("travel", "prefs")
        assert dict(got.metadata) == metadata
        assert got.created_at.tzinfo is not None
        assert before - timedelta(seconds=1) <= got.created_at <= after + timedelta(seconds=1)
        assert await archival.get("no-such-id") is None
        listed = await archival.list()
        assert _ids(listed.hits) == [pid]
        assert listed.hits[0].score == 0.0
        assert listed.cursor is None

    async def test_metadata_is_not_aliased(self, archival: ArchivalStore) -> None:
        """Stored metadata is a copy: mutating the input or a result changes nothing."""
        metadata: dict[str, Any] = {"items": [1]}
        pid = await archival.insert("Aliasing check.", metadata=metadata)
        metadata["items"].append(2)
        got = await archival.get(pid)
        assert got is not None
        assert dict(got.metadata) == {"items": [1]}
        got.metadata["items"].append(3)
        again = await archival.get(pid)
        assert again is not None
        assert dict(again.metadata) == {"items": [1]}

    async def test_ids_are_unique(self, archival: ArchivalStore) -> None:
        """Every insert gets a new id, even for the same text."""
        ids = [await archival.insert("Same text every time.") for _ in range(20)]
        assert len(set(ids)) == 20
        assert len((await archival.list()).hits) == 20

    async def test_op_key_makes_insert_idempotent(
        self, archival: ArchivalStore, archival_factory: Callable[[Namespace], ArchivalStore]
    ) -> None:
        """A repeated op key returns the first id and writes nothing, per namespace."""
        first = await archival.insert("Original text.", op_key="step-7")
        again = await archival.insert("Different text.", tags=["x"], op_key="step-7")
        assert again == first
        page = await archival.list()
        assert [(h.passage.id, h.passage.text) for h in page.hits] == [(first, "Original text.")]
        racing = await asyncio.gather(
            *(archival.insert(f"Racing {i}.", op_key="race") for i in range(10))
        )
        assert len(set(racing)) == 1
        assert len((await archival.list()).hits) == 2
        other = archival_factory(("op-key", "elsewhere"))
        elsewhere = await other.insert("Original text.", op_key="step-7")
        assert elsewhere != first
        assert await archival.delete(first)
        assert await archival.insert("After delete.", op_key="step-7") == first
        assert await archival.get(first) is None
        assert _ids((await archival.list()).hits) == racing[:1]

    # -- validation -------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"text": ""},
            {"text": "   \n"},
            {"text": 42},
            {"text": None},
            {"text": "\ud800 lone surrogate"},
            {"text": "ok", "tags": [""]},
            {"text": "ok", "tags": [3]},
            {"text": "ok", "tags": "travel"},
            {"text": "ok", "tags": ["fine", None]},
            {"text": "ok", "metadata": {"x": object()}},
            {"text": "ok", "metadata": {"x": float("nan")}},
            {"text": "ok", "metadata": {1: "int key"}},
            {"text": "ok", "metadata": [("a", 1)]},
            {"text": "ok", "metadata": {"x": {"y": {1, 2}}}},
            {"text": "ok", "op_key": ""},
        ],
        ids=repr,
    )
    async def test_invalid_insert_writes_nothing(
        self, archival: ArchivalStore, kwargs: dict[str, Any]
    ) -> None:
        """Bad input raises MemoryStoreError before anything is written."""
        kwargs = dict(kwargs)
        text = kwargs.pop("text")
        with pytest.raises(MemoryStoreError):
            await archival.insert(text, **kwargs)
        assert (await archival.list()).hits == []
        assert (await archival.search("ok")).hits == []

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"top_k": 0},
            {"top_k": 1001},
            {"top_k": True},
            {"top_k": "5"},
            {"tag_mode": "some"},
            {"tags": "travel"},
            {"tags": [""]},
            {"after": datetime(2024, 1, 1)},
            {"before": datetime(2024, 1, 1)},
            {"after": "2024-01-01"},
            {"cursor": "not a cursor"},
            {"cursor": ""},
        ],
        ids=repr,
    )
    async def test_invalid_search_arguments(
        self, archival: ArchivalStore, kwargs: dict[str, Any]
    ) -> None:
        """Bad search arguments raise MemoryStoreError."""
        await archival.insert("Something to search.")
        with pytest.raises(MemoryStoreError):
            await archival.search("something", **kwargs)

    @pytest.mark.parametrize(
        "kwargs", [{"limit": 0}, {"limit": 1001}, {"tags": "x"}, {"cursor": "zz"}], ids=repr
    )
    async def test_invalid_list_arguments(
        self, archival: ArchivalStore, kwargs: dict[str, Any]
    ) -> None:
        """Bad list arguments raise MemoryStoreError."""
        with pytest.raises(MemoryStoreError):
            await archival.list(**kwargs)

    async def test_empty_and_stopword_queries(self, archival: ArchivalStore) -> None:
        """Searching an empty store, or with no usable words, is not an error."""
        assert (await archival.search("anything")).hits == []
        await archival.insert("The quarterly report is late.")
        for query in ("", "   ", "the and of to", "?!", "\u200b"):
            page = await archival.search(query)
            assert isinstance(page.hits, list)

    # -- filters ----------------------------------------------------------------------------

    async def test_tag_filters_any_and_all(self, archival: ArchivalStore) -> None:
        """``tag_mode`` any/all select the right passages in search and list."""
        a = await archival.insert("Solar panel maintenance for roof A.", tags=["a"])
        b = await archival.insert("Solar panel maintenance for roof B.", tags=["b"])
        ab = await archival.insert("Solar panel maintenance for roof AB.", tags=["a", "b"])
        none = await archival.insert("Solar panel maintenance for roof N.")

        async def found(**kw: Any) -> set[str]:
            return set(_ids((await archival.search("solar panel maintenance", **kw)).hits))

        assert await found() == {a, b, ab, none}
        assert await found(tags=["a"]) == {a, ab}
        assert await found(tags=["a", "b"]) == {a, b, ab}
        assert await found(tags=["a", "b"], tag_mode="all") == {ab}
        assert await found(tags=["a", "missing"], tag_mode="all") == set()
        assert await found(tags=["missing"]) == set()
        assert set(_ids((await archival.list(tags=["b"])).hits)) == {b, ab}
        assert set(_ids((await archival.list(tags=["missing"])).hits)) == set()

    async def test_date_filters(self, archival: ArchivalStore) -> None:
        """``after``/``before`` are strict bounds on ``created_at``, in any UTC offset."""
        ids = [await archival.insert(f"Weekly status update number {i}.") for i in range(3)]
        times = []
        for pid in ids:
            got = await archival.get(pid)
            assert got is not None
            times.append(got.created_at)
        assert times == sorted(times)
        assert len(set(times)) == 3

        async def found(**kw: Any) -> set[str]:
            return set(_ids((await archival.search("weekly status update", **kw)).hits))

        assert await found() == set(ids)
        assert await found(after=times[0]) == set(ids[1:])
        assert await found(before=times[2]) == set(ids[:2])
        assert await found(after=times[0], before=times[2]) == {ids[1]}
        assert await found(after=times[2]) == set()
        eastern = timezone_shifted(times[1], hours=-5)
        assert await found(after=eastern) == {ids[2]}

    async def test_filtered_search_finds_rare_match_among_many(
        self, archival: ArchivalStore
    ) -> None:
        """Filters apply before the limit: one tagged passage among 2,000 similar ones is found."""
        query = "quarterly budget report for the marketing team"
        texts = [f"Quarterly budget report for the marketing team, draft {i}." for i in range(2000)]
        await _insert_all(archival, texts, tags=["common"])
        # Much weaker a match than any distractor: without filters it ranks far below them.
        rare = await archival.insert("Marketing budget notes, kept short.", tags=["rare", "x"])
        page = await archival.search(query, tags=["rare"], top_k=1)
        assert _ids(page.hits) == [rare]
        page = await archival.search(query, tags=["rare", "x"], tag_mode="all", top_k=3)
        assert _ids(page.hits) == [rare]
        got = await archival.get(rare)
        assert got is not None
        page = await archival.search(query, after=got.created_at - timedelta(microseconds=1))
        assert _ids(page.hits) == [rare]
        listed = await archival.list(tags=["rare"], limit=5)
        assert _ids(listed.hits) == [rare]

    # -- pagination -------------------------------------------------------------------------

    async def test_search_pages_cover_every_hit_once(self, archival: ArchivalStore) -> None:
        """Following cursors visits every hit exactly once, best first."""
        zebras = set(
            await _insert_all(archival, [f"Zebra sighting {i} at the park." for i in range(30)])
        )
        await _insert_all(archival, [f"Routine maintenance log {i}." for i in range(30)])
        pages = await all_pages(archival, "zebra sighting", top_k=4)
        hits = [h for p in pages for h in p.hits]
        ids = _ids(hits)
        assert len(ids) == len(set(ids)), "a hit appeared on two pages"
        assert zebras <= set(ids)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(len(p.hits) == 4 for p in pages[:-1])
        assert pages[-1].cursor is None

    async def test_cursor_is_bound_to_its_search(
        self, archival: ArchivalStore, archival_factory: Callable[[Namespace], ArchivalStore]
    ) -> None:
        """A cursor only continues the search (query, filters, namespace) that made it."""
        await _insert_all(archival, [f"Invoice {i} was paid late." for i in range(12)], tags=["t"])
        page = await archival.search("invoice paid", top_k=3, tags=["t"])
        assert page.cursor is not None
        changed: list[tuple[str, dict[str, Any]]] = [
            ("invoice unpaid", {"tags": ["t"]}),
            ("invoice paid", {}),
            ("invoice paid", {"tags": ["t"], "tag_mode": "all"}),
            ("invoice paid", {"tags": ["t"], "after": datetime(2000, 1, 1, tzinfo=UTC)}),
        ]
        for query, kwargs in changed:
            with pytest.raises(MemoryStoreError):
                await archival.search(query, top_k=3, cursor=page.cursor, **kwargs)
        with pytest.raises(MemoryStoreError):
            await archival_factory(("elsewhere",)).search(
                "invoice paid", top_k=3, tags=["t"], cursor=page.cursor
            )
        with pytest.raises(MemoryStoreError):
            await archival.list(cursor=page.cursor)
        second = await archival.search("invoice paid", top_k=3, tags=["t"], cursor=page.cursor)
        assert not set(_ids(page.hits)) & set(_ids(second.hits))

    async def test_list_pages_newest_first(self, archival: ArchivalStore) -> None:
        """``list`` pages newest first, without gaps or repeats, and binds its cursor."""
        ids = [
            await archival.insert(f"Note {i}.", tags=["even" if i % 2 else "odd"])
            for i in range(25)
        ]
        seen: list[str] = []
        cursor = None
        sizes = []
        while True:
            page = await archival.list(limit=10, cursor=cursor)
            sizes.append(len(page.hits))
            seen += _ids(page.hits)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sizes == [10, 10, 5]
        assert seen == ids[::-1]
        first = await archival.list(limit=5, tags=["odd"])
        assert first.cursor is not None
        with pytest.raises(MemoryStoreError):
            await archival.list(limit=5, tags=["even"], cursor=first.cursor)
        rest = await archival.list(limit=100, tags=["odd"], cursor=first.cursor)
        assert _ids(first.hits) + _ids(rest.hits) == ids[::-2]

    # -- update and delete ------------------------------------------------------------------

    async def test_update_is_reflected_in_search(self, archival: ArchivalStore) -> None:
        """An update re-indexes text and tags and keeps what was not changed."""
        cat = await archival.insert("A cat naps on the sofa all afternoon.", tags=["pets"])
        pid = await archival.insert("The cat sleeps on the sofa.", tags=["pets"], metadata={"v": 1})
        updated = await archival.update(
            pid, text="Quarterly tax filing deadline is in April.", tags=["finance"]
        )
        assert updated.text == "Quarterly tax filing deadline is in April."
        assert updated.tags == ("finance",)
        assert dict(updated.metadata) == {"v": 1}
        got = await archival.get(pid)
        assert got == updated
        top = await archival.search("tax filing deadline", top_k=1)
        assert _ids(top.hits) == [pid]
        pets = _ids((await archival.search("cat sleeps on the sofa", top_k=10)).hits)
        assert pets[0] == cat
        assert pid not in _ids((await archival.search("cat", tags=["pets"])).hits)
        assert pid in _ids((await archival.search("deadline", tags=["finance"])).hits)
        meta = await archival.update(pid, metadata={"v": 2})
        assert dict(meta.metadata) == {"v": 2}
        assert meta.text == updated.text
        assert meta.tags == ("finance",)
        assert meta.created_at == updated.created_at

    async def test_invalid_update_changes_nothing(self, archival: ArchivalStore) -> None:
        """A refused update leaves the passage as it was."""
        pid = await archival.insert("Original.", tags=["t"], metadata={"a": 1})
        for kwargs in ({"text": ""}, {"tags": [""]}, {"metadata": {"x": object()}}):
            with pytest.raises(MemoryStoreError):
                await archival.update(pid, **kwargs)
        with pytest.raises(MemoryStoreError):
            await archival.update("no-such-id", text="New.")
        got = await archival.get(pid)
        assert got is not None
        assert (got.text, got.tags, dict(got.metadata)) == ("Original.", ("t",), {"a": 1})

    async def test_delete_is_reflected_everywhere(self, archival: ArchivalStore) -> None:
        """A deleted passage is gone from get, list and every kind of search."""
        keep = await archival.insert("Pineapple pizza debate notes.", tags=["food"])
        gone = await archival.insert("Pineapple pizza debate notes, second copy.", tags=["food"])
        assert await archival.delete(gone) is True
        assert await archival.get(gone) is None
        assert await archival.delete(gone) is False
        assert await archival.delete("no-such-id") is False
        for tags in (None, ["food"]):
            page = await archival.search("pineapple pizza debate notes second copy", tags=tags)
            assert _ids(page.hits) == [keep]
        assert _ids((await archival.list()).hits) == [keep]
        with pytest.raises(MemoryStoreError):
            await archival.update(gone, text="Back?")

    # -- isolation and hostile input --------------------------------------------------------

    @pytest.mark.parametrize("pair", TRICKY_NAMESPACES, ids=repr)
    async def test_namespaces_are_isolated(
        self,
        archival_factory: Callable[[Namespace], ArchivalStore],
        pair: tuple[Namespace, Namespace],
    ) -> None:
        """Namespaces match exactly: no prefix, pattern or separator confusion."""
        one, two = (archival_factory(ns) for ns in pair)
        assert one.namespace == pair[0]
        assert two.namespace == pair[1]
        id1 = await one.insert("Shared words about the harbour ferry.", tags=["t"], op_key="k")
        id2 = await two.insert("Shared words about the harbour ferry.", tags=["t"], op_key="k")
        assert id1 != id2
        for store, own, other in ((one, id1, id2), (two, id2, id1)):
            assert _ids((await store.search("harbour ferry")).hits) == [own]
            assert _ids((await store.search("harbour ferry", tags=["t"])).hits) == [own]
            assert _ids((await store.list()).hits) == [own]
            assert await store.get(other) is None
            assert await store.delete(other) is False
            with pytest.raises(MemoryStoreError):
                await store.update(other, text="Hijacked.")
        assert await one.get(id1) is not None
        assert await two.get(id2) is not None

    @pytest.mark.parametrize("namespace", [("",), ("a", ""), ("ok", 3), ["list"], "str"], ids=repr)
    async def test_invalid_namespaces_are_refused(
        self, archival_factory: Callable[[Namespace], ArchivalStore], namespace: Any
    ) -> None:
        """A namespace must be a tuple of non-empty strings."""
        with pytest.raises(MemoryStoreError):
            archival_factory(namespace)

    async def test_hostile_strings_are_plain_text(
        self, archival_factory: Callable[[Namespace], ArchivalStore]
    ) -> None:
        """SQL and FTS syntax in text, tags and queries is data: no error, no leak."""
        mine = archival_factory(("hostile", "mine"))
        theirs = archival_factory(("hostile", "theirs"))
        own: dict[str, str] = {}
        for s in HOSTILE_STRINGS:
            text = f"{s} marker text {s}"
            own[await mine.insert(text, tags=[s], metadata={s: s})] = s
            await theirs.insert(text, tags=[s], metadata={s: s})
        for pid, s in own.items():
            got = await mine.get(pid)
            assert got is not None
            assert got.text == f"{s} marker text {s}"
            assert got.tags == (s,)
            assert dict(got.metadata) == {s: s}
        for s in HOSTILE_STRINGS:
            for kw in ({}, {"tags": [s]}, {"tags": [s, "x"], "tag_mode": "all"}):
                page = await mine.search(s, **kw)
                assert set(_ids(page.hits)) <= set(own), f"search {s!r} leaked another namespace"
            tagged = await mine.search("marker text", tags=[s], top_k=50)
            assert [own[i] for i in _ids(tagged.hits)] == [s]
            assert [own[i] for i in _ids((await mine.list(tags=[s])).hits)] == [s]
            assert await mine.get(s) is None
        assert len((await mine.list(limit=1000)).hits) == len(HOSTILE_STRINGS)
        assert len((await theirs.list(limit=1000)).hits) == len(HOSTILE_STRINGS)

    # -- concurrency and quality ------------------------------------------------------------

    async def test_concurrent_inserts(self, archival: ArchivalStore) -> None:
        """Fifty concurrent inserts all land, with distinct ids."""
        ids = await asyncio.gather(
            *(archival.insert(f"Concurrent note {i}.", tags=[f"t{i % 3}"]) for i in range(50))
        )
        assert len(set(ids)) == 50
        listed = await archival.list(limit=100)
        assert set(_ids(listed.hits)) == set(ids)
        page = await archival.search("concurrent note", tags=["t1"], top_k=100)
        assert len(page.hits) == 17

    async def test_recall_at_5_on_shared_eval_set(self, archival: ArchivalStore) -> None:
        """recall@5 >= 0.7 on the shared paraphrase eval set (default embedder)."""
        if not EVAL_PATH.exists():
            pytest.skip(f"the shared eval set is not at {EVAL_PATH}")
        pairs = load_eval()
        ids = await _insert_all(archival, [p for p, _ in pairs])
        await _insert_all(archival, distractors(100))
        found = 0
        for pid, (_, query) in zip(ids, pairs, strict=True):
            page = await archival.search(query, top_k=5)
            assert len(page.hits) <= 5
            found += pid in _ids(page.hits)
        recall = found / len(pairs)
        assert recall >= 0.7, f"recall@5 = {recall:.3f} on {EVAL_PATH.name}"


def timezone_shifted(moment: datetime, *, hours: int) -> datetime:
    """The same instant expressed in another UTC offset."""
    return moment.astimezone(timezone(timedelta(hours=hours)))
