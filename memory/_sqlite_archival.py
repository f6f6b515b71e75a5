"""The SQLite archival store: passages found by meaning and keywords, in one file.

Search is hybrid. Two candidate lists are built with every filter (namespace, tags, dates)
applied inside their queries, before any limit, so a filter never hides matches:

- **vector**: cosine similarity between the query's embedding and every stored vector of the
  namespace that passes the filters, by brute force. With numpy, each process keeps the
  namespace's vectors in memory (loaded in chunks, then extended with new rows only) and checks
  a version counter that every write bumps in its own transaction, so writes made by other
  processes are seen by the next search. Without numpy, the vectors are read in chunks and
  scored in pure Python.
- **keyword**: SQLite FTS5 (``porter unicode61``) ranked by BM25, restricted to passages that
  contain at least half of the query's distinct terms. The gate keeps a passage that shares one
  incidental word with the query out of the fusion (``benchmarks/archival_eval.py`` measures
  why: fusing ungated OR rankings loses a third of the recall). It uses the query's eight most
  selective words, leaving out those in over a quarter of all passages and over 5,000 (as
  stopwords), which bounds its cost at scale. User text never reaches FTS5 syntax: the query
  is split into words and each word is quoted. Each process caches the words' passage counts
  until the next write to the file. When the namespace holds every passage of the file and no
  date filter applies, the full-text query skips the join that checks namespace and dates
  (a passage another namespace commits meanwhile may then become a candidate; the final fetch,
  which checks the namespace, drops it).

The top ``max(50, 5 * top_k)`` of each list are fused by reciprocal rank fusion (k=60). Pages
of one search are slices of that one fused ranking (the cursor carries its depth and offset).

This module holds the store. Its schema, statements, filters, keyword terms and insert body
are in :mod:`memory._sqlite_passages`; what it shares with the PostgreSQL store is in
:mod:`memory._archival_common` (validation, cursors, values) and :mod:`memory._vectors`
(vector caching and scoring).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from checkpointers._sqlite_db import SqliteDatabase, fetch
from graphexec.errors import MemoryStoreError
from memory._archival_common import (
    DEPTH_FACTOR,
    MAX_TOP_K,
    MIN_DEPTH,
    RRF_K,
    NamespaceState,
    NewPassage,
    PassageRow,
    Seqs,
    check_embedder,
    check_limit,
    check_metadata,
    check_namespace,
    check_passage,
    check_str,
    check_tags,
    check_time,
    cursor_digest,
    decode_cursor,
    encode_cursor,
    passage_of,
    state_of,
)
from memory._base import ArchivalHit, ArchivalStore, Passage, SearchPage
from memory._sqlite_passages import (
    BUMP,
    BY_ID,
    BY_SEQS,
    COVERAGE,
    INSERT_TAG,
    KEYWORD,
    KEYWORD_WHOLE_FILE,
    LIST,
    LIST_AFTER_CURSOR,
    LIST_TAGS,
    MIGRATIONS,
    MIN_COVERAGE,
    SEARCH_STATE,
    STATE,
    TAGS_ALL,
    TAGS_ALL_FTS,
    TAGS_ANY,
    TAGS_ANY_FTS,
    TERM_COUNTS,
    VECTORS,
    VERSION_TABLE,
    Filters,
    fts_terms,
    insert_rows,
    select_terms,
)
from memory._text import rrf
from memory._vectors import (
    PARALLEL_ROWS,
    VectorCache,
    load_vector_cache,
    np,
    scan_vectors,
    top_vectors,
)
from memory.embedders import Embedder, HashingEmbedder, to_bytes

__all__ = ["SqliteArchivalStore"]

_VECTORS_ALL = VECTORS.format(filters="")


# -- the store -------------------------------------------------------------------------------


class _Shared:
    """What every namespace view of one store shares: the database, embedder and caches."""

    def __init__(self, db: SqliteDatabase, embedder: Embedder) -> None:
        self.db = db
        self.embedder = embedder
        self.caches: dict[int, VectorCache] = {}
        # Passages matching each full-text term, valid while the file's write counter is
        # ``term_counts_version`` (any write anywhere in the file changes it).
        self.term_counts: dict[str, int] = {}
        self.term_counts_version = -1


class SqliteArchivalStore(ArchivalStore):
    """Archival passages in SQLite: hybrid vector + FTS5 search with filters inside the query.

    One store serves one exact-match namespace; :meth:`for_namespace` gives a view of another
    namespace over the same database and connections (tenant scoping). Use it as an async
    context manager, or call :meth:`setup` (optional: the schema is created on first use) and
    :meth:`aclose`::

        async with SqliteArchivalStore.open("memory.db", namespace=("user", "42")) as archive:
            pid = await archive.insert("Prefers window seats.", tags=["travel"])
            page = await archive.search("which seat does she like", top_k=5)

    A namespace's vectors all come from one embedder (its :attr:`Embedder.name` and dim are
    stored with them): writing or searching with another raises
    :class:`~graphexec.errors.MemoryStoreError`; :meth:`reembed` converts a namespace.

    Memory: with numpy, a search keeps the namespace's vectors in process memory (4 bytes per
    dimension per passage, about 150 MB for 100k passages of 384 dimensions), refreshed
    incrementally after inserts and reloaded after an update or delete.

    Args:
        path: The database file (created if missing; may be shared with other graphexec
            stores), or ``None`` for a private in-memory database, gone on close.
        namespace: This store's namespace: a tuple of non-empty strings, matched exactly.
        embedder: Turns texts into vectors; default :class:`~memory.embedders.HashingEmbedder`.

    Raises:
        MemoryStoreError: When the namespace is not a tuple of non-empty strings.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        namespace: tuple[str, ...] = (),
        embedder: Embedder | None = None,
    ) -> None:
        namespace = check_namespace(namespace)
        database = ":memory:" if path is None else path
        db = SqliteDatabase(
            database,
            owner=f"{type(self).__name__}({os.fspath(database)!r})",
            migrations=MIGRATIONS,
            version_table=VERSION_TABLE,
        )
        self._init(_Shared(db, embedder if embedder is not None else HashingEmbedder()), namespace)

    def _init(self, shared: _Shared, namespace: object) -> None:
        self.namespace = check_namespace(namespace)
        self._ns = json.dumps(list(self.namespace), ensure_ascii=False, separators=(",", ":"))
        self._shared = shared

    def for_namespace(self, namespace: tuple[str, ...]) -> SqliteArchivalStore:
        """A store for another namespace on the same database, embedder and connections.

        Closing any view closes the database for all of them.

        Args:
            namespace: The namespace, matched exactly (``("a", "b")`` is not ``("a|b",)``,
                and ``("foo",)`` sees nothing of ``("foobar",)``).

        Returns:
            The view.

        Raises:
            MemoryStoreError: When the namespace is not a tuple of non-empty strings.
        """
        view = object.__new__(type(self))
        view._init(self._shared, namespace)
        return view

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        path: str | os.PathLike[str] | None,
        *,
        namespace: tuple[str, ...] = (),
        embedder: Embedder | None = None,
    ) -> AsyncIterator[Self]:
        """Open (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor.
        """
        store = cls(path, namespace=namespace, embedder=embedder)
        try:
            await store.setup()
            yield store
        finally:
            await store.aclose()

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._shared.db.where!r}, namespace={self.namespace!r})"

    @property
    def path(self) -> Path | None:
        """The database file, or ``None`` for an in-memory database."""
        db = self._shared.db
        return None if db.memory else Path(db.where)

    @property
    def embedder(self) -> Embedder:
        """The embedder that vectors are computed with."""
        return self._shared.embedder

    async def setup(self) -> None:
        """Open this event loop's connections and create or migrate the schema. Idempotent.

        Raises:
            StorageError: The file cannot be opened, or it was written by a newer graphexec.
        """
        await self._shared.db.open()

    async def aclose(self) -> None:
        """Close the database (for every namespace view); the store cannot be used afterwards."""
        self._shared.caches.clear()
        await self._shared.db.aclose()

    # -- writes -----------------------------------------------------------------------------

    async def _embed(self, texts: Sequence[str]) -> list[bytes]:
        embedder = self._shared.embedder
        vectors = await asyncio.to_thread(embedder.embed, list(texts))
        if len(vectors) != len(texts) or any(len(v) != embedder.dim for v in vectors):
            raise MemoryStoreError(
                f"embedder {embedder.name!r} returned {len(vectors)} vectors for {len(texts)} "
                f"texts, or vectors whose length is not its dim ({embedder.dim})"
            )
        return [to_bytes(v) for v in vectors]

    async def _known_op_key(self, op_key: str) -> str | None:
        rows = await self._shared.db.read(
            "archival insert",
            """SELECT k.passage_id FROM archival_op_keys AS k
            JOIN archival_namespaces AS n ON n.nsid = k.nsid
            WHERE n.ns = :ns AND k.op_key = :op_key""",
            {"ns": self._ns, "op_key": op_key},
        )
        return str(rows[0][0]) if rows else None

    async def _write_rows(self, rows: Sequence[PassageRow], vectors: Sequence[bytes]) -> list[str]:
        embedder = self._shared.embedder
        body = functools.partial(
            insert_rows,
            ns=self._ns,
            namespace=self.namespace,
            embedder=embedder.name,
            dim=embedder.dim,
            rows=[*zip(rows, vectors, strict=True)],
        )
        return await self._shared.db.write("archival insert", body)

    async def insert(
        self,
        text: str,
        *,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        op_key: str | None = None,
    ) -> str:
        """Store a passage and return its id (a UUID string).

        The text is embedded in a worker thread, then the passage, its tags, its full-text
        entry and the op key are written in one transaction.

        Args:
            text: The passage (not blank).
            tags: Non-empty strings; duplicates are dropped, order is kept.
            metadata: JSON-compatible mapping (stored as JSON; tuples come back as lists).
            op_key: Idempotency key, unique within the namespace: a repeat returns the first
                insert's id and writes nothing (even if that passage was deleted since).

        Returns:
            The passage id.

        Raises:
            MemoryStoreError: Invalid input (nothing is written), or the namespace holds
                vectors of another embedder.
        """
        row = check_passage(NewPassage(text, tags=tags, metadata=metadata, op_key=op_key))
        if row.op_key is not None:
            known = await self._known_op_key(row.op_key)
            if known is not None:
                return known
        [pid] = await self._write_rows([row], await self._embed([row.text]))
        return pid

    async def insert_many(
        self, passages: Iterable[str | NewPassage], *, batch_size: int = 512
    ) -> list[str]:
        """Bulk insert: one embedding call and one transaction per batch.

        Every item is validated before anything is written. Batches commit one by one, so a
        failure part-way leaves the earlier batches stored; give items op keys to make a retry
        safe.

        Args:
            passages: Texts, or :class:`NewPassage` items with tags, metadata and op keys.
            batch_size: Passages per transaction.

        Returns:
            The ids, in input order (the first id for a repeated op key).

        Raises:
            MemoryStoreError: Invalid input, or the namespace holds another embedder's vectors.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemoryStoreError(f"batch_size must be a positive int, got {batch_size!r}")
        rows = [check_passage(p) for p in passages]
        ids: list[str] = []
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            ids += await self._write_rows(batch, await self._embed([r.text for r in batch]))
        return ids

    async def update(
        self,
        passage_id: str,
        *,
        text: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Passage:
        """Change a passage's text (re-embedding it), tags or metadata, in one transaction.

        Arguments left ``None`` are kept; ``tags`` and ``metadata`` replace the old values.

        Returns:
            The updated passage.

        Raises:
            MemoryStoreError: Invalid input or an unknown id (nothing is written), or a text
                change in a namespace that holds another embedder's vectors.
        """
        check_str(passage_id, "passage id")
        new_text = None if text is None else check_str(text, "passage text")
        new_tags = None if tags is None else check_tags(tags)
        new_meta = None if metadata is None else check_metadata(metadata)
        vector = None if new_text is None else (await self._embed([new_text]))[0]
        ns, namespace = self._ns, self.namespace
        embedder, dim = self._shared.embedder.name, self._shared.embedder.dim

        def body(db: sqlite3.Connection) -> Passage:
            found = fetch(
                db,
                """SELECT p.seq, p.nsid FROM archival_passages AS p JOIN archival_namespaces AS n
                ON n.nsid = p.nsid WHERE n.ns = :ns AND p.id = :id""",
                {"ns": ns, "id": passage_id},
            )
            if not found:
                raise MemoryStoreError(
                    f"archival passage {passage_id!r} does not exist in namespace {namespace!r}"
                )
            [(seq, nsid)] = found
            key = {"seq": seq, "nsid": nsid}
            if vector is not None:
                check_embedder(state_of(fetch(db, STATE, {"ns": ns})), embedder, dim, namespace)
                fetch(
                    db,
                    """UPDATE archival_passages SET text = :text, vector = :vector,
                    embedder = :embedder, dim = :dim WHERE seq = :seq""",
                    {**key, "text": new_text, "vector": vector, "embedder": embedder, "dim": dim},
                )
            if new_meta is not None:
                fetch(
                    db,
                    "UPDATE archival_passages SET metadata = :metadata WHERE seq = :seq",
                    {**key, "metadata": new_meta},
                )
            if new_tags is not None:
                fetch(db, "DELETE FROM archival_tags WHERE passage = :seq", key)
                db.executemany(INSERT_TAG, [(nsid, t, seq, i) for i, t in enumerate(new_tags)])
            changed = int(vector is not None)
            fetch(
                db,
                BUMP,
                {**key, "added": 0, "vectors_changed": changed, "embedder": None, "dim": None},
            )
            [row] = fetch(db, BY_SEQS, {"nsid": nsid, "seqs": json.dumps([seq])})
            return passage_of(row)

        return await self._shared.db.write("archival update", body)

    async def delete(self, passage_id: str) -> bool:
        """Delete a passage with its tags, full-text entry and vector. Whether it existed."""
        check_str(passage_id, "passage id", blank_ok=True)
        ns = self._ns

        def body(db: sqlite3.Connection) -> bool:
            gone = fetch(
                db,
                """DELETE FROM archival_passages WHERE id = :id
                AND nsid = (SELECT nsid FROM archival_namespaces WHERE ns = :ns)
                RETURNING seq, nsid""",
                {"ns": ns, "id": passage_id},
            )
            if not gone:
                return False
            [(seq, nsid)] = gone
            fetch(db, "DELETE FROM archival_tags WHERE passage = :seq", {"seq": seq})
            fetch(
                db,
                BUMP,
                {"nsid": nsid, "added": -1, "vectors_changed": 1, "embedder": None, "dim": None},
            )
            return True

        return await self._shared.db.write("archival delete", body)

    async def reembed(self, *, batch_size: int = 256) -> int:
        """Recompute every vector of this namespace with this store's embedder.

        Developer tool for switching models: afterwards the namespace belongs to this store's
        embedder (stores using the old one are refused). It runs in batches, one transaction
        each; searches meanwhile use the vectors already converted, and an interrupted run can
        simply be repeated.

        Args:
            batch_size: Passages embedded and written per transaction.

        Returns:
            How many passages were re-embedded.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemoryStoreError(f"batch_size must be a positive int, got {batch_size!r}")
        ns = self._ns
        embedder, dim = self._shared.embedder.name, self._shared.embedder.dim

        def claim(db: sqlite3.Connection) -> int | None:
            state = state_of(fetch(db, STATE, {"ns": ns}))
            if state is None:
                return None
            fetch(
                db,
                BUMP,
                {
                    "nsid": state.nsid,
                    "added": 0,
                    "vectors_changed": 1,
                    "embedder": embedder,
                    "dim": dim,
                },
            )
            return state.nsid

        nsid = await self._shared.db.write("archival reembed", claim)
        if nsid is None:
            return 0
        done = 0
        while True:
            stale = await self._shared.db.read(
                "archival reembed",
                """SELECT seq, text FROM archival_passages WHERE nsid = :nsid
                AND (embedder != :embedder OR dim != :dim) ORDER BY seq LIMIT :limit""",
                {"nsid": nsid, "embedder": embedder, "dim": dim, "limit": batch_size},
            )
            if not stale:
                return done
            vectors = await self._embed([text for _, text in stale])
            updates = [
                {"seq": seq, "text": text, "vector": v, "embedder": embedder, "dim": dim}
                for (seq, text), v in zip(stale, vectors, strict=True)
            ]

            def write(db: sqlite3.Connection, updates: list[dict[str, Any]] = updates) -> int:
                db.executemany(
                    """UPDATE archival_passages SET vector = :vector, embedder = :embedder,
                    dim = :dim WHERE seq = :seq AND text = :text""",
                    updates,
                )
                fetch(
                    db,
                    BUMP,
                    {"nsid": nsid, "added": 0, "vectors_changed": 1, "embedder": None, "dim": None},
                )
                return len(updates)

            done += await self._shared.db.write("archival reembed", write)

    # -- reads ------------------------------------------------------------------------------

    async def get(self, passage_id: str) -> Passage | None:
        """A passage of this namespace by id, or ``None``."""
        check_str(passage_id, "passage id", blank_ok=True)
        rows = await self._shared.db.read("archival get", BY_ID, {"ns": self._ns, "id": passage_id})
        return passage_of(rows[0]) if rows else None

    async def list(
        self, *, tags: Sequence[str] | None = None, limit: int = 100, cursor: str | None = None
    ) -> SearchPage:
        """Passages newest first (scores are 0), ``limit`` per page.

        Args:
            tags: Only passages with at least one of these tags (``None`` or empty: all).
            limit: Page size, 1 to 1000.
            cursor: The previous page's cursor (keyset paging: stable under inserts).

        Returns:
            The page and the next page's cursor (``None`` after the last page).

        Raises:
            MemoryStoreError: Invalid arguments, or a cursor from another call.
        """
        wanted = check_tags(tags, "tags filter") if tags is not None else ()
        limit = check_limit(limit, "list limit")
        digest = cursor_digest("list", self._ns, sorted(wanted))
        filters = LIST_TAGS if wanted else ""
        params: dict[str, Any] = {"ns": self._ns, "limit": limit + 1}
        if wanted:
            params["tags"] = json.dumps(wanted)
        if cursor is not None:
            at, seq = decode_cursor(cursor, "list", digest, ("at", "s"))
            filters += LIST_AFTER_CURSOR
            params.update(at=at, seq=seq)
        rows = await self._shared.db.read("archival list", LIST.format(filters=filters), params)
        page = rows[:limit]
        next_cursor = None
        if len(rows) > limit:
            last = page[-1]
            next_cursor = encode_cursor({"k": "list", "h": digest, "at": last[4], "s": last[0]})
        return SearchPage([ArchivalHit(passage_of(r), 0.0) for r in page], next_cursor)

    async def search(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        tag_mode: Literal["any", "all"] = "any",
        top_k: int = 10,
        cursor: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> SearchPage:
        """Hybrid search (vector + FTS5, fused by RRF), best first.

        Args:
            query: Any text; nothing in it is interpreted as search syntax.
            tags: Only passages with any (``tag_mode="any"``) or all (``"all"``) of these tags;
                ``None`` or empty: no tag filter.
            tag_mode: ``"any"`` or ``"all"``.
            top_k: Hits per page, 1 to 1000.
            cursor: The previous page's cursor; only valid for the same query and filters.
            after: Only passages created strictly after this (timezone-aware) time.
            before: Only passages created strictly before this time.

        Returns:
            A page of hits with fused scores, and the next page's cursor (``None`` at the end).
            Pages are slices of one ranking: the top ``max(50, 5 * top_k)`` candidates of each
            list, ``top_k`` taken from the first page.

        Raises:
            MemoryStoreError: Invalid arguments, a cursor from another search, or a namespace
                that holds another embedder's vectors.
        """
        check_str(query, "search query", blank_ok=True)
        top_k = check_limit(top_k, "top_k")
        if tag_mode not in ("any", "all"):
            raise MemoryStoreError(f"tag_mode must be 'any' or 'all', got {tag_mode!r}")
        wanted = check_tags(tags, "tags filter") if tags is not None else ()
        filters = Filters(
            wanted or None, tag_mode, check_time(after, "after"), check_time(before, "before")
        )
        digest = cursor_digest(
            "search", self._ns, query, sorted(wanted), tag_mode, filters.after, filters.before
        )
        if cursor is None:
            offset, depth = 0, max(MIN_DEPTH, DEPTH_FACTOR * top_k)
        else:
            offset, depth = decode_cursor(cursor, "search", digest, ("o", "d"))
            if not 1 <= depth <= DEPTH_FACTOR * MAX_TOP_K:
                raise MemoryStoreError("invalid archival cursor: pass back the one a page returned")
        state = state_of(
            await self._shared.db.read("archival search", SEARCH_STATE, {"ns": self._ns})
        )
        embedder = self._shared.embedder
        check_embedder(state, embedder.name, embedder.dim, self.namespace)
        if state is None or state.passages <= 0:
            return SearchPage()
        by_vector, by_keyword = await asyncio.gather(
            self._vector_candidates(query, state, filters, depth),
            self._keyword_candidates(query, state, filters, depth),
        )
        fused = rrf([by_vector, by_keyword], k=RRF_K)
        page = fused[offset : offset + top_k]
        rows = await self._shared.db.read(
            "archival search",
            BY_SEQS,
            {"nsid": state.nsid, "seqs": json.dumps([seq for seq, _ in page])},
        )
        found = {r[0]: passage_of(r) for r in rows}
        hits = [ArchivalHit(found[seq], score) for seq, score in page if seq in found]
        end = offset + top_k
        next_cursor = (
            encode_cursor({"k": "search", "h": digest, "o": end, "d": depth})
            if end < len(fused)
            else None
        )
        return SearchPage(hits, next_cursor)

    async def _term_counts(self, terms: Sequence[str], file_version: int) -> Seqs:
        """Passages (in the whole file) matching each term, cached until the file changes."""
        shared = self._shared
        if shared.term_counts_version != file_version or len(shared.term_counts) > 50_000:
            shared.term_counts = {}
            shared.term_counts_version = file_version
        cache = shared.term_counts
        missing = [t for t in dict.fromkeys(terms) if t not in cache]
        if missing:
            rows = await shared.db.read(
                "archival search", TERM_COUNTS, {"terms": json.dumps(missing)}
            )
            counted = {str(term): int(count) for term, count in rows}
            if shared.term_counts_version == file_version:  # not reset meanwhile
                cache.update(counted)
            return [cache.get(t, counted.get(t, 0)) for t in terms]
        return [cache[t] for t in terms]

    async def _keyword_candidates(
        self, query: str, state: NamespaceState, filters: Filters, depth: int
    ) -> Seqs:
        candidates = fts_terms(query)
        if not candidates:
            return []
        counts = await self._term_counts(candidates, state.file_version)
        terms = select_terms(candidates, counts, max(state.file_passages, 0))
        if not terms:
            return []
        need = math.ceil(len(terms) * MIN_COVERAGE)
        coverage = COVERAGE if need > 1 else ""
        whole_file = (
            state.file_passages == state.passages
            and filters.after is None
            and filters.before is None
        )
        if whole_file:
            tags = ""
            if filters.tags:
                tags = TAGS_ALL_FTS if filters.tag_mode == "all" else TAGS_ANY_FTS
            sql = KEYWORD_WHOLE_FILE.format(filters=tags + coverage)
        else:
            sql = KEYWORD.format(filters=filters.sql() + coverage)
        params = {
            **filters.params(state.nsid),
            "match": " OR ".join(terms),
            "terms": json.dumps(terms),
            "need": need,
            "depth": depth,
        }
        rows = await self._shared.db.read("archival search", sql, params)
        return [int(r[0]) for r in rows]

    async def _vector_candidates(
        self, query: str, state: NamespaceState, filters: Filters, depth: int
    ) -> Seqs:
        if not query.strip():
            return []
        embedder = self._shared.embedder
        [qvec] = await asyncio.to_thread(embedder.embed, [query])
        if np is None:
            return await self._scan_vectors(qvec, state, filters, depth)
        cache = await self._cache(state)
        allowed: Seqs | None = None
        if filters.tags:
            rows = await self._shared.db.read(
                "archival search",
                TAGS_ALL if filters.tag_mode == "all" else TAGS_ANY,
                {
                    "nsid": state.nsid,
                    "tags": json.dumps(filters.tags),
                    "ntags": len(filters.tags),
                },
            )
            allowed = [int(r[0]) for r in rows]
        snapshot = cache.snapshot()
        args: dict[str, Any] = {
            "allowed": allowed,
            "after": filters.after,
            "before": filters.before,
            "depth": depth,
        }
        if len(snapshot[1]) >= PARALLEL_ROWS and (allowed is None or len(allowed) > 1000):
            return await asyncio.to_thread(lambda: top_vectors(snapshot, qvec, **args))
        return top_vectors(snapshot, qvec, **args)

    async def _cache(self, state: NamespaceState) -> VectorCache:
        """This namespace's vector cache, brought up to ``state`` (loading what is missing)."""
        db = self._shared.db
        return await load_vector_cache(
            self._shared.caches,
            self._shared.embedder,
            state,
            lambda params: db.read("archival search", _VECTORS_ALL, params),
        )

    async def _scan_vectors(
        self, qvec: Sequence[float], state: NamespaceState, filters: Filters, depth: int
    ) -> Seqs:
        """Pure-Python vector candidates: read the filtered vectors in chunks and score them."""
        db = self._shared.db
        sql = VECTORS.format(filters=filters.sql())
        return await scan_vectors(
            lambda params: db.read("archival search", sql, params),
            filters.params(state.nsid),
            self._shared.embedder,
            qvec,
            depth,
        )
