"""What the PostgreSQL memory tiers share: schema, connections, input checks, full-text queries.

Every tier lives in one schema (``schema=``, created if missing; else the first schema of the
connection's ``search_path``) and uses one :class:`~checkpointers._pg_db.PostgresDatabase`:
per-event-loop psycopg pools, migrations applied once in a transaction under an advisory lock
(any number of processes may open a fresh database at once), driver errors as
:class:`~graphexec.errors.StorageError`.

Schema (the ideas of the SQLite backend, :mod:`memory._sqlite_common`):

``graphexec_mem_items`` / ``graphexec_mem_facts`` / ``graphexec_mem_fact_history`` /
``graphexec_mem_blocks`` / ``graphexec_mem_ops``
    As in SQLite. Namespaces are canonical JSON arrays compared with ``=``; items, values and
    metadata are canonical JSON *text* (not ``jsonb``, which reorders keys and rewrites
    numbers), so they round-trip exactly. Session items and facts carry a ``tsv`` column
    (GIN-indexed) holding :func:`memory._text.content_tokens` under the ``simple``
    configuration: recall and fact search tokenise exactly as the SQLite backend does.
``graphexec_mem_archival_ns`` / ``graphexec_mem_passages`` / ``graphexec_mem_passage_tags`` /
``graphexec_mem_archival_ops``
    Archival passages: text with a generated ``english`` ``tsvector`` (GIN), float32 vectors
    as ``bytea``, tags in their own table, op keys, and per-namespace change counters.

Safety: every value is a bound parameter. The only identifier in SQL text is the schema name,
validated and quoted by :class:`PostgresDatabase`; full-text queries are built from word
tokens (letters and digits only) and passed as parameters to ``to_tsquery`` /
``websearch_to_tsquery``, so no user text can act as SQL or as tsquery syntax.

Writes that read before they write (next position, next version, op keys) take a transaction
advisory lock on what they change (a session, a fact, a block), so concurrent writers queue
instead of failing on a unique index; locks end with the transaction, which works through a
transaction-mode pooler.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

from checkpointers._pg_db import PostgresDatabase
from checkpointers._pg_db import Session as Conn
from graphexec.errors import MemoryStoreError
from memory._sqlite_common import check_namespace, check_text, sql_limit
from memory._text import content_tokens

__all__ = [
    "MIGRATIONS",
    "VERSION_TABLE",
    "Conn",
    "PgHandle",
    "lock",
    "no_nul",
    "open_database",
    "pg_namespace",
    "pg_text",
    "ranked_search",
    "tsquery_texts",
    "tsv_terms",
]

Row = tuple[Any, ...]

VERSION_TABLE = "graphexec_memory_schema"
_LOCK_NAMESPACE = 0x67786D65  # "gxme": first key of the memory tiers' advisory locks
_MAX_QUERY_TERMS = 32

MIGRATIONS: tuple[str, ...] = (
    f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} ("
    " version integer PRIMARY KEY, applied_at double precision NOT NULL)",
    # -- sessions and recall -----------------------------------------------------------------
    "CREATE TABLE graphexec_mem_items ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " session_id text NOT NULL,"
    " position bigint NOT NULL,"
    " ctx_order bigint NOT NULL,"
    " state text NOT NULL CHECK (state IN ('live', 'evicted', 'cleared')),"
    " item text NOT NULL,"
    " tsv tsvector NOT NULL,"
    " created_at bigint NOT NULL,"
    " UNIQUE (session_id, position))",
    "CREATE INDEX graphexec_mem_items_context"
    " ON graphexec_mem_items (session_id, ctx_order, seq) WHERE state = 'live'",
    "CREATE INDEX graphexec_mem_items_tsv ON graphexec_mem_items USING gin (tsv)",
    # -- facts -------------------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_facts ("
    " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " namespace text NOT NULL,"
    " key text NOT NULL,"
    " value text NOT NULL,"
    " source text,"
    " updated_at bigint NOT NULL,"
    " version bigint NOT NULL,"
    " last_write bigint NOT NULL,"
    " tsv tsvector NOT NULL,"
    " UNIQUE (namespace, key))",
    "CREATE INDEX graphexec_mem_facts_recent ON graphexec_mem_facts (namespace, last_write)",
    "CREATE INDEX graphexec_mem_facts_tsv ON graphexec_mem_facts USING gin (tsv)",
    "CREATE TABLE graphexec_mem_fact_history ("
    " id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " namespace text NOT NULL,"
    " key text NOT NULL,"
    " version bigint NOT NULL,"
    " value text,"
    " source text,"
    " at bigint NOT NULL,"
    " deleted boolean NOT NULL,"
    " UNIQUE (namespace, key, version))",
    # -- blocks ------------------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_blocks ("
    " namespace text NOT NULL,"
    " label text NOT NULL,"
    " value text NOT NULL,"
    " char_limit bigint NOT NULL,"
    " description text NOT NULL,"
    " read_only boolean NOT NULL,"
    " version bigint NOT NULL,"
    " deleted boolean NOT NULL,"
    " created_at bigint NOT NULL,"
    " updated_at bigint NOT NULL,"
    " PRIMARY KEY (namespace, label))",
    # -- idempotent writes -------------------------------------------------------------------
    "CREATE TABLE graphexec_mem_ops ("
    " tier text NOT NULL,"
    " scope text NOT NULL,"
    " op_key text NOT NULL,"
    " result text,"
    " at bigint NOT NULL,"
    " PRIMARY KEY (tier, scope, op_key))",
    # -- archival ----------------------------------------------------------------------------
    # One row per namespace: ``version`` is bumped by every write, ``epoch`` by every write that
    # changes or removes a vector; in-process vector caches compare both. Writers lock this row
    # first, so a namespace's passages commit in ``seq`` order (the caches rely on it).
    "CREATE TABLE graphexec_mem_archival_ns ("
    " nsid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " ns text NOT NULL UNIQUE,"
    " embedder text,"
    " dim integer,"
    " passages bigint NOT NULL DEFAULT 0,"
    " version bigint NOT NULL DEFAULT 0,"
    " epoch bigint NOT NULL DEFAULT 0)",
    "CREATE TABLE graphexec_mem_passages ("
    " seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " id text NOT NULL UNIQUE,"
    " nsid bigint NOT NULL REFERENCES graphexec_mem_archival_ns (nsid),"
    " text text NOT NULL,"
    " metadata text NOT NULL,"
    " created_at bigint NOT NULL,"
    " embedder text NOT NULL,"
    " dim integer NOT NULL,"
    " vector bytea NOT NULL,"
    " tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED)",
    "CREATE INDEX graphexec_mem_passages_by_time ON graphexec_mem_passages (nsid, created_at, seq)",
    "CREATE INDEX graphexec_mem_passages_by_seq ON graphexec_mem_passages (nsid, seq)",
    "CREATE INDEX graphexec_mem_passages_tsv ON graphexec_mem_passages USING gin (tsv)",
    "CREATE TABLE graphexec_mem_passage_tags ("
    " nsid bigint NOT NULL,"
    " tag text NOT NULL,"
    " passage bigint NOT NULL REFERENCES graphexec_mem_passages (seq) ON DELETE CASCADE,"
    " pos integer NOT NULL,"
    " PRIMARY KEY (nsid, tag, passage))",
    "CREATE INDEX graphexec_mem_passage_tags_by_passage"
    " ON graphexec_mem_passage_tags (passage, pos)",
    "CREATE TABLE graphexec_mem_archival_ops ("
    " nsid bigint NOT NULL,"
    " op_key text NOT NULL,"
    " passage_id text NOT NULL,"
    " PRIMARY KEY (nsid, op_key))",
)
"""The memory schema, one statement per version."""

# Parameters PostgreSQL cannot type by itself (strings and NULLs in ``:p IS NULL``).
_PARAM_TYPES = {
    "session_id": "text",
    "after": "bigint",
    "before": "bigint",
    "source": "text",
    "result": "text",
    "value": "text",
    "terms": "text",
    "q": "text",
    "embedder": "text",
    "dim": "integer",
    "scope": "text",
}

OP_GET = (
    "SELECT result FROM graphexec_mem_ops"
    " WHERE tier = :tier AND scope = :scope AND op_key = :op_key"
)
OP_PUT = (
    "INSERT INTO graphexec_mem_ops (tier, scope, op_key, result, at)"
    " VALUES (:tier, :scope, :op_key, :result, :at)"
)


def open_database(
    dsn: str,
    *,
    owner: str,
    schema: str | None,
    pool_min: int = 1,
    pool_max: int = 10,
    pool_timeout: float = 30.0,
) -> PostgresDatabase:
    """A :class:`PostgresDatabase` with the memory schema, in ``schema``."""
    if not isinstance(dsn, str) or not dsn:
        raise MemoryStoreError(f"{owner}: dsn must be a non-empty PostgreSQL DSN string")
    try:
        return PostgresDatabase(
            dsn,
            owner=owner,
            migrations=MIGRATIONS,
            version_table=VERSION_TABLE,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
            param_types=_PARAM_TYPES,
        )
    except ValueError as e:
        raise MemoryStoreError(f"{owner}: {e}") from None


class PgHandle:
    """Lifecycle shared by the PostgreSQL tiers: a database they own, or one they borrow."""

    _db: PostgresDatabase
    _owns_db: bool

    def _init_handle(self, db: PostgresDatabase, *, owns: bool) -> None:
        self._db = db
        self._owns_db = owns

    async def setup(self) -> None:
        """Open this event loop's pool and create or migrate the schema. Idempotent.

        Optional: the first operation does it too.

        Raises:
            StorageError: The server cannot be reached, or a newer graphexec wrote the schema.
        """
        await self._db.open()

    async def aclose(self) -> None:
        """Close the pools this object opened (none when it borrows its owner's)."""
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


def no_nul(value: str, what: str) -> str:
    """``value`` unless it holds a NUL character, which PostgreSQL text cannot store."""
    if "\x00" in value:
        raise MemoryStoreError(
            f"{what} contains a NUL character (\\x00), which PostgreSQL cannot store in text; "
            "remove it"
        )
    return value


def pg_text(value: object, what: str, *, empty: bool = False) -> str:
    """:func:`~memory._sqlite_common.check_text`, and no NUL character."""
    return no_nul(check_text(value, what, empty=empty), what)


def pg_namespace(namespace: object) -> tuple[str, ...]:
    """:func:`~memory._sqlite_common.check_namespace`, and no NUL character in any part."""
    ns = check_namespace(namespace)
    for part in ns:
        no_nul(part, f"namespace {ns!r}")
    return ns


async def lock(conn: Conn, *parts: str) -> None:
    """Take a transaction advisory lock on ``parts`` (e.g. ``("session", id)``)."""
    await conn.fetch(
        "SELECT pg_advisory_xact_lock(:lock_ns, hashtext(:scope))",
        {"lock_ns": _LOCK_NAMESPACE, "scope": json.dumps(parts, ensure_ascii=False)},
    )


# -- full-text search ----------------------------------------------------------------------------


def tsv_terms(text: str) -> str:
    """What a ``tsv`` column indexes for ``text`` (``to_tsvector('simple', ...)`` of it)."""
    return " ".join(content_tokens(text))


def tsquery_texts(query: str) -> tuple[str, ...]:
    """``to_tsquery('simple', ...)`` inputs for a user query: every term, then any term.

    Tokens are words of letters and digits (see :func:`memory._text.words`), so joining them
    with ``&`` / ``|`` gives a valid tsquery in which nothing the user typed is an operator. A
    query without content tokens gives no inputs: it matches nothing.
    """
    # Each token is also quoted as a tsquery operand, so even a character the text-search
    # parser reads as punctuation cannot form an operator.
    tokens = [
        "'" + token.replace("\\", "\\\\").replace("'", "''") + "'"
        for token in dict.fromkeys(content_tokens(query))
    ][:_MAX_QUERY_TERMS]
    if not tokens:
        return ()
    if len(tokens) == 1:
        return (tokens[0],)
    return (" & ".join(tokens), " | ".join(tokens))


async def ranked_search(
    read: Callable[[Mapping[str, Any]], Awaitable[list[Row]]],
    query: str,
    params: Mapping[str, Any],
    *,
    limit: int,
) -> list[tuple[Row, float]]:
    """Run a ranked full-text statement: rows with every term first, then with any.

    ``read(params)`` runs a statement taking ``:q`` (a ``to_tsquery('simple', ...)`` input) and
    ``:limit`` that returns the row's key first and ``ts_rank`` last, best first. Scores are
    ``tier + r / (1 + r)``: tier 1 for rows holding every term, 0 for the rest.
    """
    out: list[tuple[Row, float]] = []
    if limit <= 0:
        return out
    seen: set[Any] = set()
    for tier, expression in zip((1.0, 0.0), tsquery_texts(query), strict=False):
        if len(out) >= limit:
            break
        rows = await read({**params, "q": expression, "limit": sql_limit(limit + len(seen))})
        for row in rows:
            if row[0] in seen:
                continue
            seen.add(row[0])
            r = max(0.0, float(row[-1]))
            out.append((row, tier + r / (1.0 + r)))
            if len(out) >= limit:
                break
    return out
