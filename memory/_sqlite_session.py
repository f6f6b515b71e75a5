"""SQLite sessions (short-term memory) and recall search over every session item.

What each operation does to an item:

- ``add_items``: the item joins the context (``get_items``) and recall.
- ``evict_oldest``: it leaves the context (a summary may take its place) and stays in recall,
  marked evicted.
- ``clear_session``: it leaves the context and stays in recall, marked evicted: the
  conversation did happen.
- ``pop_item``: it is deleted, from recall too. The correction pattern pops wrong turns
  (the last question and answer, then asks again); they must not come back through search.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from checkpointers._sqlite_db import SqliteDatabase, fetch
from graphexec.errors import MemoryStoreError
from memory._base import Item, RecallHit, RecallStore, Session
from memory._sqlite_common import (
    OP_GET,
    OP_PUT,
    Row,
    SqliteHandle,
    Synchronous,
    as_micros,
    check_count,
    check_json,
    check_text,
    dumps,
    from_micros,
    fts_terms,
    now_micros,
    open_database,
    ranked_search,
    sql_limit,
)
from memory._text import item_text

__all__ = ["SqliteRecallStore", "SqliteSession"]

_NEXT_POSITION = (
    "SELECT coalesce(max(position) + 1, 0) FROM graphexec_mem_items WHERE session_id = :session_id"
)
_INSERT_ITEM = (
    "INSERT INTO graphexec_mem_items (session_id, position, ctx_order, state, item, created_at)"
    " VALUES (:session_id, :position, :ctx_order, 'live', :item, :created_at) RETURNING seq"
)
_INSERT_TERMS = "INSERT INTO graphexec_mem_items_fts (rowid, terms) VALUES (:seq, :terms)"
# The literal state = 'live' lets SQLite use the partial index graphexec_mem_items_context.
_LATEST = (
    "SELECT item FROM (SELECT item, ctx_order, seq FROM graphexec_mem_items"
    " WHERE session_id = :session_id AND state = 'live'"
    " ORDER BY ctx_order DESC, seq DESC LIMIT :limit)"
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
_DELETE_TERMS = "DELETE FROM graphexec_mem_items_fts WHERE rowid = :seq"
_CLEAR = (
    "UPDATE graphexec_mem_items SET state = 'cleared'"
    " WHERE session_id = :session_id AND state = 'live'"
)
_EVICT = "UPDATE graphexec_mem_items SET state = 'evicted' WHERE seq = :seq"
_EXISTS = "SELECT 1 FROM graphexec_mem_items WHERE session_id = :session_id LIMIT 1"
_COPY_TERMS = (
    "INSERT INTO graphexec_mem_items_fts (rowid, terms)"
    " SELECT :new_seq, terms FROM graphexec_mem_items_fts WHERE rowid = :old_seq"
)
_RECALL = (
    "SELECT i.seq, i.session_id, i.item, i.position, i.created_at, i.state,"
    " bm25(graphexec_mem_items_fts)"
    " FROM graphexec_mem_items_fts JOIN graphexec_mem_items AS i"
    " ON i.seq = graphexec_mem_items_fts.rowid"
    " WHERE graphexec_mem_items_fts MATCH :q"
    " AND (:session_id IS NULL OR i.session_id = :session_id)"
    " AND (:after IS NULL OR i.created_at > :after)"
    " AND (:before IS NULL OR i.created_at < :before)"
    " ORDER BY bm25(graphexec_mem_items_fts), i.seq DESC LIMIT :limit"
)

_PURGE_TERMS = (
    "DELETE FROM graphexec_mem_items_fts WHERE rowid IN"
    " (SELECT seq FROM graphexec_mem_items WHERE session_id = :session_id)"
)
_PURGE_ITEMS = "DELETE FROM graphexec_mem_items WHERE session_id = :session_id"
_PURGE_OPS = "DELETE FROM graphexec_mem_ops WHERE tier = :tier AND scope = :session_id"

_NO_LIMIT = -1  # SQLite: LIMIT -1 means no limit
_TIER = "session"


def _encode_items(items: object, session_id: str) -> list[tuple[str, str]]:
    """``(json, fts terms)`` per item, or :class:`MemoryStoreError` before anything is written."""
    if isinstance(items, Mapping | str | bytes) or not isinstance(items, Iterable):
        raise MemoryStoreError(
            f"session {session_id!r}: items must be a list of dicts, got "
            f"{type(items).__name__} (wrap a single item in a list)"
        )
    encoded: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise MemoryStoreError(
                f"session {session_id!r}: item {i} is a {type(item).__name__}, not a dict; "
                "nothing was written"
            )
        plain = dict(item)
        try:
            check_json(plain, f"session {session_id!r}: item {i}")
        except MemoryStoreError as e:
            raise MemoryStoreError(f"{e}; nothing was written") from None
        encoded.append((dumps(plain), fts_terms(item_text(plain))))
    return encoded


def _insert_items(
    db: sqlite3.Connection, session_id: str, encoded: Sequence[tuple[str, str]], now: int
) -> None:
    [(position,)] = fetch(db, _NEXT_POSITION, {"session_id": session_id})
    for offset, (item, terms) in enumerate(encoded):
        [(seq,)] = fetch(
            db,
            _INSERT_ITEM,
            {
                "session_id": session_id,
                "position": position + offset,
                "ctx_order": position + offset,
                "item": item,
                "created_at": now,
            },
        )
        db.execute(_INSERT_TERMS, {"seq": seq, "terms": terms})


class SqliteSession(SqliteHandle, Session):
    """Conversation history of one session id, in SQLite (the Agents SDK ``SQLiteSession``).

    Standalone, it owns its database, opened lazily::

        session = SqliteSession("user-42", "memory.db")
        await session.add_items([{"role": "user", "content": "Book me a flight to Lisbon"}])
        recent = await session.get_items(limit=20)
        await session.aclose()

    or ``async with SqliteSession.open("user-42", "memory.db") as session: ...``. Sessions made
    by :meth:`SqliteMemory.session <memory.SqliteMemory.session>` or :meth:`branch_from` share
    their owner's connections instead (their :meth:`aclose` does nothing).

    The same id on the same file always reaches the same history, from any object or process;
    ids are compared exactly. :meth:`pop_item` deletes the item for good (also from recall);
    :meth:`clear_session` and :meth:`evict_oldest` only take items out of the context, and
    :class:`SqliteRecallStore` still finds them.

    Args:
        session_id: The session's id (any non-empty string).
        path: The database file (created if missing); ``None`` for a private in-memory
            database that disappears on :meth:`aclose`.
        synchronous: SQLite's ``synchronous`` pragma: ``"NORMAL"`` (safe against process
            crashes) or ``"FULL"`` (also against power loss).
        busy_timeout: Seconds a write waits for another connection's lock before retrying.
        loop_writes: Small writes (new items) run on the event loop's
            thread in ``synchronous="NORMAL"`` (see :class:`~checkpointers.SqliteCheckpointer`);
            ``False`` keeps every statement on the connection's thread.
    """

    def __init__(
        self,
        session_id: str,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
    ) -> None:
        self.session_id = check_text(session_id, "session id")
        db = open_database(
            path,
            owner=f"SqliteSession({session_id!r}, {None if path is None else os.fspath(path)!r})",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
        )
        self._init_handle(db, owns=True)

    @classmethod
    def _attach(cls, session_id: str, db: SqliteDatabase) -> Self:
        """A session on an existing database, borrowing its connections."""
        session = cls.__new__(cls)
        session.session_id = check_text(session_id, "session id")
        session._init_handle(db, owns=False)
        return session

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        session_id: str,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
    ) -> AsyncIterator[Self]:
        """Open the session's database (creating the schema), yield it, close it on exit.

        Takes the same arguments as the constructor.
        """
        session = cls(
            session_id,
            path,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
        )
        try:
            await session.setup()
            yield session
        finally:
            await session.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session_id!r}, {self._db.where!r})"

    # -- reads ------------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items of the context (all when ``None``), oldest first.

        Raises:
            MemoryStoreError: ``limit`` is not ``None`` or a non-negative int.
        """
        n = check_count(limit, "limit", allow_none=True)
        if n == 0:
            return []
        rows = await self._db.read(
            "get_items",
            _LATEST,
            {"session_id": self.session_id, "limit": _NO_LIMIT if n is None else sql_limit(n)},
        )
        return [json.loads(item) for (item,) in rows]

    # -- writes -----------------------------------------------------------------------------

    async def add_items(
        self, items: Sequence[Mapping[str, Any]], *, op_key: str | None = None
    ) -> None:
        """Append items at the end of the context, in one transaction.

        Every item is checked first (see :func:`memory._sqlite_common.check_json`): a dict
        whose JSON round trip gives it back exactly. Otherwise nothing is written.

        Args:
            items: JSON-compatible dicts (``{"role": "user", "content": "..."}``, tool items).
            op_key: Makes the call idempotent within this session: a second call with the
                same key writes nothing.

        Raises:
            MemoryStoreError: An item is not JSON-compatible, or ``op_key`` is not a str.
        """
        session_id = self.session_id
        encoded = _encode_items(items, session_id)
        op = None if op_key is None else check_text(op_key, "op_key")
        key = {"tier": _TIER, "scope": session_id, "op_key": op}

        def body(db: sqlite3.Connection) -> None:
            if op is not None:
                if fetch(db, OP_GET, key):
                    return
                now = now_micros()
                fetch(db, OP_PUT, {**key, "result": None, "at": now})
            if encoded:
                _insert_items(db, session_id, encoded, now_micros())

        size = sum(len(text) + len(terms) for text, terms in encoded)
        await self._db.write("add_items", body, size=size)  # on the loop's thread when small

    async def pop_item(self) -> Item | None:
        """Remove and return the newest item of the context (``None`` when it is empty).

        The item is deleted for good: recall no longer finds it (a popped item is usually a
        wrong turn being corrected).
        """
        session_id = self.session_id

        def body(db: sqlite3.Connection) -> str | None:
            rows = fetch(db, _NEWEST, {"session_id": session_id})
            if not rows:
                return None
            [(seq, item)] = rows
            db.execute(_DELETE_ITEM, {"seq": seq})
            db.execute(_DELETE_TERMS, {"seq": seq})
            return str(item)

        item = await self._db.write("pop_item", body)
        return None if item is None else dict(json.loads(item))

    async def clear_session(self) -> None:
        """Empty the context; the items stay in recall (as evicted)."""
        session_id = self.session_id

        def body(db: sqlite3.Connection) -> None:
            db.execute(_CLEAR, {"session_id": session_id})

        await self._db.write("clear_session", body)

    async def purge(self) -> int:
        """Delete every item of this session, recall copies of evicted items included.

        Same as ``recall.purge(session_id)``; see :meth:`SqliteRecallStore.purge`.
        """
        return await _purge(self._db, self.session_id)

    async def branch_from(self, turn: int, new_session_id: str) -> SqliteSession:
        """Copy the context's items ``[0, turn)`` into a new session and return it.

        The copies keep their creation times and get positions ``0..turn-1``; the new session
        is independent from then on and shares this session's database connections. Items
        outside the context (evicted, cleared) are not copied: they stay in this session's
        recall.

        Args:
            turn: How many of the oldest context items to copy (``0 <= turn <= len(items)``).
            new_session_id: An id with no items yet (none ever added, or all popped).

        Raises:
            MemoryStoreError: ``turn`` is out of range or ``new_session_id`` already has items.
        """
        source = self.session_id
        target = check_text(new_session_id, "new session id")
        n = check_count(turn, "turn")
        if target == source:
            raise MemoryStoreError(f"session {source!r} cannot be branched into itself")

        def body(db: sqlite3.Connection) -> None:
            if fetch(db, _EXISTS, {"session_id": target}):
                raise MemoryStoreError(
                    f"cannot branch session {source!r} into {target!r}: that session already "
                    "has items; choose a new id"
                )
            rows = fetch(db, _OLDEST, {"session_id": source, "limit": _NO_LIMIT})
            if n is None or n > len(rows):
                raise MemoryStoreError(
                    f"cannot branch session {source!r} at turn {turn}: it has {len(rows)} "
                    f"items, so turn must be between 0 and {len(rows)}"
                )
            for position, (old_seq, _, item, created_at) in enumerate(rows[:n]):
                [(new_seq,)] = fetch(
                    db,
                    _INSERT_ITEM,
                    {
                        "session_id": target,
                        "position": position,
                        "ctx_order": position,
                        "item": item,
                        "created_at": created_at,
                    },
                )
                db.execute(_COPY_TERMS, {"new_seq": new_seq, "old_seq": old_seq})

        await self._db.write("branch_from", body)
        return type(self)._attach(target, self._db)

    async def evict_oldest(self, count: int, summary: Mapping[str, Any] | None = None) -> list[str]:
        """Move the ``count`` oldest context items out of the context (compaction).

        One transaction. The evicted items stay in recall (``evicted=True``). With ``summary``,
        that item is stored with ``"replaces"`` set to the evicted ids and takes their place
        as the oldest item of the context (it may itself be evicted by a later compaction).

        Args:
            count: How many items to evict; ``0`` does nothing (and allows no summary).
            summary: The item that stands in for them, e.g.
                ``{"role": "system", "content": "Earlier: ..."}``.

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

        def body(db: sqlite3.Connection) -> list[str]:
            rows = fetch(db, _OLDEST, {"session_id": session_id, "limit": sql_limit(n)})
            if len(rows) < n:
                raise MemoryStoreError(
                    f"session {session_id!r} has {len(rows)} items in its context; cannot evict {n}"
                )
            db.executemany(_EVICT, [{"seq": seq} for seq, *_ in rows])
            ids = [str(seq) for seq, *_ in rows]
            if plain is not None:
                item = {**plain, "replaces": ids}
                [(position,)] = fetch(db, _NEXT_POSITION, {"session_id": session_id})
                [(seq,)] = fetch(
                    db,
                    _INSERT_ITEM,
                    {
                        "session_id": session_id,
                        "position": position,
                        "ctx_order": rows[-1][1],
                        "item": dumps(item),
                        "created_at": now_micros(),
                    },
                )
                db.execute(_INSERT_TERMS, {"seq": seq, "terms": fts_terms(item_text(item))})
            return ids

        return await self._db.write("evict_oldest", body)


async def _purge(db: SqliteDatabase, session_id: str) -> int:
    def body(conn: sqlite3.Connection) -> int:
        params = {"session_id": session_id}
        conn.execute(_PURGE_TERMS, params)
        count = conn.execute(_PURGE_ITEMS, params).rowcount
        conn.execute(_PURGE_OPS, {**params, "tier": _TIER})
        return int(count)

    return await db.write("purge", body)


class SqliteRecallStore(SqliteHandle, RecallStore):
    """Full-text search (FTS5, BM25) over every session item of a database.

    It finds items in the context, evicted by compaction and removed by ``clear_session``;
    popped items are gone. Matching uses :func:`memory._text.content_tokens` (stemmed,
    stopwords dropped), and items holding every query term rank above those holding some.

    Args:
        path: The database file; ``None`` for a private in-memory database (only useful
            through :class:`~memory.SqliteMemory`, which shares one database between tiers).
        synchronous: SQLite's ``synchronous`` pragma.
        busy_timeout: Seconds a statement waits for another connection's lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
    ) -> None:
        db = open_database(
            path,
            owner=f"SqliteRecallStore({None if path is None else os.fspath(path)!r})",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
        )
        self._init_handle(db, owns=True)

    @classmethod
    def _attach(cls, db: SqliteDatabase) -> Self:
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
            query: Free text; it is tokenised, never parsed as FTS5 syntax. A query without
                content words (only stopwords or punctuation) matches nothing.
            session_id: Only this session's items (exact id).
            top_k: At most this many hits.
            after: Only items added strictly after this time (naive datetimes are UTC).
            before: Only items added strictly before this time.

        Returns:
            Hits best first; ``evicted`` is true for items no longer in their session's
            context (compacted or cleared).
        """
        check_text(query, "query", empty=True)
        if session_id is not None:
            check_text(session_id, "session id")
        limit = check_count(top_k, "top_k") or 0
        params = {
            "session_id": session_id,
            "after": as_micros(after, "after"),
            "before": as_micros(before, "before"),
        }

        async def read(p: Mapping[str, Any]) -> list[Row]:
            return await self._db.read("recall search", _RECALL, p)

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
        recall searches), their full-text entries and the session's op keys, in one
        transaction. Sessions branched from it keep their own copies (they have their own
        ids: purge them too).

        Returns:
            How many items were deleted.

        Raises:
            MemoryStoreError: ``session_id`` is not a non-empty str.
        """
        return await _purge(self._db, check_text(session_id, "session id"))
