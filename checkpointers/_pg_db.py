"""Connections to one PostgreSQL database: per-event-loop pools, migrations, retried statements.

Kept apart from the checkpointer so other PostgreSQL stores (the ``memory`` package, the run
queue) can reuse it: give :class:`PostgresDatabase` your own migration list and version table.

- Pools (:class:`psycopg_pool.AsyncConnectionPool`) are opened lazily, one per event loop,
  because a pool's connections and worker tasks belong to the loop that opened it (the engine's
  sync facade runs on a private background loop, tests and ``asyncio.run`` on others).
  :meth:`PostgresDatabase.aclose` closes them all, each on its own loop.
- Connections are in autocommit mode: a single statement is its own transaction (one round trip,
  commit included); :meth:`PostgresDatabase.transaction` wraps several in ``BEGIN`` ... ``COMMIT``.
- No session state: no ``SET`` outside a transaction, no session advisory locks, no ``LISTEN``,
  no temporary tables and, unless ``prepare=True``, no server-side prepared statements, so every
  statement works through a transaction-mode pooler such as PgBouncer.
- Statements are written once with ``:name`` parameters (the shared SQL of ``_sql.py``);
  :meth:`PostgresDatabase.sql` rewrites them to psycopg's ``%(name)s`` and, with ``schema=``,
  qualifies the store's own tables (taken from the ``CREATE TABLE`` statements of the
  migrations) with the schema, so nothing depends on the connection's ``search_path``.
- Migrations run in one transaction under ``pg_advisory_xact_lock``: any number of processes
  may open a fresh database at once and each migration is applied exactly once. (A future
  migration that needs ``CREATE INDEX CONCURRENTLY`` cannot run in a transaction; none does.)
- Driver errors become :class:`~graphexec.errors.StorageError` naming the operation and the
  server (never the password). A statement that fails because its connection broke (the server
  restarted, the backend was terminated, the network dropped) or because PostgreSQL chose it as
  a deadlock or serialization victim is retried on a fresh connection; the caller's function is
  told the attempt number, so a non-idempotent write can recognise its own earlier commit.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

from graphexec.errors import StorageError

__all__ = ["ATTEMPTS", "PostgresDatabase", "Session", "describe_dsn", "sql_text"]

T = TypeVar("T")
Row = tuple[Any, ...]

ATTEMPTS = 3
"""Tries of an operation whose connection broke, or that lost a deadlock."""
_RETRY_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
_LOCK_NAMESPACE = 0x67786563  # "gxec": first key of the migration advisory lock
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_CREATE_TABLE = re.compile(
    r"CREATE\s+(?:TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?|(?:OR\s+REPLACE\s+)?FUNCTION\s+)"
    r"([A-Za-z_]\w*)",
    re.I,
)
"""The store's own tables and functions, qualified with ``schema=`` in every statement."""
_QUOTED = r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\$\$.*?\$\$"
_SPACE = r"(?:\s|--[^\n]*)+"
_PARAM = r"(?<![:\w]):([A-Za-z_]\w*)"


def sql_text(
    query: str,
    *,
    tables: Iterable[str] = (),
    schema: str | None = None,
    types: Mapping[str, str] | None = None,
) -> str:
    """``query`` rewritten for psycopg: ``:name`` to ``%(name)s``, ``tables`` schema-qualified.

    Quoted text (``'...'``, ``"..."``, ``$$...$$``) is left alone but for escaping ``%``, as
    every other ``%`` is; ``::type`` casts are not parameters. A parameter named in ``types``
    gets that cast (psycopg sends strings and ``None`` untyped, and PostgreSQL cannot infer the
    type of ``:p IS NULL``). Table names are matched as whole words, so index names that start
    with a table's name are not touched. Comments are dropped and runs of whitespace become one
    space: without prepared statements the server parses every statement every time, and the
    commit statement parses measurably faster so.
    """
    casts = types or {}
    names = sorted(set(tables), key=len, reverse=True) if schema is not None else []
    table = "|".join(map(re.escape, names)) or r"(?!)"
    tokens = re.compile(rf"({_QUOTED})|({_SPACE})|{_PARAM}|(?<![\w.])({table})(?!\w)|(%)", re.S)

    def rewrite(m: re.Match[str]) -> str:
        quoted, space, param, name, _percent = m.groups()
        if quoted is not None:
            return quoted.replace("%", "%%")
        if space is not None:
            return " "
        if param is not None:
            cast = casts.get(param)
            return f"%({param})s" if cast is None else f"%({param})s::{cast}"
        if name is not None:
            assert schema is not None
            return f"{_quote(schema)}.{name}"
        return "%%"

    return tokens.sub(rewrite, query).strip()


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def describe_dsn(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, for messages (never the password)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as e:
        raise ValueError(f"invalid PostgreSQL DSN: {e}") from None
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = str(params.get("port") or 5432)
    dbname = str(params.get("dbname") or params.get("user") or "")
    return f"{host}:{port}/{dbname}"


class Session:
    """One connection lent to an operation: statements go through :meth:`PostgresDatabase.sql`.

    Attributes:
        conn: The psycopg connection (autocommit; inside a transaction when lent by
            :meth:`PostgresDatabase.transaction`).
        attempt: 1 on the first try; higher when the operation is being retried after its
            connection broke, in which case an earlier try may have committed.
    """

    __slots__ = ("_db", "attempt", "conn")

    def __init__(self, db: PostgresDatabase, conn: psycopg.AsyncConnection[Any], attempt: int):
        self._db = db
        self.conn = conn
        self.attempt = attempt

    async def fetch(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one statement and return its rows (``[]`` for a statement without any)."""
        cur = await self.conn.execute(self._db.sql(query), params or {})
        return await cur.fetchall() if cur.description is not None else []

    async def fetch_one(self, query: str, params: Mapping[str, Any] | None = None) -> Row | None:
        """Run one statement and return its first row, or ``None``."""
        rows = await self.fetch(query, params)
        return rows[0] if rows else None

    async def execute_many(self, query: str, params: Sequence[Mapping[str, Any]]) -> None:
        """Run one statement once per parameter set (pipelined by psycopg)."""
        if params:
            async with self.conn.cursor() as cur:
                await cur.executemany(self._db.sql(query), params)


@dataclass(eq=False, slots=True)
class _LoopPool:
    """The pool one event loop uses, and every connection it opened."""

    loop: asyncio.AbstractEventLoop
    pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]
    conns: weakref.WeakSet[psycopg.AsyncConnection[Any]] = field(default_factory=weakref.WeakSet)

    def close_connections(self) -> None:
        """Close every connection of the pool without its loop (that loop is gone or busy)."""
        for conn in list(self.conns):
            if not conn.closed:
                conn.pgconn.finish()


_closing: set[asyncio.Future[Any]] = set()  # pool closes scheduled by __del__ (keep them alive)


def _close_on_own_loop(pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
    task = asyncio.ensure_future(pool.close())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


class PostgresDatabase:
    """Per-event-loop psycopg pools for one PostgreSQL database, with versioned migrations.

    Args:
        dsn: A libpq connection string or URI.
        owner: How the owning store names itself in errors and warnings.
        migrations: The schema as an ordered list of single SQL statements, index = version.
            ``migrations[0]`` must create ``version_table`` (``IF NOT EXISTS``).
        version_table: Records ``(version, applied_at)`` per applied migration.
        schema: Keep the tables in this schema (created if missing) instead of the first schema
            of the connection's ``search_path``.
        pool_min: Connections each event loop's pool keeps open.
        pool_max: Most connections each event loop's pool opens.
        pool_timeout: Seconds an operation waits for a free connection before failing.
        prepare: Let psycopg prepare frequently used statements on the server (faster on a
            direct connection; needs a pooler that supports prepared statements).
        param_types: SQL types of parameters that PostgreSQL cannot always infer (strings
            and ``None``), by name; see :func:`sql_text`.
    """

    def __init__(
        self,
        dsn: str,
        *,
        owner: str,
        migrations: Sequence[str],
        version_table: str,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
        prepare: bool = False,
        param_types: Mapping[str, str] | None = None,
    ) -> None:
        if pool_min < 0 or pool_max < max(pool_min, 1):
            raise ValueError(
                f"need 0 <= pool_min <= pool_max and pool_max >= 1, got pool_min={pool_min}, "
                f"pool_max={pool_max}"
            )
        if pool_timeout <= 0:
            raise ValueError(f"pool_timeout must be > 0 seconds, got {pool_timeout}")
        if schema is not None and not _IDENTIFIER.fullmatch(schema):
            raise ValueError(
                f"schema must be an SQL identifier of at most 63 characters, got {schema!r}"
            )
        if not _IDENTIFIER.fullmatch(version_table):
            raise ValueError(f"version_table must be an SQL identifier, got {version_table!r}")
        self.where = describe_dsn(dsn) + ("" if schema is None else f" (schema {schema})")
        """``host:port/dbname`` and the schema, for messages."""
        self.schema = schema
        self.pool_timeout = float(pool_timeout)
        self._dsn = dsn
        self._owner = owner
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        if not prepare:
            self._connect_kwargs["prepare_threshold"] = None
        self._pool_min = pool_min
        self._pool_max = pool_max
        self._migrations = tuple(migrations)
        self._tables = frozenset(
            m.group(1) for s in self._migrations for m in _CREATE_TABLE.finditer(s)
        )
        self._version_table = version_table
        self._types = dict(param_types or {})
        self._sql: dict[str, str] = {}
        self._guard = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, _LoopPool] = {}
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._schema_ready = False
        self._closed = False

    @property
    def schema_version(self) -> int:
        """The version a fully migrated database records."""
        return len(self._migrations) - 1

    def sql(self, query: str) -> str:
        """``query`` (``:name`` parameters, unqualified table names) as psycopg runs it."""
        text = self._sql.get(query)
        if text is None:
            text = sql_text(query, tables=self._tables, schema=self.schema, types=self._types)
            self._sql[query] = text
        return text

    def table(self, name: str) -> str:
        """``name`` as a (schema-qualified, quoted) table reference for a text parameter."""
        return name if self.schema is None else f"{_quote(self.schema)}.{name}"

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open this loop's pool (migrating the schema on first use)."""
        await self._pool()

    async def aclose(self) -> None:
        """Close every pool, whichever loop opened it. Final."""
        with self._guard:
            self._closed = True
            entries = list(self._by_loop.values())
            self._by_loop.clear()
            self._gates.clear()
        for entry in entries:
            await _close_pool(entry)

    def __del__(self) -> None:
        by_loop = getattr(self, "_by_loop", None)
        if not by_loop:
            return
        warnings.warn(
            f"{self._owner} was garbage-collected with open connections; close it with 'await "
            "aclose()' or open it with 'async with ... .open(...)'",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )
        for entry in list(by_loop.values()):
            if entry.loop.is_running() and not entry.loop.is_closed():
                entry.loop.call_soon_threadsafe(_close_on_own_loop, entry.pool)
            else:
                entry.close_connections()
        by_loop.clear()

    async def _pool(self) -> psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        loop = asyncio.get_running_loop()
        entry = self._by_loop.get(loop)
        if entry is not None:
            return entry.pool
        with self._guard:
            if self._closed:
                raise StorageError(f"{self._owner} is closed; open a new one")
            gate = self._gates.setdefault(loop, asyncio.Lock())
        async with gate:
            entry = self._by_loop.get(loop)
            if entry is None:
                entry = await self._connect(loop)
        return entry.pool

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _LoopPool:
        with self._guard:
            dead = [e for lp, e in self._by_loop.items() if lp.is_closed()]
            for e in dead:
                del self._by_loop[e.loop]
                self._gates.pop(e.loop, None)
        for e in dead:  # their loop is gone (asyncio.run returned): nobody else can use them
            e.close_connections()
        if not self._schema_ready:
            await self._migrate()
        conns: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()

        async def remember(conn: psycopg.AsyncConnection[Any]) -> None:
            conns.add(conn)  # (a closure over the set only: the pool must not keep self alive)

        pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]
        pool = psycopg_pool.AsyncConnectionPool(
            self._dsn,
            min_size=self._pool_min,
            max_size=self._pool_max,
            kwargs=dict(self._connect_kwargs),
            configure=remember,
            timeout=self.pool_timeout,
            name=f"graphexec-{id(self):x}",
            open=False,
        )
        await pool.open(wait=False)
        entry = _LoopPool(loop, pool, conns)
        with self._guard:
            closed = self._closed
            if not closed:
                self._by_loop[loop] = entry
        if closed:
            await pool.close()
            raise StorageError(f"{self._owner} is closed; open a new one")
        return entry

    async def _migrate(self) -> None:
        try:
            conn = await psycopg.AsyncConnection.connect(self._dsn, **self._connect_kwargs)
        except psycopg.Error as e:
            raise StorageError(f"cannot connect to PostgreSQL at {self.where}: {e}") from e
        try:
            async with conn:
                session = Session(self, conn, 1)
                # Fast path without the lock: an up-to-date database needs nothing.
                current = await self._current_version(session)
                if current != self.schema_version:
                    async with conn.transaction():
                        await self._apply_migrations(session)
        except psycopg.Error as e:
            raise StorageError(f"PostgreSQL migrate on {self.where} failed: {e}") from e
        self._schema_ready = True

    async def _catalog_state(self, s: Session) -> tuple[bool, bool]:
        """Whether the schema and the version table exist, read from the catalogs under MVCC.

        Not ``to_regclass`` or ``IF NOT EXISTS``: those consult the backend's catalog caches,
        which a backend that just waited for the migration lock may not have refreshed (seen
        through PgBouncer, whose warm backends then tried to create a schema another migrator
        had just committed).
        """
        [(schema, table)] = await s.fetch(
            """SELECT
                EXISTS (SELECT 1 FROM pg_catalog.pg_namespace AS n
                        WHERE n.nspname = coalesce(:schema::text, current_schema())),
                EXISTS (SELECT 1 FROM pg_catalog.pg_class AS c
                        JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                        WHERE n.nspname = coalesce(:schema::text, current_schema())
                          AND c.relname = :version_table::text)""",
            {"schema": self.schema, "version_table": self._version_table},
        )
        return bool(schema), bool(table)

    async def _current_version(self, s: Session) -> int | None:
        _, exists = await self._catalog_state(s)
        return await self._recorded_version(s) if exists else None

    async def _recorded_version(self, s: Session) -> int | None:
        [(version,)] = await s.fetch(f"SELECT max(version) FROM {self._version_table}")
        version = None if version is None else int(version)
        if version is not None:
            self._refuse_newer(version)
        return version

    async def _apply_migrations(self, s: Session) -> None:
        # Serialises every migrator of this schema; released by COMMIT (no session state).
        await s.fetch(
            "SELECT pg_advisory_xact_lock(:namespace, hashtext(coalesce(:schema::text, "
            "current_schema())))",
            {"namespace": _LOCK_NAMESPACE, "schema": self.schema},
        )
        schema_exists, table_exists = await self._catalog_state(s)
        if self.schema is not None and not schema_exists:
            await s.fetch(f"CREATE SCHEMA {_quote(self.schema)}")
        current = None
        if table_exists:
            current = await self._recorded_version(s)
        else:
            await s.fetch(self._migrations[0])
        start = 0 if current is None else current + 1
        for version in range(start, len(self._migrations)):
            if version > 0:
                await s.fetch(self._migrations[version])
            await s.fetch(
                f"INSERT INTO {self._version_table} (version, applied_at) "
                "VALUES (:version, :applied_at)",
                {"version": version, "applied_at": time.time()},
            )

    def _refuse_newer(self, version: int) -> None:
        if version > self.schema_version:
            raise StorageError(
                f"PostgreSQL database {self.where} has {self._version_table} schema version "
                f"{version}, newer than this graphexec supports ({self.schema_version}); "
                "upgrade graphexec"
            )

    # -- statements -------------------------------------------------------------------------

    async def fetch(
        self, op: str, query: str, params: Mapping[str, Any] | None = None
    ) -> list[Row]:
        """Run one statement (its own transaction) and return its rows."""
        return await self.run(op, lambda s: s.fetch(query, params))

    async def run(self, op: str, body: Callable[[Session], Awaitable[T]]) -> T:
        """Run ``body`` with a pooled connection in autocommit mode; retry it if that broke.

        ``body`` may run more than once (see :class:`Session`'s ``attempt``), so it must have
        no effects outside the database. Driver errors become
        :class:`~graphexec.errors.StorageError`; whatever else it raises propagates.
        """
        pool = await self._pool()
        attempt = 1
        while True:
            broken = False
            try:
                async with pool.connection() as conn:
                    try:
                        return await body(Session(self, conn, attempt))
                    except psycopg.Error as e:
                        if attempt >= ATTEMPTS or not _retryable(e, conn):
                            raise self._storage_error(op, e, attempt) from e
                        broken = conn.broken or conn.closed
            except psycopg_pool.PoolTimeout as e:
                raise StorageError(
                    f"PostgreSQL {op} on {self.where} failed: no connection became available "
                    f"within pool_timeout={self.pool_timeout}s ({e})"
                ) from e
            except psycopg.Error as e:  # returning a broken connection to the pool
                raise self._storage_error(op, e, attempt) from e
            if broken:
                # One dead connection usually means the others died with it (a server restart,
                # a pooler or firewall dropping idle connections): test the idle ones now,
                # rather than failing the next attempts on them one by one.
                await pool.check()
            attempt += 1

    async def transaction(self, op: str, body: Callable[[Session], Awaitable[T]]) -> T:
        """Like :meth:`run`, with ``body`` inside one ``BEGIN`` ... ``COMMIT`` transaction.

        Whatever ``body`` raises rolls the transaction back. If the connection breaks while
        ``COMMIT`` is in flight the outcome is unknown and the whole body runs again: a retried
        body that writes must recognise its own earlier commit, or be idempotent.
        """

        async def in_transaction(s: Session) -> T:
            async with s.conn.transaction():
                return await body(s)

        return await self.run(op, in_transaction)

    def _storage_error(self, op: str, error: psycopg.Error, attempts: int) -> StorageError:
        detail = str(error).strip() or type(error).__name__
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        return StorageError(f"PostgreSQL {op} on {self.where} failed{tries}: {detail}")


def _retryable(error: psycopg.Error, conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether ``error`` left nothing written for sure, or at worst a commit to recognise."""
    if error.sqlstate in _RETRY_SQLSTATES:
        return True
    return isinstance(error, psycopg.OperationalError) and (conn.broken or conn.closed)


async def _close_pool(entry: _LoopPool) -> None:
    """Close a pool on its own loop; close its connections directly if that loop cannot."""
    loop = entry.loop
    if loop is asyncio.get_running_loop():
        await entry.pool.close()
    elif loop.is_running() and not loop.is_closed():
        try:
            future = asyncio.run_coroutine_threadsafe(entry.pool.close(), loop)
            await asyncio.wait_for(asyncio.wrap_future(future), timeout=10)
        except (RuntimeError, TimeoutError):  # the loop stopped meanwhile, or hangs
            entry.close_connections()
    else:
        entry.close_connections()
