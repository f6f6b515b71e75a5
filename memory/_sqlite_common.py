"""What the SQLite memory tiers share: schema, input checks, JSON, full-text queries, lifecycle.

Schema (a version table plus tables prefixed ``graphexec_mem_``, so they can share a file with
the checkpointer and the archival store):

``graphexec_memory_schema``
    One row per applied migration; ``version`` is the index into :data:`MIGRATIONS`.
``graphexec_mem_items``
    Every session item ever added and not popped. ``seq`` (never reused) is the item's id;
    ``position`` is its 0-based place in its session's history, unique per session;
    ``ctx_order`` orders the context (equal to ``position``, except for a compaction summary,
    which takes the order of the last item it replaced so that it sorts first); ``state`` is
    ``live`` (in the context), ``evicted`` (compacted away) or ``cleared`` (by
    ``clear_session``). ``item`` is canonical JSON; ``created_at`` is microseconds since the
    Unix epoch (UTC), as in the checkpointer.
``graphexec_mem_items_fts``
    FTS5 index of the items' text (``rowid`` = ``seq``) for recall search.
``graphexec_mem_facts``
    The current value of each fact. ``namespace`` is the namespace as a canonical JSON array,
    compared with ``=`` only; ``last_write`` is the id of the fact's newest history row, which
    orders facts by recency even when clocks disagree.
``graphexec_mem_fact_history``
    Every write and deletion of every fact, ``version`` increasing across deletions.
``graphexec_mem_facts_fts``
    FTS5 index of each current fact's key and value (``rowid`` = the fact's ``id``).
``graphexec_mem_blocks``
    Core-memory blocks keyed ``(namespace, label)``. A deleted block stays as a tombstone
    (``deleted = 1``) so that its version keeps increasing if the label is created again: an
    ``expected_version`` taken before the deletion can never match the new block.
``graphexec_mem_ops``
    Results of writes made with an ``op_key``, keyed ``(tier, scope, op_key)``: a repeated key
    returns the stored result and writes nothing.

Full-text search: stored text and queries go through the same tokeniser,
:func:`memory._text.content_tokens` (lowercase, accent-free, stopwords dropped, stemmed); the
index holds those tokens. A query is rebuilt from its tokens, each one quoted as an FTS5 string,
so no user text can reach FTS5's query syntax (operators, column filters, ``NEAR``, prefixes).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

from checkpointers._rows import from_micros, to_micros
from checkpointers._sqlite_db import SqliteDatabase
from graphexec.errors import MemoryStoreError
from memory._text import content_tokens

__all__ = [
    "MAX_INT",
    "MIGRATIONS",
    "VERSION_TABLE",
    "Row",
    "as_micros",
    "SqliteHandle",
    "check_count",
    "check_json",
    "check_namespace",
    "check_text",
    "decode_namespace",
    "dumps",
    "encode_namespace",
    "from_micros",
    "fts_queries",
    "fts_terms",
    "now_micros",
    "open_database",
    "ranked_search",
    "sql_limit",
    "to_micros",
]

Row = tuple[Any, ...]
Synchronous = Literal["NORMAL", "FULL"]

VERSION_TABLE = "graphexec_memory_schema"

MIGRATIONS: tuple[str, ...] = (
    f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} ("
    " version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)",
    # -- sessions and recall -----------------------------------------------------------------
    "CREATE TABLE graphexec_mem_items ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " session_id TEXT NOT NULL,"
    " position INTEGER NOT NULL,"
    " ctx_order INTEGER NOT NULL,"
    " state TEXT NOT NULL CHECK (state IN ('live', 'evicted', 'cleared')),"
    " item TEXT NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " UNIQUE (session_id, position))",
    "CREATE INDEX graphexec_mem_items_context"
    " ON graphexec_mem_items (session_id, ctx_order, seq) WHERE state = 'live'",
    "CREATE VIRTUAL TABLE graphexec_mem_items_fts USING fts5(terms)",
    # -- facts -------------------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_facts ("
    " id INTEGER PRIMARY KEY,"
    " namespace TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " value TEXT NOT NULL,"
    " source TEXT,"
    " updated_at INTEGER NOT NULL,"
    " version INTEGER NOT NULL,"
    " last_write INTEGER NOT NULL,"
    " UNIQUE (namespace, key))",
    "CREATE INDEX graphexec_mem_facts_recent ON graphexec_mem_facts (namespace, last_write)",
    "CREATE TABLE graphexec_mem_fact_history ("
    " id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " namespace TEXT NOT NULL,"
    " key TEXT NOT NULL,"
    " version INTEGER NOT NULL,"
    " value TEXT,"
    " source TEXT,"
    " at INTEGER NOT NULL,"
    " deleted INTEGER NOT NULL,"
    " UNIQUE (namespace, key, version))",
    "CREATE VIRTUAL TABLE graphexec_mem_facts_fts USING fts5(terms)",
    # -- blocks ------------------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_blocks ("
    " namespace TEXT NOT NULL,"
    " label TEXT NOT NULL,"
    " value TEXT NOT NULL,"
    " char_limit INTEGER NOT NULL,"
    " description TEXT NOT NULL,"
    " read_only INTEGER NOT NULL,"
    " version INTEGER NOT NULL,"
    " deleted INTEGER NOT NULL,"
    " created_at INTEGER NOT NULL,"
    " updated_at INTEGER NOT NULL,"
    " PRIMARY KEY (namespace, label)) WITHOUT ROWID",
    # -- idempotent writes -------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_ops ("
    " tier TEXT NOT NULL,"
    " scope TEXT NOT NULL,"
    " op_key TEXT NOT NULL,"
    " result TEXT,"
    " at INTEGER NOT NULL,"
    " PRIMARY KEY (tier, scope, op_key)) WITHOUT ROWID",
)
"""The memory schema, one statement per version (see the module docstring)."""

OP_GET = (
    "SELECT result FROM graphexec_mem_ops"
    " WHERE tier = :tier AND scope = :scope AND op_key = :op_key"
)
OP_PUT = (
    "INSERT INTO graphexec_mem_ops (tier, scope, op_key, result, at)"
    " VALUES (:tier, :scope, :op_key, :result, :at)"
)

MAX_INT = 2**63 - 1
"""The largest integer SQLite stores."""
_MAX_DEPTH = 256
_MAX_QUERY_TERMS = 32


def open_database(
    path: str | os.PathLike[str] | None,
    *,
    owner: str,
    synchronous: Synchronous,
    busy_timeout: float,
    loop_writes: bool = True,
) -> SqliteDatabase:
    """A :class:`SqliteDatabase` with the memory schema (``None``: a private in-memory one)."""
    return SqliteDatabase(
        ":memory:" if path is None else path,
        owner=owner,
        migrations=MIGRATIONS,
        version_table=VERSION_TABLE,
        synchronous=synchronous,
        busy_timeout=busy_timeout,
        loop_writes=loop_writes,
    )


class SqliteHandle:
    """Lifecycle shared by the SQLite tiers: a database they own, or one they borrow.

    A tier made by :class:`~memory.SqliteMemory` (or by a session's ``branch_from``) borrows
    its owner's connections, and its :meth:`aclose` leaves them open.
    """

    _db: SqliteDatabase
    _owns_db: bool

    def _init_handle(self, db: SqliteDatabase, *, owns: bool) -> None:
        self._db = db
        self._owns_db = owns

    async def setup(self) -> None:
        """Open this event loop's connections and create or migrate the schema. Idempotent.

        Optional: the first operation does it too.

        Raises:
            StorageError: The file cannot be opened, or a newer graphexec wrote its schema.
        """
        await self._db.open()

    async def aclose(self) -> None:
        """Close the connections this object opened (none when it borrows its owner's)."""
        if self._owns_db:
            await self._db.aclose()

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


# -- input checks --------------------------------------------------------------------------------


def check_text(value: object, what: str, *, empty: bool = False) -> str:
    """``value`` if it is a str that SQLite can store (and non-empty unless ``empty``)."""
    if not isinstance(value, str):
        raise MemoryStoreError(f"{what} must be a str, got {type(value).__name__}")
    if not value and not empty:
        raise MemoryStoreError(f"{what} must not be empty")
    _check_encodable(value, what)
    return value


def _check_encodable(value: str, what: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MemoryStoreError(
            f"{what} contains a lone surrogate ({value[e.start : e.end]!r} at index {e.start}), "
            "which is not valid Unicode text and cannot be stored"
        ) from None


def check_count(value: object, what: str, *, allow_none: bool = False) -> int | None:
    """``value`` if it is a non-negative int (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MemoryStoreError(f"{what} must be a non-negative int, got {value!r}")
    return value


def sql_limit(n: int) -> int:
    """``n`` capped to what SQLite's 64-bit integers hold (any larger limit means "all")."""
    return min(n, MAX_INT)


def check_namespace(namespace: object) -> tuple[str, ...]:
    """``namespace`` as a tuple of non-empty strings (lists are accepted too)."""
    if isinstance(namespace, str | bytes) or not isinstance(namespace, Sequence):
        raise MemoryStoreError(
            f"namespace must be a tuple of strings such as ('user', '42'), got {namespace!r}"
        )
    for part in namespace:
        if not isinstance(part, str) or not part:
            raise MemoryStoreError(
                f"namespace {tuple(namespace)!r}: every part must be a non-empty str, got {part!r}"
            )
        _check_encodable(part, f"namespace {tuple(namespace)!r}")
    return tuple(namespace)


def encode_namespace(namespace: object) -> str:
    """The namespace as canonical JSON: the only form stored and compared (with ``=``)."""
    return json.dumps(list(check_namespace(namespace)), ensure_ascii=False, separators=(",", ":"))


def decode_namespace(text: str) -> tuple[str, ...]:
    """Inverse of :func:`encode_namespace`."""
    return tuple(json.loads(text))


def check_json(value: object, what: str) -> None:
    """Refuse anything that a JSON round trip would not give back exactly.

    Allowed: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``, ``bool``
    and ``None`` -- exactly those types, not subclasses or look-alikes (a tuple would come back
    as a list, an ``IntEnum`` as an int, a non-str key as a str).

    Raises:
        MemoryStoreError: Naming ``what`` and the path to the first offending value.
    """
    _check_json(value, what, "", set(), 0)


def _check_json(value: object, what: str, path: str, parents: set[int], depth: int) -> None:
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    where = f"{what}{path}" if path else what
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise MemoryStoreError(f"{where} is {value!r}, which JSON cannot represent")
        return
    if kind is str:
        _check_encodable(value, where)  # type: ignore[arg-type]
        return
    if kind is not dict and kind is not list:
        hint = " (use a list)" if kind is tuple else ""
        raise MemoryStoreError(
            f"{where} is a {kind.__name__}, which is not JSON-compatible{hint}: use dict, "
            "list, str, int, float, bool or None"
        )
    if depth >= _MAX_DEPTH:
        raise MemoryStoreError(f"{where} is nested more than {_MAX_DEPTH} levels deep")
    if id(value) in parents:
        raise MemoryStoreError(f"{where} contains itself (a reference cycle)")
    parents.add(id(value))
    if isinstance(value, dict):
        for key, child in value.items():
            if type(key) is not str:
                raise MemoryStoreError(
                    f"{where} has the key {key!r} ({type(key).__name__}); JSON keys must be str"
                )
            _check_encodable(key, f"{where} key")
            _check_json(child, what, f"{path}[{key!r}]", parents, depth + 1)
    else:
        for i, child in enumerate(value):  # type: ignore[arg-type]
            _check_json(child, what, f"{path}[{i}]", parents, depth + 1)
    parents.discard(id(value))


def dumps(value: Any) -> str:
    """Canonical compact JSON of a value that passed :func:`check_json`."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def now_micros() -> int:
    """The current time as microseconds since the Unix epoch."""
    return time.time_ns() // 1000


# -- full-text search ----------------------------------------------------------------------------


def fts_terms(text: str) -> str:
    """What the FTS5 index stores for ``text``: its content tokens, space-separated."""
    return " ".join(content_tokens(text))


def fts_queries(query: str) -> tuple[str, ...]:
    """FTS5 ``MATCH`` expressions for a user query: every term, then any term.

    Each distinct content token (at most 32) is quoted as an FTS5 string, so the expression is
    always valid and nothing in ``query`` acts as FTS5 syntax. A query without content tokens
    (empty, only stopwords or punctuation) gives no expressions: it matches nothing.
    """
    tokens = list(dict.fromkeys(content_tokens(query)))[:_MAX_QUERY_TERMS]
    quoted = ['"' + token.replace('"', '""') + '"' for token in tokens]
    if len(quoted) <= 1:
        return tuple(quoted)
    return (" AND ".join(quoted), " OR ".join(quoted))


async def ranked_search(
    read: Callable[[Mapping[str, Any]], Awaitable[list[Row]]],
    query: str,
    params: Mapping[str, Any],
    *,
    limit: int,
) -> list[tuple[Row, float]]:
    """Run a ranked FTS5 statement for ``query``: matches of every term first, then of any.

    ``read(params)`` runs a statement that takes ``:q`` (the ``MATCH`` expression) and
    ``:limit``, returns the row's key first and ``bm25()`` last, best first. Scores are
    ``tier + s / (1 + s)`` with ``s = -bm25`` (so in ``[0, 1)`` within a tier) and tier 1 for
    rows containing every query term, 0 for the rest: higher is better, and a row with all the
    terms always outranks one with only some.

    Returns:
        ``(row, score)`` pairs, best first, at most ``limit``.
    """
    out: list[tuple[Row, float]] = []
    if limit <= 0:
        return out
    seen: set[Any] = set()
    for tier, expression in zip((1.0, 0.0), fts_queries(query), strict=False):
        if len(out) >= limit:
            break
        rows = await read({**params, "q": expression, "limit": sql_limit(limit + len(seen))})
        for row in rows:
            if row[0] in seen:
                continue
            seen.add(row[0])
            s = max(0.0, -float(row[-1]))
            out.append((row, tier + s / (1.0 + s)))
            if len(out) >= limit:
                break
    return out


def as_micros(value: datetime | None, what: str) -> int | None:
    """A date filter as microseconds since the epoch (naive datetimes are taken as UTC)."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise MemoryStoreError(f"{what} must be a datetime, got {type(value).__name__}")
    return to_micros(value)
