"""Connections to one SQLite file: per event loop, WAL, retried ``BEGIN IMMEDIATE`` transactions.

Kept apart from the checkpointer so other SQLite stores (the ``memory`` package) can reuse it:
give :class:`SqliteDatabase` your own migration list and version table.

- Connections are opened lazily, one writer and one reader per event loop, and closed together
  by :meth:`SqliteDatabase.aclose`.
- A write is a plain function run as one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction on the
  connection's own thread (aiosqlite gives every connection one). The whole transaction is one
  hop to that thread: statements of concurrent callers can never interleave inside it, and it
  runs to commit or rollback even if the awaiting task is cancelled.
- A transaction that finds the file locked waits ``busy_timeout`` (SQLite's busy handler) and
  is then retried whole, a few times, with jittered backoff. Any failure rolls it back; driver
  errors surface as :class:`~graphexec.errors.StorageError` naming the file and the operation.
- Small writes run on the event loop's own thread (``loop_writes``, on by default for files
  in ``synchronous=NORMAL``): a chain step's checkpoint, a few rows committed to the WAL
  without an fsync, takes about 55 us there, against a ~120 us round trip to the connection's
  thread on 2 vCPUs, most of it two thread wake-ups. Such a write never waits on the loop:
  its connection has no busy timeout, so a file locked by anyone else sends the write to the
  writer's thread, which waits and retries as above; nor does it ever checkpoint
  (``wal_autocheckpoint=0``): every :data:`DIRECT_RUN`-th write goes to the writer's thread,
  whose commit runs SQLite's autocheckpoint when the WAL is due. Callers opt in per write, for
  transactions they know to be small (:data:`DIRECT_MAX_BYTES`); ``synchronous=FULL`` (an
  fsync per commit) and ``":memory:"`` never write on the loop.
- Reads are single statements on the reader connection (``query_only``), so each is one
  consistent snapshot and never waits behind a write.
- WAL checkpoints: by default SQLite's own (``wal_autocheckpoint=1000`` pages), which make
  about every 200th commit checkpoint inline: 4-5 ms instead of ~0.1 ms, holding the file's
  write lock meanwhile. With ``wal_checkpoints="background"`` a daemon thread per file
  (:class:`WalCheckpoints`) runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection
  every :data:`CHECKPOINT_EVERY` commits, which never blocks readers or writers, and the
  writers' autocheckpoint is a safety net only (:data:`AUTOCHECKPOINT` pages; the WAL file
  shrinks back to :data:`WAL_SIZE_LIMIT` when writes pause). That removes the slow commits
  (p99.9 of a chain's commits 3.6 ms -> 0.6-1.2 ms) but costs throughput on a small machine:
  measured on 2 CPUs, the 10-node chain is 3-5% slower, ``async`` commits' median 5-40% slower
  (the thread's fsyncs compete with them), and a 500-turn chat's turn time grows more (1.25x
  against 1.19x) because the WAL stays longer between restarts. Hence opt-in: for many
  processes writing one file, where a lock held 4 ms stalls all of them. ``":memory:"`` has
  no WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import re
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import aiosqlite

from graphexec.errors import StorageError

__all__ = [
    "ATTEMPTS",
    "AUTOCHECKPOINT",
    "CHECKPOINT_EVERY",
    "DIRECT_MAX_BYTES",
    "DIRECT_RUN",
    "WAL_SIZE_LIMIT",
    "OffTheLoop",
    "SqliteDatabase",
    "WalCheckpoints",
    "fetch",
    "is_busy",
    "on_loop",
]

T = TypeVar("T")
Row = tuple[Any, ...]

ATTEMPTS = 5
"""Tries of a whole transaction that keeps finding the database locked."""
_BACKOFF = 0.01
_MAX_BACKOFF = 0.25
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

AUTOCHECKPOINT = 10_000
"""WAL pages after which a writer's commit checkpoints inline (SQLite's ``wal_autocheckpoint``),
with background checkpoints.

A safety net: it bounds the WAL (about 40 MB of 4 KiB pages). The WAL file starts over only at
a commit that finds it wholly checkpointed, which a background checkpoint achieves when the
writes pause; under writes that never pause, commits land during every checkpoint, the WAL
grows to this size, and the commit that reaches it copies what the background left (at most
about :data:`CHECKPOINT_EVERY` commits' pages) and lets the WAL start over."""
WAL_SIZE_LIMIT = 4 * 1024 * 1024
"""Bytes a writer truncates the WAL file to when it starts it over (``journal_size_limit``),
with background checkpoints.

SQLite reuses a WAL file from its start without shrinking it, so without a limit a burst that
grew it toward :data:`AUTOCHECKPOINT` pages would leave ~40 MB on disk for as long as the file
is open. With it, the first commit after writes pause and a background checkpoint completes
brings the WAL back to 4 MiB, what SQLite's default autocheckpoint keeps it near."""
CHECKPOINT_EVERY = 50
"""Successful write transactions between two wake-ups of the background checkpoint.

On the 10-node chain (about 5 WAL pages per commit) 50 and 100 measured alike, 200 let some
4 ms commits through again (``async`` durability), and 25 was no better while checkpointing
twice as often."""
DIRECT_MAX_BYTES = 64 * 1024
"""Most bytes of stored data a write may carry to run on the event loop's thread.

About 0.1 ms of loop time at most (copying pages into the WAL); larger writes go to the
writer's thread, where their cost does not stall other tasks."""
DIRECT_RUN = 64
"""Writes in a row on the loop's thread before one goes to the writer's thread.

The loop's connection never checkpoints (that can take milliseconds with an fsync), so the
WAL grows past SQLite's ``wal_autocheckpoint`` by at most this many small commits before a
writer's commit checkpoints it."""
_STOP_TIMEOUT = 10.0
"""Seconds :meth:`SqliteDatabase.aclose` waits for a checkpoint in progress to finish."""


def is_busy(error: sqlite3.Error) -> bool:
    """Whether ``error`` means another connection holds a lock we need (worth retrying)."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return True
    text = str(error).lower()
    return "database is locked" in text or "database is busy" in text


def fetch(db: sqlite3.Connection, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
    """Run one statement and return all its rows (an empty list for DML without RETURNING)."""
    return db.execute(query, params or {}).fetchall()


def _in_transaction(db: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` between ``BEGIN IMMEDIATE`` and ``COMMIT``; roll back on any failure."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = body(db)
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    return result


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # aiosqlite runs every call of a connection on that connection's thread through
    # Connection._execute; it offers no public way to run a function of ours there. Running a
    # whole transaction as one call costs one thread hop instead of one per statement (about 4x
    # less latency per commit) and makes the transaction atomic with respect to cancellation.
    # Both names exist unchanged from aiosqlite 0.17 to 0.22; test_sqlite_storage pins them.
    execute = cast(Callable[..., Awaitable[T]], conn._execute)
    return await execute(fn, conn._conn)


class OffTheLoop(Exception):
    """Raised by a write's body on the event loop's thread to be run on the writer's instead.

    For a body that finds, part way, that it must do more than its ``size`` promised (read and
    decode a whole checkpoint): :meth:`SqliteDatabase.write` rolls the transaction back and
    runs the body again on the writer's thread. See :func:`on_loop`.
    """


class _LoopConnection(sqlite3.Connection):
    """The connection of writes on the event loop's thread (see :func:`on_loop`)."""

    graphexec_on_loop = True


def on_loop(db: sqlite3.Connection) -> bool:
    """Whether a write's body is running on the event loop's thread (see :class:`OffTheLoop`)."""
    # An attribute rather than isinstance(), so that a connection proxy passes it through.
    return getattr(db, "graphexec_on_loop", False) is True


def _on_loop(db: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    # The direct counterpart of _on_thread: run fn on a connection owned by the calling loop's
    # thread. A function of its own so tests can wrap both paths the same way.
    return fn(db)


def _configure(
    db: sqlite3.Connection,
    *,
    where: str | None,
    synchronous: str,
    query_only: bool,
    autocheckpoint: int | None,
    functions: Mapping[str, Callable[[Any], Any]],
) -> None:
    for name, fn in functions.items():
        db.create_function(name, 1, fn, deterministic=True)
    if where is not None:
        [(mode,)] = fetch(db, "PRAGMA journal_mode=WAL")
        if str(mode).lower() != "wal":
            raise StorageError(
                f"SQLite database {where} cannot use WAL journaling (got {mode!r}); put it on a "
                "local file system"
            )
    db.execute(f"PRAGMA synchronous={synchronous}")
    if query_only:
        db.execute("PRAGMA query_only=ON")
    elif autocheckpoint is not None:
        db.execute(f"PRAGMA wal_autocheckpoint={autocheckpoint}")
        db.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")


def _schema_version(db: sqlite3.Connection, *, query: str) -> int | None:
    try:
        [(v,)] = fetch(db, query)
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return None
        raise
    return None if v is None else int(v)


def _refuse_newer(version: int, supported: int, where: str) -> None:
    if version > supported:
        raise StorageError(
            f"SQLite database {where} has schema version {version}, newer than this graphexec "
            f"supports ({supported}); upgrade graphexec"
        )


def _apply_migrations(
    db: sqlite3.Connection,
    *,
    migrations: Sequence[str],
    version_sql: str,
    record_sql: str,
    where: str,
) -> None:
    db.execute(migrations[0])
    current = _schema_version(db, query=version_sql)
    current = -1 if current is None else current
    _refuse_newer(current, len(migrations) - 1, where)
    for v in range(current + 1, len(migrations)):
        if v > 0:
            db.execute(migrations[v])
        db.execute(record_sql, {"version": v, "applied_at": time.time()})


@dataclass(eq=False, slots=True)
class _LoopConnections:
    """The connections one event loop uses."""

    loop: asyncio.AbstractEventLoop
    writer: aiosqlite.Connection
    reader: aiosqlite.Connection
    direct: sqlite3.Connection | None = None
    """A plain connection for small writes run on the loop's own thread (see
    :meth:`SqliteDatabase.write`); ``None`` when the database does not allow them."""
    direct_writes: int = 0
    """Writes run on ``direct`` since the last one sent to the writer's thread."""

    def all(self) -> list[aiosqlite.Connection]:
        return [self.writer] if self.reader is self.writer else [self.writer, self.reader]

    def close_direct(self) -> None:
        """Close the direct connection, if any, from any thread.

        A write of its loop still running on it then fails with a
        :class:`~graphexec.errors.StorageError`, as one on the connections' threads does when
        the store is closed under it.
        """
        direct, self.direct = self.direct, None
        if direct is not None:
            with contextlib.suppress(sqlite3.Error):
                direct.close()


def _stop_all(conns: Sequence[aiosqlite.Connection]) -> None:
    for conn in conns:
        with contextlib.suppress(Exception):
            conn.stop()


async def _close(conn: aiosqlite.Connection) -> None:
    # A connection thread dies if it answers a call whose event loop was closed in the meantime
    # (a cancelled call, then asyncio.run() returned); closing it then would wait forever.
    thread = conn if isinstance(conn, threading.Thread) else getattr(conn, "_thread", None)
    if isinstance(thread, threading.Thread) and not thread.is_alive():
        return
    with contextlib.suppress(sqlite3.Error, ValueError):
        await conn.close()


def _daemonize(conn: aiosqlite.Connection) -> threading.Thread | None:
    # aiosqlite runs each connection in a non-daemon thread (the Connection itself before 0.22):
    # a store a sync script never closed would keep the interpreter from exiting. Exiting with it
    # open is as safe as a crash (every commit that returned is in the file), so let it exit.
    thread = conn if isinstance(conn, threading.Thread) else getattr(conn, "_thread", None)
    if not isinstance(thread, threading.Thread):
        return None
    if not thread.is_alive():
        thread.daemon = True
    return thread


class WalCheckpoints:
    """Passive WAL checkpoints of one database file on a daemon thread of their own.

    :meth:`poke` wakes the thread; it then runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own
    plain ``sqlite3`` connection (opened on first use, with the file's ``synchronous``: the
    checkpoint's fsyncs are SQLite's business). A passive checkpoint copies what it can without
    waiting for any lock and never blocks readers or writers, so the commit path never waits
    for it; once it has copied the whole WAL, the next commit starts the WAL file over.

    Pokes that arrive during a checkpoint coalesce into one more run. A busy or locked file
    (another connection checkpointing) is normal and skipped until the next poke; a reader on
    an old snapshot only limits what can be copied. Any other failure is kept in :attr:`error`
    (the first one) and counted in :attr:`failures`; the owner reports it (see
    :meth:`SqliteDatabase.write`) and later pokes try again.

    The thread holds no reference to its owner, so an unclosed owner can still be collected
    (its ``__del__`` calls :meth:`stop`), and as a daemon it never keeps the interpreter from
    exiting.

    Args:
        path: The database file.
        synchronous: SQLite's ``synchronous`` pragma for the checkpoint connection.
        name: The thread's name.
    """

    def __init__(self, path: str, *, synchronous: str, name: str) -> None:
        self._path = path
        self._synchronous = synchronous
        self._wake = threading.Event()
        self._stopping = False
        self.runs = 0
        """Checkpoints attempted (counted when done), busy and failed ones included."""
        self.busy = 0
        """Checkpoints that found the file busy or locked and copied nothing."""
        self.failures = 0
        """Checkpoints that failed for another reason."""
        self.last: tuple[int, int, int] | None = None
        """The last result: (busy, WAL frames, frames checkpointed), SQLite's three numbers."""
        self.error: Exception | None = None
        """The first failure other than busy or locked, if any."""
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self._path!r}, runs={self.runs}, busy={self.busy}, "
            f"failures={self.failures}, last={self.last})"
        )

    def poke(self) -> None:
        """Ask for a checkpoint soon. Never blocks (beyond a lock held for nanoseconds)."""
        self._wake.set()

    def stop(self) -> None:
        """Let the thread finish its current checkpoint, if any, close its connection and end."""
        self._stopping = True
        self._wake.set()

    def _run(self) -> None:
        db: sqlite3.Connection | None = None
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                try:
                    if db is None:
                        db = self._connect()
                    [(busy, log, done)] = fetch(db, "PRAGMA wal_checkpoint(PASSIVE)")
                    self.last = (int(busy), int(log), int(done))
                    if busy:
                        self.busy += 1
                except Exception as e:  # never let the thread die: record, go on
                    if isinstance(e, sqlite3.Error) and is_busy(e):
                        self.busy += 1
                    else:
                        self.failures += 1
                        if self.error is None:
                            self.error = e
                self.runs += 1
        finally:
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()

    def _connect(self) -> sqlite3.Connection:
        # No busy timeout: a locked file is retried at the next poke, not waited for here (and
        # aclose() never waits behind a sleeping busy handler).
        db = sqlite3.connect(self._path, timeout=0, isolation_level=None)
        try:
            db.execute(f"PRAGMA synchronous={self._synchronous}")
        except BaseException:
            db.close()
            raise
        return db


class SqliteDatabase:
    """Per-event-loop aiosqlite connections to one SQLite file, with retried transactions.

    Args:
        path: The database file, or ``":memory:"`` (then one connection serves every loop).
        owner: How the owning store names itself in errors and warnings.
        migrations: The schema as an ordered list of single SQL statements, index = version.
            ``migrations[0]`` must create ``version_table`` (``IF NOT EXISTS``).
        version_table: Records ``(version, applied_at)`` per applied migration.
        synchronous: SQLite's ``synchronous`` pragma: ``"NORMAL"`` or ``"FULL"``.
        wal_checkpoints: ``"inline"`` (SQLite's own, in a commit now and then) or
            ``"background"`` (on a thread of their own; see the module docstring).
        busy_timeout: Seconds a statement waits for a lock before the transaction is retried.
        loop_writes: Let small writes (``write(..., size=...)``) run on the event loop's thread
            when they need not wait (see the module docstring); ``False`` keeps every
            statement on the connections' threads.
        functions: One-argument SQL functions (name to a deterministic Python function) to
            register on every connection, for migrations that convert data SQL cannot.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        owner: str,
        migrations: Sequence[str],
        version_table: str,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 5.0,
        functions: Mapping[str, Callable[[Any], Any]] | None = None,
        wal_checkpoints: Literal["inline", "background"] = "inline",
        loop_writes: bool = True,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        if wal_checkpoints not in ("inline", "background"):
            raise ValueError(
                f"wal_checkpoints must be 'inline' or 'background', got {wal_checkpoints!r}"
            )
        if busy_timeout < 0:
            raise ValueError(f"busy_timeout must be >= 0 seconds, got {busy_timeout}")
        if not _IDENTIFIER.fullmatch(version_table):
            raise ValueError(f"version_table must be an SQL identifier, got {version_table!r}")
        database = os.fspath(path)
        self.memory = database == ":memory:"
        self.where = database if self.memory else os.path.abspath(database)
        """The file (absolute path) or ``":memory:"``, for messages."""
        self.busy_timeout = float(busy_timeout)
        self._database = database
        self._owner = owner
        self._migrations = tuple(migrations)
        self._version_sql = f"SELECT max(version) FROM {version_table}"
        self._record_sql = (
            f"INSERT INTO {version_table} (version, applied_at) VALUES (:version, :applied_at)"
        )
        self._synchronous = synchronous
        self._background = wal_checkpoints == "background" and not self.memory
        self.loop_writes = loop_writes and not self.memory and synchronous == "NORMAL"
        """Whether small writes may run on the event loop's thread (see :meth:`write`)."""
        self._functions = dict(functions or {})
        self._guard = threading.Lock()
        self._by_loop: dict[asyncio.AbstractEventLoop, _LoopConnections] = {}
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        self._shared: _LoopConnections | None = None
        self._schema_ready = False
        self._closed = False
        self._checkpoints: WalCheckpoints | None = None  # started by the CHECKPOINT_EVERY-th write
        self._writes = 0  # since the last poke
        self._reported = False  # a background checkpoint failure was warned about

    @property
    def schema_version(self) -> int:
        """The version a fully migrated database records."""
        return len(self._migrations) - 1

    # -- lifecycle --------------------------------------------------------------------------

    async def open(self) -> None:
        """Open this loop's connections (migrating the schema on first use)."""
        await self._connections()

    async def aclose(self) -> None:
        """Close every connection, whichever loop opened it, and stop the checkpoint thread.

        A background checkpoint in progress finishes first (waited for up to
        ``_STOP_TIMEOUT`` seconds; past that, a :class:`RuntimeWarning` says so and the thread
        closes its own connection when its checkpoint ends). One that failed and was not yet
        reported by a write is reported now, as a :class:`RuntimeWarning`. Final.
        """
        with self._guard:
            self._closed = True
            everything = self._distinct(self._by_loop.values())
            for conns in self._by_loop.values():
                conns.close_direct()
            self._by_loop.clear()
            self._gates.clear()
            self._shared = None
            checkpoints, self._checkpoints = self._checkpoints, None
        try:
            if checkpoints is not None:
                checkpoints.stop()
                await asyncio.to_thread(checkpoints.thread.join, _STOP_TIMEOUT)
                if checkpoints.thread.is_alive():
                    warnings.warn(
                        f"{self._owner}: a background WAL checkpoint of {self.where} was still "
                        f"running {_STOP_TIMEOUT:g}s after aclose() asked it to stop; closing "
                        "anyway (its thread closes its own connection when it ends). A slow "
                        "disk or a very long WAL makes checkpoints this slow.",
                        RuntimeWarning,
                        stacklevel=3,  # at the store's aclose
                    )
                self._report(checkpoints, stacklevel=2)  # at the store's aclose
        finally:
            for conn in everything:
                await _close(conn)

    @staticmethod
    def _distinct(groups: Any) -> list[aiosqlite.Connection]:
        seen: dict[int, aiosqlite.Connection] = {}
        for group in groups:
            for conn in group.all():
                seen.setdefault(id(conn), conn)
        return list(seen.values())

    def __del__(self) -> None:
        checkpoints = getattr(self, "_checkpoints", None)
        if checkpoints is not None:
            checkpoints.stop()
        by_loop = getattr(self, "_by_loop", None)
        if not by_loop:
            return
        for conns in by_loop.values():
            conns.close_direct()
        warnings.warn(
            f"{self._owner} was garbage-collected with open connections; close it with 'await "
            "aclose()' or open it with 'async with ... .open(...)'",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )
        if sys.is_finalizing():
            # Interpreter exit: a new thread would never start (start() would wait forever), and
            # the daemon connection threads end with the process anyway.
            return
        # aiosqlite's stop() answers through a future on the calling thread's event loop, which
        # may be closed before the connection thread replies; from a thread without a loop it
        # sends no future. So stop them from a short-lived helper thread.
        threading.Thread(
            target=_stop_all, args=(self._distinct(list(by_loop.values())),), daemon=True
        ).start()
        by_loop.clear()

    async def _connections(self) -> _LoopConnections:
        loop = asyncio.get_running_loop()
        conns = self._by_loop.get(loop)
        if conns is not None:
            return conns
        with self._guard:
            if self._closed:
                raise StorageError(f"{self._owner} is closed; open a new one")
            gate = self._gates.setdefault(loop, asyncio.Lock())
        async with gate:
            conns = self._by_loop.get(loop)
            if conns is None:
                conns = await self._connect(loop)
        return conns

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _LoopConnections:
        with self._guard:
            dead = [c for lp, c in self._by_loop.items() if lp.is_closed()]
            for c in dead:
                del self._by_loop[c.loop]
                self._gates.pop(c.loop, None)
                c.close_direct()
            shared = self._shared
        if shared is not None:  # ":memory:": one connection serves every loop
            conns = _LoopConnections(loop, shared.writer, shared.reader)
        else:
            for conn in self._distinct(dead):  # their loop is gone: nobody else can use them
                await _close(conn)
            writer = await self._open_connection(query_only=False)
            try:
                if not self._schema_ready:
                    await self._migrate(writer)
                reader = writer if self.memory else await self._open_connection(query_only=True)
            except BaseException:
                await _close(writer)
                raise
            try:
                direct = self._open_direct() if self.loop_writes else None
            except BaseException:
                for conn in {id(writer): writer, id(reader): reader}.values():
                    await _close(conn)
                raise
            conns = _LoopConnections(loop, writer, reader, direct)
        with self._guard:
            closed = self._closed
            if not closed:
                self._by_loop[loop] = conns
                if self.memory:
                    self._shared = conns
        if closed:
            if shared is None:
                conns.close_direct()
                for conn in conns.all():
                    await _close(conn)
            raise StorageError(f"{self._owner} is closed; open a new one")
        return conns

    async def _open_connection(self, *, query_only: bool) -> aiosqlite.Connection:
        conn = aiosqlite.connect(self._database, timeout=self.busy_timeout, isolation_level=None)
        thread = _daemonize(conn)
        try:
            await conn
        except sqlite3.Error as e:
            # aiosqlite stops the connection's thread but does not wait for it; it would answer
            # on this loop, which may be closed by then (and that kills the thread noisily).
            if thread is not None:
                await asyncio.to_thread(thread.join, 5)
            raise StorageError(f"cannot open SQLite database {self.where}: {e}") from e

        configure = functools.partial(
            _configure,
            where=None if self.memory else self.where,
            synchronous=self._synchronous,
            query_only=query_only,
            autocheckpoint=AUTOCHECKPOINT if self._background else None,
            functions=self._functions,
        )
        try:
            await self._retrying("open", lambda: _on_thread(conn, configure))
        except BaseException:
            await _close(conn)
            raise
        return conn

    def _open_direct(self) -> sqlite3.Connection:
        """This loop's connection for writes on its own thread (the file is WAL already).

        No busy timeout: a locked file fails at once and the write goes to the writer's thread.
        No autocheckpoint: see :data:`DIRECT_RUN`. Not bound to the opening thread, only so
        that :meth:`aclose` may close it from another loop's thread.
        """
        try:
            db = sqlite3.connect(
                self._database,
                timeout=0,
                isolation_level=None,
                check_same_thread=False,
                factory=_LoopConnection,
            )
        except sqlite3.Error as e:
            raise StorageError(f"cannot open SQLite database {self.where}: {e}") from e
        try:
            _configure(
                db,
                where=None,
                synchronous=self._synchronous,
                query_only=False,
                autocheckpoint=0,
                functions=self._functions,
            )
        except sqlite3.Error as e:
            db.close()
            raise StorageError(f"cannot configure SQLite database {self.where}: {e}") from e
        except BaseException:
            db.close()
            raise
        return db

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        # Functions sent to the connection's thread capture plain values, never self (see
        # _on_thread): the thread keeps the last one alive, and self must stay collectable.
        version = functools.partial(_schema_version, query=self._version_sql)
        migrate = functools.partial(
            _apply_migrations,
            migrations=self._migrations,
            version_sql=self._version_sql,
            record_sql=self._record_sql,
            where=self.where,
        )
        # Fast path without the write lock: an up-to-date file needs nothing.
        current = await self._retrying("migrate", lambda: _on_thread(conn, version))
        if current is not None:
            _refuse_newer(current, len(self._migrations) - 1, self.where)
        if current != self.schema_version:
            await self._retrying(
                "migrate", lambda: _on_thread(conn, lambda db: _in_transaction(db, migrate))
            )
        self._schema_ready = True

    # -- statements -------------------------------------------------------------------------

    async def write(
        self, op: str, body: Callable[[sqlite3.Connection], T], *, size: int | None = None
    ) -> T:
        """Run ``body(connection)`` in one ``BEGIN IMMEDIATE`` transaction and commit it.

        ``body`` runs on the connection's thread, or on this one (see ``size``), so it must
        not touch the event loop. It may run several times (when the database stays locked),
        so it must have no effects outside the transaction. Whatever it raises rolls the
        transaction back and propagates; SQLite errors become
        :class:`~graphexec.errors.StorageError`.

        ``size``: the bytes (or characters of text) of data the transaction stores, when the
        caller knows them and the body does no other heavy work (no decoding of large reads).
        A write of at most :data:`DIRECT_MAX_BYTES` then runs on the event loop's thread when
        it can without waiting (see the module docstring); one that finds the file locked is
        handed to the writer's thread and retried there as usual, and so is one whose body
        raises :class:`OffTheLoop`.

        A failure of the background WAL checkpoint is reported once, as a
        :class:`RuntimeWarning` from the next write (or from :meth:`aclose`): the commit itself
        succeeded, and the writers' own autocheckpoint keeps the WAL bounded meanwhile.
        """
        conns = await self._connections()
        direct = conns.direct
        if (
            direct is not None
            and size is not None
            and size <= DIRECT_MAX_BYTES
            and conns.direct_writes < DIRECT_RUN
        ):
            try:
                if direct.in_transaction:
                    # A signal (KeyboardInterrupt) on this thread cut an earlier write short
                    # before its rollback: finish that rollback first.
                    direct.rollback()
                result = _on_loop(direct, lambda db: _in_transaction(db, body))
            except sqlite3.Error as e:
                if not is_busy(e):
                    raise self._storage_error(op, e, 1) from e
                # Locked by someone else: wait for it on the writer's thread instead.
            except OffTheLoop:
                pass  # rolled back; the body asked for the writer's thread
            else:
                conns.direct_writes += 1
                if self._background:
                    self._committed()
                return result
        conns.direct_writes = 0  # this commit may run SQLite's autocheckpoint
        result = await self._retrying(
            op, lambda: _on_thread(conns.writer, lambda db: _in_transaction(db, body))
        )
        if self._background:
            self._committed()
        return result

    def _committed(self) -> None:
        """Count a committed write; poke the checkpoint thread every CHECKPOINT_EVERY of them."""
        # Loops on several threads may count at once: a lost increment only delays a poke.
        self._writes += 1
        if self._writes >= CHECKPOINT_EVERY:
            self._writes = 0
            with self._guard:
                if self._checkpoints is None and not self._closed:
                    self._checkpoints = WalCheckpoints(
                        self.where,
                        synchronous=self._synchronous,
                        name=f"graphexec WAL checkpoints {self.where}",
                    )
                checkpoints = self._checkpoints
            if checkpoints is not None:
                checkpoints.poke()
        checkpoints = self._checkpoints
        if checkpoints is not None and checkpoints.error is not None:
            self._report(checkpoints, stacklevel=3)  # at the store method that wrote

    def _report(self, checkpoints: WalCheckpoints, *, stacklevel: int) -> None:
        """Warn about the checkpoint thread's first failure, once per database.

        ``stacklevel`` counts the frames above this one to blame, as :func:`warnings.warn` does.
        """
        if checkpoints.error is None or self._reported:
            return
        self._reported = True
        warnings.warn(
            f"{self._owner}: background WAL checkpoints of {self.where} failed "
            f"({checkpoints.error!r}); commits still succeed, but the WAL now grows to "
            f"{AUTOCHECKPOINT} pages before a commit checkpoints it itself (slower commits, "
            "larger file). Check the file system (space, permissions)",
            RuntimeWarning,
            stacklevel=stacklevel + 1,
        )

    async def read(self, op: str, query: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one read statement on this loop's reader and return its rows."""
        conns = await self._connections()
        return await self._retrying(
            op, lambda: _on_thread(conns.reader, lambda db: fetch(db, query, params))
        )

    def _storage_error(self, op: str, error: sqlite3.Error, attempts: int) -> StorageError:
        if is_busy(error):
            return StorageError(
                f"SQLite {op} on {self.where} failed: the database stayed locked by another "
                f"connection for more than busy_timeout={self.busy_timeout}s in each of "
                f"{attempts} attempts ({error}); nothing was written"
            )
        return StorageError(f"SQLite {op} on {self.where} failed: {error}")

    async def _retrying(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        delay = _BACKOFF
        attempt = 1
        while True:
            try:
                return await call()
            except sqlite3.Error as e:
                if not is_busy(e) or attempt >= ATTEMPTS:
                    raise self._storage_error(op, e, attempt) from e
            except ValueError as e:  # aiosqlite: the connection was closed under us
                raise StorageError(f"SQLite {op} on {self.where} failed: {e}") from e
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, _MAX_BACKOFF)
            attempt += 1
