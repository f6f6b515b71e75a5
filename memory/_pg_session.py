"""PostgreSQL sessions (short-term memory) and recall search over every session item.

The same rules as the SQLite backend (:mod:`memory._sqlite_session`): ``add_items`` puts items
in the context and in recall; ``evict_oldest`` and ``clear_session`` take them out of the
context but keep them in recall; ``pop_item`` deletes for good; :meth:`PostgresRecallStore.purge`
deletes every trace of a session id (privacy erasure).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from checkpointers._pg_db import PostgresDatabase
from graphexec.errors import MemoryStoreError
from memory._base import Item, RecallHit, RecallStore, Session
from memory._pg_common import (
    OP_GET,
    OP_PUT,
    Conn,
    PgHandle,
    Row,
    lock,
    open_database,
    pg_text,
    ranked_search,
    tsv_terms,
)
from memory._sqlite_common import (
    as_micros,
    check_count,
    check_json,
    check_text,
    dumps,
    from_micros,
    now_micros,
    sql_limit,
)
from memory._sqlite_session import _encode_items
from memory._text import item_text

__all__ = ["PostgresRecallStore", "PostgresSession"]

_NEXT_POSITION = (
    "SELECT coalesce(max(position) + 1, 0) FROM graphexec_mem_items WHERE session_id = :session_id"
)
_INSERT_ITEM = (
    "INSERT INTO graphexec_mem_items"
    " (session_id, position, ctx_order, state, item, tsv, created_at)"
    " VALUES (:session_id, :position, :ctx_order, 'live', :item,"
    " to_tsvector('simple'::regconfig, :terms), :created_at) RETURNING seq"
)
_LATEST = (
    "SELECT item FROM (SELECT item, ctx_order, seq FROM graphexec_mem_items"
    " WHERE session_id = :session_id AND state = 'live'"
    " ORDER BY ctx_order DESC, seq DESC LIMIT :limit) AS latest"
    " ORDER BY ctx_order, seq"
)
_OLDEST = (
    "SELECT seq, ctx_order, item, created_at FROM graphexec_mem_items"
    " WHERE session_id = :session_id AND state = 'live' ORDER BY ctx_order, seq LIMIT :limit"
)
_NEWEST = (
    "SELECT seq, item FROM graphexec_mem_items WHERE session_id = :session_id"
    " AND state = 'live' ORDER BY ctx_order DESC, seq DESC LIMIT 1"
)
_DELETE_ITEM = "DELETE FROM graphexec_mem_items WHERE seq = :seq"
_CLEAR = (
    "UPDATE graphexec_mem_items SET state = 'cleared'"
    " WHERE session_id = :session_id AND state = 'live'"
)
_EVICT = "UPDATE graphexec_mem_items SET state = 'evicted' WHERE seq = ANY(:seqs)"
_EXISTS = "SELECT 1 FROM graphexec_mem_items WHERE session_id = :session_id LIMIT 1"
_COPY_ITEMS = (
    "INSERT INTO graphexec_mem_items"
    " (session_id, position, ctx_order, state, item, tsv, created_at)"
    " SELECT :target, n.ord - 1, n.ord - 1, 'live', i.item, i.tsv, i.created_at"
    " FROM unnest(:seqs::bigint[]) WITH ORDINALITY AS n(seq, ord)"
    " JOIN graphexec_mem_items AS i ON i.seq = n.seq"
)
_RECALL = (
    "SELECT i.seq, i.session_id, i.item, i.position, i.created_at, i.state,"
    " ts_rank(i.tsv, to_tsquery('simple'::regconfig, :q))"
    " FROM graphexec_mem_items AS i"
    " WHERE i.tsv @@ to_tsquery('simple'::regconfig, :q)"
    " AND (:session_id IS NULL OR i.session_id = :session_id)"
    " AND (:after IS NULL OR i.created_at > :after)"
    " AND (:before IS NULL OR i.created_at < :before)"
    " ORDER BY 7 DESC, i.seq DESC LIMIT :limit"
)
_PURGE_ITEMS = "DELETE FROM graphexec_mem_items WHERE session_id = :session_id"
_PURGE_OPS = "DELETE FROM graphexec_mem_ops WHERE tier = :tier AND scope = :session_id"

_TIER = "session"


def _check_session_id(value: object, what: str = "session id") -> str:
    return pg_text(value, what)


async def _insert_items(
    s: Conn, session_id: str, encoded: Sequence[tuple[str, str]], now: int
) -> None:
    [(position,)] = await s.fetch(_NEXT_POSITION, {"session_id": session_id})
    await s.execute_many(
        _INSERT_ITEM,
        [
            {
                "session_id": session_id,
                "position": position + offset,
                "ctx_order": position + offset,
                "item": item,
                "terms": terms,
                "created_at": now,
            }
            for offset, (item, terms) in enumerate(encoded)
        ],
    )


class PostgresSession(PgHandle, Session):
    """Conversation history of one session id, in PostgreSQL (the Agents SDK session protocol).

    Standalone, it owns its connection pool, opened lazily::

        session = PostgresSession("user-42", "postgresql://app@db/app")
        await session.add_items([{"role": "user", "content": "Book me a flight to Lisbon"}])
        recent = await session.get_items(limit=20)
        await session.aclose()

    or ``async with PostgresSession.open("user-42", dsn) as session: ...``. Sessions made by
    :meth:`PostgresMemory.session <memory.PostgresMemory.session>` or :meth:`branch_from`
    share their owner's pool instead (their :meth:`aclose` does nothing).

    The same id in the same schema always reaches the same history, from any object or
    process; ids are compared exactly. Writes to one session are serialised by a transaction
    advisory lock, so concurrent appends and pops from several processes never collide.

    Args:
        session_id: The session's id (any non-empty string without NUL characters).
        dsn: A libpq connection string or URI.
        schema: Keep the tables in this schema (created if missing) instead of the first
            schema of the connection's ``search_path``.
        pool_max: Most connections this object's pool opens per event loop.
    """

    def __init__(
        self,
        session_id: str,
        dsn: str,
        *,
        schema: str | None = None,
        pool_max: int = 10,
    ) -> None:
        self.session_id = _check_session_id(session_id)
        db = open_database(
            dsn, owner=f"PostgresSession({session_id!r})", schema=schema, pool_max=pool_max
        )
        self._init_handle(db, owns=True)

    @classmethod
    def _attach(cls, session_id: str, db: PostgresDatabase) -> Self:
        """A session on an existing database, borrowing its pool."""
        session = cls.__new__(cls)
        session.session_id = _check_session_id(session_id)
        session._init_handle(db, owns=False)
        return session

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        session_id: str,
        dsn: str,
        *,
        schema: str | None = None,
        pool_max: int = 10,
    ) -> AsyncIterator[Self]:
        """Open the session's pool (creating the schema), yield it, close it on exit.

        Takes the same arguments as the constructor.
        """
        session = cls(session_id, dsn, schema=schema, pool_max=pool_max)
        try:
            await session.setup()
            yield session
        finally:
            await session.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session_id!r}, {self._db.where!r})"

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items of the context (all when ``None``), oldest first.

        Raises:
            MemoryStoreError: ``limit`` is not ``None`` or a non-negative int.
        """
        n = check_count(limit, "limit", allow_none=True)
        if n == 0:
            return []
        rows = await self._db.fetch(
            "get_items",
            _LATEST,
            {"session_id": self.session_id, "limit": None if n is None else sql_limit(n)},
        )
        return [json.loads(item) for (item,) in rows]

    async def add_items(
        self, items: Sequence[Mapping[str, Any]], *, op_key: str | None = None
    ) -> None:
        """Append items at the end of the context, in one transaction.

        Every item is checked first: a dict whose JSON round trip gives it back exactly.
        Otherwise nothing is written.

        Args:
            items: JSON-compatible dicts (``{"role": "user", "content": "..."}``, tool items).
            op_key: Makes the call idempotent within this session: a second call with the
                same key writes nothing.

        Raises:
            MemoryStoreError: An item is not JSON-compatible, or ``op_key`` is not a str.
        """
        session_id = self.session_id
        encoded = _encode_items(items, session_id)
        op = None if op_key is None else pg_text(op_key, "op_key")
        key = {"tier": _TIER, "scope": session_id, "op_key": op}
        if not encoded and op is None:
            return

        async def body(s: Conn) -> None:
            await lock(s, _TIER, session_id)
            if op is not None:
                if await s.fetch(OP_GET, key):
                    return
                await s.fetch(OP_PUT, {**key, "result": None, "at": now_micros()})
            if encoded:
                await _insert_items(s, session_id, encoded, now_micros())

        await self._db.transaction(f"add_items to session {session_id!r}", body)

    async def pop_item(self) -> Item | None:
        """Remove and return the newest item of the context (``None`` when it is empty).

        The item is deleted for good: recall no longer finds it.
        """
        session_id = self.session_id

        async def body(s: Conn) -> str | None:
            await lock(s, _TIER, session_id)
            rows = await s.fetch(_NEWEST, {"session_id": session_id})
            if not rows:
                return None
            [(seq, item)] = rows
            await s.fetch(_DELETE_ITEM, {"seq": seq})
            return str(item)

        item = await self._db.transaction(f"pop_item of session {session_id!r}", body)
        return None if item is None else dict(json.loads(item))

    async def clear_session(self) -> None:
        """Empty the context; the items stay in recall (as evicted)."""
        session_id = self.session_id

        async def body(s: Conn) -> None:
            await lock(s, _TIER, session_id)
            await s.fetch(_CLEAR, {"session_id": session_id})

        await self._db.transaction(f"clear_session of session {session_id!r}", body)

    async def purge(self) -> int:
        """Delete every item of this session, recall copies of evicted items included.

        Same as ``recall.purge(session_id)``; see :meth:`PostgresRecallStore.purge`.
        """
        return await _purge(self._db, self.session_id)

    async def branch_from(self, turn: int, new_session_id: str) -> PostgresSession:
        """Copy the context's items ``[0, turn)`` into a new session and return it.

        The copies keep their creation times and get positions ``0..turn-1``; the new session
        shares this session's pool. Items outside the context (evicted, cleared) are not
        copied.

        Args:
            turn: How many of the oldest context items to copy (``0 <= turn <= len(items)``).
            new_session_id: An id with no items yet.

        Raises:
            MemoryStoreError: ``turn`` is out of range or ``new_session_id`` already has items.
        """
        source = self.session_id
        target = _check_session_id(new_session_id, "new session id")
        n = check_count(turn, "turn")
        if target == source:
            raise MemoryStoreError(f"session {source!r} cannot be branched into itself")

        async def body(s: Conn) -> None:
            # Both locks, in a fixed order: two branches between the same ids cannot deadlock.
            for sid in sorted((source, target)):
                await lock(s, _TIER, sid)
            if await s.fetch(_EXISTS, {"session_id": target}):
                raise MemoryStoreError(
                    f"cannot branch session {source!r} into {target!r}: that session already "
                    "has items; choose a new id"
                )
            rows = await s.fetch(_OLDEST, {"session_id": source, "limit": None})
            if n is None or n > len(rows):
                raise MemoryStoreError(
                    f"cannot branch session {source!r} at turn {turn}: it has {len(rows)} "
                    f"items, so turn must be between 0 and {len(rows)}"
                )
            if n:
                # ORDINALITY counts from 1; positions count from 0.
                await s.fetch(_COPY_ITEMS, {"target": target, "seqs": [r[0] for r in rows[:n]]})

        await self._db.transaction(f"branch_from session {source!r} to {target!r}", body)
        return type(self)._attach(target, self._db)

    async def evict_oldest(self, count: int, summary: Mapping[str, Any] | None = None) -> list[str]:
        """Move the ``count`` oldest context items out of the context (compaction).

        One transaction. The evicted items stay in recall (``evicted=True``). With ``summary``,
        that item is stored with ``"replaces"`` set to the evicted ids and takes their place
        as the oldest item of the context.

        Args:
            count: How many items to evict; ``0`` does nothing (and allows no summary).
            summary: The item that stands in for them.

        Returns:
            The evicted items' ids, oldest first.

        Raises:
            MemoryStoreError: ``count`` exceeds the number of context items, ``summary`` is
                not JSON-compatible, or a summary is given with ``count=0``.
        """
        session_id = self.session_id
        n = check_count(count, "count")
        plain: dict[str, Any] | None = None
        if summary is not None:
            if not isinstance(summary, Mapping):
                raise MemoryStoreError(
                    f"session {session_id!r}: the summary must be a dict, got "
                    f"{type(summary).__name__}"
                )
            plain = dict(summary)
            check_json(plain, f"session {session_id!r}: summary")
        if not n:
            if plain is not None:
                raise MemoryStoreError(
                    f"session {session_id!r}: a summary needs at least one evicted item"
                )
            return []

        async def body(s: Conn) -> list[str]:
            await lock(s, _TIER, session_id)
            rows = await s.fetch(_OLDEST, {"session_id": session_id, "limit": sql_limit(n)})
            if len(rows) < n:
                raise MemoryStoreError(
                    f"session {session_id!r} has {len(rows)} items in its context; cannot evict {n}"
                )
            await s.fetch(_EVICT, {"seqs": [seq for seq, *_ in rows]})
            ids = [str(seq) for seq, *_ in rows]
            if plain is not None:
                item = {**plain, "replaces": ids}
                [(position,)] = await s.fetch(_NEXT_POSITION, {"session_id": session_id})
                await s.fetch(
                    _INSERT_ITEM,
                    {
                        "session_id": session_id,
                        "position": position,
                        "ctx_order": rows[-1][1],
                        "item": dumps(item),
                        "terms": tsv_terms(item_text(item)),
                        "created_at": now_micros(),
                    },
                )
            return ids

        return await self._db.transaction(f"evict_oldest of session {session_id!r}", body)


async def _purge(db: PostgresDatabase, session_id: str) -> int:
    async def body(s: Conn) -> int:
        await lock(s, _TIER, session_id)
        rows = await s.fetch(_PURGE_ITEMS + " RETURNING seq", {"session_id": session_id})
        await s.fetch(_PURGE_OPS, {"tier": _TIER, "session_id": session_id})
        return len(rows)

    return await db.transaction(f"purge of session {session_id!r}", body)


class PostgresRecallStore(PgHandle, RecallStore):
    """Full-text search (``tsvector``, GIN) over every session item of a schema.

    It finds items in the context, evicted by compaction and removed by ``clear_session``;
    popped and purged items are gone. Matching uses :func:`memory._text.content_tokens`, as
    the SQLite backend does, and items holding every query term rank above those holding some.

    Args:
        dsn: A libpq connection string or URI.
        schema: The schema holding the memory tables.
    """

    def __init__(self, dsn: str, *, schema: str | None = None) -> None:
        self._init_handle(open_database(dsn, owner="PostgresRecallStore", schema=schema), owns=True)

    @classmethod
    def _attach(cls, db: PostgresDatabase) -> Self:
        store = cls.__new__(cls)
        store._init_handle(db, owns=False)
        return store

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.where!r})"

    async def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        top_k: int = 10,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> list[RecallHit]:
        """Items matching ``query``, best first.

        Args:
            query: Free text; it is tokenised, never parsed as search syntax. A query without
                content words (only stopwords or punctuation) matches nothing.
            session_id: Only this session's items (exact id).
            top_k: At most this many hits.
            after: Only items added strictly after this time (naive datetimes are UTC).
            before: Only items added strictly before this time.

        Returns:
            Hits best first; ``evicted`` is true for items no longer in their session's
            context (compacted or cleared).
        """
        check_text(query, "query", empty=True)  # tokenised: a NUL never reaches SQL
        if session_id is not None:
            _check_session_id(session_id)
        limit = check_count(top_k, "top_k") or 0
        params = {
            "session_id": session_id,
            "after": as_micros(after, "after"),
            "before": as_micros(before, "before"),
        }

        async def read(p: Mapping[str, Any]) -> list[Row]:
            return await self._db.fetch("recall search", _RECALL, p)

        hits = await ranked_search(read, query, params, limit=limit)
        return [
            RecallHit(
                session_id=str(sid),
                item=dict(json.loads(item)),
                position=int(position),
                at=from_micros(int(created_at)),
                evicted=state != "live",
                score=score,
            )
            for (_, sid, item, position, created_at, state, _), score in hits
        ]

    async def purge(self, session_id: str) -> int:
        """Delete every stored item of ``session_id``, for privacy (right to erasure).

        Removes the context, the items evicted by compaction or ``clear_session`` (the copies
        recall searches) and the session's op keys, in one transaction. Sessions branched from
        it keep their own copies (they have their own ids: purge them too).

        Returns:
            How many items were deleted.

        Raises:
            MemoryStoreError: ``session_id`` is not a non-empty str.
        """
        return await _purge(self._db, _check_session_id(session_id))
