"""The PostgreSQL archival store: passages found by meaning and keywords.

Search is hybrid, like the SQLite store (:mod:`memory._sqlite_archival`). Two candidate lists
are built with every filter (namespace, tags, dates) applied inside their queries, before any
limit:

- **keyword**: PostgreSQL full text. Each passage has a generated ``english`` ``tsvector``
  (GIN-indexed); the query's distinct content words (letters and digits only, stopwords
  dropped) are joined with ``or`` and passed as a parameter to ``websearch_to_tsquery``, each
  word also to ``plainto_tsquery`` for the coverage gate: a candidate must hold at least half
  of the query's terms. Ranked by ``ts_rank`` (length-normalised).
- **vector**: cosine similarity between the query's embedding and every stored vector of the
  namespace that passes the filters. Vectors are float32 ``bytea`` (pgvector is not needed).
  With numpy, each process keeps a namespace's vectors in memory and refreshes them from a
  per-namespace version counter that every write bumps in its own transaction (writers lock
  the namespace row first, so passages commit in ``seq`` order and a refresh that reads rows
  past the last seen ``seq`` misses none). Without numpy, vectors are read in chunks, filtered
  in SQL, and scored in pure Python.

The top ``max(50, 5 * top_k)`` of each list are fused by reciprocal rank fusion (k=60); pages
are slices of that one fused ranking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

from checkpointers._pg_db import PostgresDatabase
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
from memory._pg_common import Conn, no_nul, open_database
from memory._pg_passages import (
    BUMP,
    BY_ID,
    BY_SEQS,
    INSERT_TAGS,
    KEYWORD,
    LIST,
    LIST_AFTER_CURSOR,
    LIST_TAGS,
    LOCK_STATE,
    STATE,
    TAGS_ALL,
    TAGS_ANY,
    VECTORS,
    Filters,
    insert_rows,
    keyword_terms,
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

__all__ = ["PostgresArchivalStore"]

_VECTORS_ALL = VECTORS.format(filters="")


class _Shared:
    """What every namespace view of one store shares: the database, embedder and caches."""

    def __init__(self, db: PostgresDatabase, embedder: Embedder, *, owns: bool) -> None:
        self.db = db
        self.embedder = embedder
        self.owns = owns
        self.caches: dict[int, VectorCache] = {}


class PostgresArchivalStore(ArchivalStore):
    """Archival passages in PostgreSQL: hybrid vector + full-text search, filters in the query.

    One store serves one exact-match namespace; :meth:`for_namespace` gives a view of another
    namespace over the same pool (tenant scoping)::

        async with PostgresArchivalStore.open(dsn, namespace=("user", "42")) as archive:
            pid = await archive.insert("Prefers window seats.", tags=["travel"])
            page = await archive.search("which seat does she like", top_k=5)

    A namespace's vectors all come from one embedder (its name and dim are stored with them):
    writing or searching with another raises :class:`~graphexec.errors.MemoryStoreError`;
    :meth:`reembed` converts a namespace.

    Args:
        dsn: A libpq connection string or URI.
        namespace: This store's namespace: a tuple of non-empty strings, matched exactly.
        embedder: Turns texts into vectors; default :class:`~memory.embedders.HashingEmbedder`.
        schema: The schema holding the memory tables (created if missing).
    """

    def __init__(
        self,
        dsn: str,
        *,
        namespace: tuple[str, ...] = (),
        embedder: Embedder | None = None,
        schema: str | None = None,
    ) -> None:
        namespace = check_namespace(namespace)
        db = open_database(dsn, owner=type(self).__name__, schema=schema)
        chosen = embedder if embedder is not None else HashingEmbedder()
        self._init(_Shared(db, chosen, owns=True), namespace)

    @classmethod
    def _attach(
        cls, db: PostgresDatabase, *, namespace: tuple[str, ...], embedder: Embedder | None
    ) -> Self:
        store = cls.__new__(cls)
        chosen = embedder if embedder is not None else HashingEmbedder()
        store._init(_Shared(db, chosen, owns=False), namespace)
        return store

    def _init(self, shared: _Shared, namespace: object) -> None:
        self.namespace = check_namespace(namespace)
        for part in self.namespace:
            no_nul(part, f"archival namespace {self.namespace!r}")
        self._ns = json.dumps(list(self.namespace), ensure_ascii=False, separators=(",", ":"))
        self._shared = shared

    def for_namespace(self, namespace: tuple[str, ...]) -> PostgresArchivalStore:
        """A store for another namespace on the same pool, embedder and vector caches.

        Args:
            namespace: The namespace, matched exactly (``("foo",)`` sees nothing of
                ``("foobar",)``).

        Returns:
            The view (closing any view closes the pool for all of them, when they own it).

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
        dsn: str,
        *,
        namespace: tuple[str, ...] = (),
        embedder: Embedder | None = None,
        schema: str | None = None,
    ) -> AsyncIterator[Self]:
        """Open (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor.
        """
        store = cls(dsn, namespace=namespace, embedder=embedder, schema=schema)
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
    def embedder(self) -> Embedder:
        """The embedder that vectors are computed with."""
        return self._shared.embedder

    async def setup(self) -> None:
        """Open this event loop's pool and create or migrate the schema. Idempotent.

        Raises:
            StorageError: The server cannot be reached, or a newer graphexec wrote the schema.
        """
        await self._shared.db.open()

    async def aclose(self) -> None:
        """Drop the vector caches and close the pool (unless a PostgresMemory lent it)."""
        self._shared.caches.clear()
        if self._shared.owns:
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

    def _checked(self, passage: NewPassage | str) -> PassageRow:
        row = check_passage(passage)
        no_nul(row.text, "archival passage text")
        for tag in row.tags:
            no_nul(tag, "archival tag")
        if row.op_key is not None:
            no_nul(row.op_key, "archival op_key")
        return row

    async def _write_rows(self, rows: Sequence[PassageRow], vectors: Sequence[bytes]) -> list[str]:
        embedder = self._shared.embedder
        pairs = [*zip(rows, vectors, strict=True)]

        async def body(s: Conn) -> list[str]:
            return await insert_rows(
                s,
                ns=self._ns,
                namespace=self.namespace,
                embedder=embedder.name,
                dim=embedder.dim,
                rows=pairs,
            )

        return await self._shared.db.transaction(
            f"archival insert in namespace {self.namespace!r}", body
        )

    async def insert(
        self,
        text: str,
        *,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        op_key: str | None = None,
    ) -> str:
        """Store a passage and return its id (a UUID string).

        The text is embedded in a worker thread, then the passage, its tags and the op key
        are written in one transaction.

        Args:
            text: The passage (not blank, no NUL character).
            tags: Non-empty strings; duplicates are dropped, order is kept.
            metadata: JSON-compatible mapping (stored as JSON text).
            op_key: Idempotency key, unique within the namespace: a repeat returns the first
                insert's id and writes nothing (even if that passage was deleted since).

        Returns:
            The passage id.

        Raises:
            MemoryStoreError: Invalid input (nothing is written), or the namespace holds
                vectors of another embedder.
        """
        row = self._checked(NewPassage(text, tags=tags, metadata=metadata, op_key=op_key))
        if row.op_key is not None:
            known = await self._shared.db.fetch(
                "archival insert",
                """SELECT k.passage_id FROM graphexec_mem_archival_ops AS k
                JOIN graphexec_mem_archival_ns AS n ON n.nsid = k.nsid
                WHERE n.ns = :ns AND k.op_key = :op_key""",
                {"ns": self._ns, "op_key": row.op_key},
            )
            if known:
                return str(known[0][0])
        [pid] = await self._write_rows([row], await self._embed([row.text]))
        return pid

    async def insert_many(
        self, passages: Iterable[str | NewPassage], *, batch_size: int = 512
    ) -> list[str]:
        """Bulk insert: one embedding call and one transaction (three statements) per batch.

        Every item is validated before anything is written. Batches commit one by one; give
        items op keys to make a retry safe.

        Args:
            passages: Texts, or :class:`~memory.NewPassage` items.
            batch_size: Passages per transaction.

        Returns:
            The ids, in input order (the first id for a repeated op key).

        Raises:
            MemoryStoreError: Invalid input, or the namespace holds another embedder's vectors.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemoryStoreError(f"batch_size must be a positive int, got {batch_size!r}")
        rows = [self._checked(p) for p in passages]
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

        Raises:
            MemoryStoreError: Invalid input or an unknown id (nothing is written), or a text
                change in a namespace that holds another embedder's vectors.
        """
        check_str(passage_id, "passage id")
        no_nul(passage_id, "archival passage id")
        new_text = None if text is None else no_nul(check_str(text, "passage text"), "text")
        new_tags = None if tags is None else check_tags(tags)
        for tag in new_tags or ():
            no_nul(tag, "archival tag")
        new_meta = None if metadata is None else check_metadata(metadata)
        vector = None if new_text is None else (await self._embed([new_text]))[0]
        ns, namespace = self._ns, self.namespace
        embedder, dim = self._shared.embedder.name, self._shared.embedder.dim

        async def body(s: Conn) -> Passage:
            state = state_of(await s.fetch(LOCK_STATE, {"ns": ns}))
            found = (
                await s.fetch(
                    "SELECT seq FROM graphexec_mem_passages WHERE nsid = :nsid AND id = :id",
                    {"nsid": state.nsid, "id": passage_id},
                )
                if state is not None
                else []
            )
            if state is None or not found:
                raise MemoryStoreError(
                    f"archival passage {passage_id!r} does not exist in namespace {namespace!r}"
                )
            key = {"seq": found[0][0], "nsid": state.nsid}
            if vector is not None:
                check_embedder(state, embedder, dim, namespace)
                await s.fetch(
                    """UPDATE graphexec_mem_passages SET text = :text, vector = :vector,
                    embedder = :embedder, dim = :dim WHERE seq = :seq""",
                    {**key, "text": new_text, "vector": vector, "embedder": embedder, "dim": dim},
                )
            if new_meta is not None:
                await s.fetch(
                    "UPDATE graphexec_mem_passages SET metadata = :metadata WHERE seq = :seq",
                    {**key, "metadata": new_meta},
                )
            if new_tags is not None:
                await s.fetch("DELETE FROM graphexec_mem_passage_tags WHERE passage = :seq", key)
                if new_tags:
                    await s.fetch(
                        INSERT_TAGS,
                        {
                            "nsid": state.nsid,
                            "tags": list(new_tags),
                            "passages": [key["seq"]] * len(new_tags),
                            "positions": list(range(len(new_tags))),
                        },
                    )
            changed = int(vector is not None)
            await s.fetch(
                BUMP,
                {**key, "added": 0, "vectors_changed": changed, "embedder": None, "dim": None},
            )
            [row] = await s.fetch(BY_SEQS, {"nsid": state.nsid, "seqs": [key["seq"]]})
            return passage_of(row)

        return await self._shared.db.transaction(
            f"archival update of {passage_id!r} in {namespace!r}", body
        )

    async def delete(self, passage_id: str) -> bool:
        """Delete a passage with its tags and vector. Whether it existed."""
        check_str(passage_id, "passage id", blank_ok=True)
        no_nul(passage_id, "archival passage id")
        ns = self._ns

        async def body(s: Conn) -> bool:
            state = state_of(await s.fetch(LOCK_STATE, {"ns": ns}))
            if state is None:
                return False
            gone = await s.fetch(
                "DELETE FROM graphexec_mem_passages WHERE nsid = :nsid AND id = :id RETURNING seq",
                {"nsid": state.nsid, "id": passage_id},
            )
            if not gone:
                return False
            await s.fetch(
                BUMP,
                {
                    "nsid": state.nsid,
                    "added": -1,
                    "vectors_changed": 1,
                    "embedder": None,
                    "dim": None,
                },
            )
            return True

        return await self._shared.db.transaction(
            f"archival delete of {passage_id!r} in {self.namespace!r}", body
        )

    async def reembed(self, *, batch_size: int = 256) -> int:
        """Recompute every vector of this namespace with this store's embedder.

        Developer tool for switching models: afterwards the namespace belongs to this store's
        embedder. It runs in batches, one transaction each; an interrupted run can be repeated.

        Args:
            batch_size: Passages embedded and written per transaction.

        Returns:
            How many passages were re-embedded.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise MemoryStoreError(f"batch_size must be a positive int, got {batch_size!r}")
        ns = self._ns
        embedder, dim = self._shared.embedder.name, self._shared.embedder.dim
        bump = {"added": 0, "vectors_changed": 1, "embedder": embedder, "dim": dim}

        async def claim(s: Conn) -> int | None:
            state = state_of(await s.fetch(LOCK_STATE, {"ns": ns}))
            if state is None:
                return None
            await s.fetch(BUMP, {**bump, "nsid": state.nsid})
            return state.nsid

        nsid = await self._shared.db.transaction("archival reembed", claim)
        if nsid is None:
            return 0
        done = 0
        while True:
            stale = await self._shared.db.fetch(
                "archival reembed",
                """SELECT seq, text FROM graphexec_mem_passages WHERE nsid = :nsid
                AND (embedder <> :embedder OR dim <> :dim) ORDER BY seq LIMIT :limit""",
                {"nsid": nsid, "embedder": embedder, "dim": dim, "limit": batch_size},
            )
            if not stale:
                return done
            vectors = await self._embed([text for _, text in stale])
            updates = [
                {"seq": seq, "text": text, "vector": v, "embedder": embedder, "dim": dim}
                for (seq, text), v in zip(stale, vectors, strict=True)
            ]

            async def write(s: Conn, updates: list[dict[str, Any]] = updates) -> int:
                await s.fetch(LOCK_STATE, {"ns": ns})
                await s.execute_many(
                    """UPDATE graphexec_mem_passages SET vector = :vector, embedder = :embedder,
                    dim = :dim WHERE seq = :seq AND text = :text""",
                    updates,
                )
                await s.fetch(
                    BUMP,
                    {**bump, "nsid": nsid, "embedder": None, "dim": None},
                )
                return len(updates)

            done += await self._shared.db.transaction("archival reembed", write)

    # -- reads ------------------------------------------------------------------------------

    async def get(self, passage_id: str) -> Passage | None:
        """A passage of this namespace by id, or ``None``."""
        check_str(passage_id, "passage id", blank_ok=True)
        if "\x00" in passage_id:
            return None
        rows = await self._shared.db.fetch(
            "archival get", BY_ID, {"ns": self._ns, "id": passage_id}
        )
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
        params: dict[str, Any] = {"ns": self._ns, "limit": limit + 1}
        if wanted:
            params["tags"] = list(wanted)
        if cursor is not None:
            at, seq = decode_cursor(cursor, "list", digest, ("at", "s"))
            params.update(at=at, seq=seq)
        sql = LIST.format(
            filters=(LIST_TAGS if wanted else "")
            + (LIST_AFTER_CURSOR if cursor is not None else "")
        )
        rows = await self._shared.db.fetch("archival list", sql, params)
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
        """Hybrid search (vector + full text, fused by RRF), best first.

        Args:
            query: Any text; nothing in it is interpreted as search syntax.
            tags: Only passages with any (``tag_mode="any"``) or all (``"all"``) of these tags.
            tag_mode: ``"any"`` or ``"all"``.
            top_k: Hits per page, 1 to 1000.
            cursor: The previous page's cursor; only valid for the same query and filters.
            after: Only passages created strictly after this (timezone-aware) time.
            before: Only passages created strictly before this time.

        Returns:
            A page of hits with fused scores, and the next page's cursor (``None`` at the end).

        Raises:
            MemoryStoreError: Invalid arguments, a cursor from another search, or a namespace
                that holds another embedder's vectors.
        """
        check_str(query, "search query", blank_ok=True)
        query = query.replace("\x00", " ")
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
        if any("\x00" in tag for tag in wanted):
            return SearchPage()  # no stored tag can hold a NUL
        db = self._shared.db
        state = state_of(await db.fetch("archival search", STATE, {"ns": self._ns}))
        embedder = self._shared.embedder
        check_embedder(state, embedder.name, embedder.dim, self.namespace)
        if state is None or state.passages <= 0:
            return SearchPage()
        by_vector, by_keyword = await asyncio.gather(
            self._vector_candidates(query, state, filters, depth),
            self._keyword_candidates(query, state.nsid, filters, depth),
        )
        fused = rrf([by_vector, by_keyword], k=RRF_K)
        page = fused[offset : offset + top_k]
        rows = await db.fetch(
            "archival search", BY_SEQS, {"nsid": state.nsid, "seqs": [seq for seq, _ in page]}
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

    async def _keyword_candidates(
        self, query: str, nsid: int, filters: Filters, depth: int
    ) -> Seqs:
        terms = keyword_terms(query)
        if not terms:
            return []
        params = {**filters.params(nsid), "terms": terms, "anyq": " or ".join(terms)}
        params["depth"] = depth
        rows = await self._shared.db.fetch(
            "archival search", KEYWORD.format(filters=filters.sql()), params
        )
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
            rows = await self._shared.db.fetch(
                "archival search",
                TAGS_ALL if filters.tag_mode == "all" else TAGS_ANY,
                {"nsid": state.nsid, "tags": list(filters.tags), "ntags": len(filters.tags)},
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
            lambda params: db.fetch("archival search", _VECTORS_ALL, params),
        )

    async def _scan_vectors(
        self, qvec: Sequence[float], state: NamespaceState, filters: Filters, depth: int
    ) -> Seqs:
        """Pure-Python vector candidates: read the filtered vectors in chunks and score them."""
        db = self._shared.db
        sql = VECTORS.format(filters=filters.sql())
        return await scan_vectors(
            lambda params: db.fetch("archival search", sql, params),
            filters.params(state.nsid),
            self._shared.embedder,
            qvec,
            depth,
        )
