"""A durable run queue on PostgreSQL, and the workers that drain it.

PostgreSQL is the coordinator: there is no process of ours in the middle.

- :meth:`RunQueue.enqueue` records a run (graph name, thread, input) durably and returns its id.
- :class:`Worker` processes claim runs with ``FOR UPDATE SKIP LOCKED``, run them on their graphs
  (checkpointed in the same database), heartbeat a lease on every claimed run, and record how
  each ended (``done``, ``interrupted``, ``rejected``, ``failed`` or ``cancelled``).
- Per-thread ordering: a run is claimable only when every earlier run of its thread has ended,
  so at most one run per thread is active and the rest wait in order.
- A worker that dies (SIGKILL, power loss) stops heartbeating; once its lease expires another
  worker claims the run and resumes it from the thread's last checkpoint.
- ``SIGTERM`` (or :meth:`Worker.stop`) stops claiming; in-flight runs get a grace period, then
  are cancelled and handed back to the queue, to be resumed elsewhere from their checkpoints.

Inputs are encoded with graphexec's closed-registry serializer restricted to built-in types (dicts
of JSON-like values, datetimes, UUIDs, decimals ...): pass plain data, not model instances. Given
``encryption=`` (the same :class:`~checkpointers.Encryption` as the checkpoints), a run's input is
sealed with AES-256-GCM bound to its run id, so it is no more readable at rest than the
checkpoints, and a blob moved to another run fails authentication.

Retries are bounded: a run whose worker died, or whose run raised a storage error, goes back to
the queue with an exponential backoff (``not_before``), at most ``max_attempts`` claims in all;
then it ends ``failed`` with the last error. A run taken over after its answers were recorded
resumes from its checkpoint with no input, so a ``Command(resume=...)`` is never applied twice.
Everything here works through a transaction-mode pooler: no session state, no LISTEN/NOTIFY
(waiting polls with backoff).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote

from graphexec import (
    Command,
    CompiledGraph,
    DeserializationError,
    GraphExecError,
    StorageError,
)
from graphexec._serde import default_serializer

if TYPE_CHECKING:
    from checkpointers._crypto import Encryption

__all__ = ["QueuedRun", "RunQueue", "RunStatus", "Worker", "redact_dsn"]

RunStatus = Literal["queued", "running", "done", "interrupted", "rejected", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"done", "interrupted", "rejected", "failed", "cancelled"})
_LOCK_KEY = 0x67_72_61_70_68_71  # "graphq": advisory lock serialising migrations

MIGRATIONS: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS graphexec_queue_schema (
        version INTEGER PRIMARY KEY,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
    )""",
    """CREATE TABLE graphexec_runs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        run_id TEXT NOT NULL UNIQUE,
        graph_name TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        input BYTEA,
        status TEXT NOT NULL,
        worker_id TEXT,
        lease_expires_at TIMESTAMPTZ,
        attempts INTEGER NOT NULL DEFAULT 0,
        cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
        enqueued_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        started_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ,
        error TEXT,
        checkpoint_id TEXT
    )""",
    "CREATE INDEX graphexec_runs_claimable ON graphexec_runs (seq) "
    "WHERE status IN ('queued', 'running')",
    "CREATE INDEX graphexec_runs_thread ON graphexec_runs (thread_id, seq)",
    "CREATE INDEX graphexec_runs_status ON graphexec_runs (status, seq)",
    # A run handed back after a failure is not claimed again before this time (backoff).
    "ALTER TABLE graphexec_runs ADD COLUMN not_before TIMESTAMPTZ",
)
CONNECT_TIMEOUT = 5
"""Seconds a queue client waits for PostgreSQL to accept a connection (unless the DSN says)."""
MAX_BACKOFF = 300.0
"""Longest wait, in seconds, before a failed run is claimed again."""

_COLUMNS = (
    "run_id, graph_name, thread_id, status, worker_id, attempts, cancel_requested, enqueued_at, "
    "started_at, finished_at, error, checkpoint_id"
)


@dataclass(frozen=True, slots=True)
class QueuedRun:
    """A run in the queue.

    Attributes:
        run_id: Its id.
        graph_name: The graph that runs it (a worker registry name).
        thread_id: The thread it runs on.
        status: ``queued``, ``running``, or how it ended.
        worker_id: The worker running (or that last ran) it.
        attempts: How many times a worker claimed it (>1 after a takeover, a handback or a
            retry; at most the worker's ``max_attempts``).
        cancel_requested: Whether :meth:`RunQueue.cancel` asked a running run to stop.
        enqueued_at: When it was enqueued.
        started_at: When a worker first claimed it.
        finished_at: When it ended.
        error: Why it failed (while it is queued again: why its last attempt failed).
        checkpoint_id: The thread's checkpoint when it ended.
    """

    run_id: str
    graph_name: str
    thread_id: str
    status: RunStatus
    worker_id: str | None
    attempts: int
    cancel_requested: bool
    enqueued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    checkpoint_id: str | None

    @property
    def finished(self) -> bool:
        """Whether the run has ended (in any way)."""
        return self.status in TERMINAL


def _input_context(run_id: str) -> bytes:
    from checkpointers._crypto import blob_context

    return blob_context("graphexec/queue", run_id, "input")


def _encode_input(value: Any, run_id: str, encryption: Encryption | None) -> bytes:
    serde = default_serializer()
    if isinstance(value, Command):
        data = {"command": {"update": value.update, "goto": value.goto, "resume": value.resume}}
    else:
        data = {"input": value}
    blob = serde.dumps(data, channel="run input")
    return blob if encryption is None else encryption.encrypt(blob, context=_input_context(run_id))


def _decode_input(blob: bytes | None, run_id: str, encryption: Encryption | None) -> Any:
    """The input of a queued run, as :func:`_encode_input` stored it.

    Raises:
        DeserializationError: The stored bytes are corrupt, not a run input (a row edited
            behind the queue's back), encrypted without ``encryption`` given, or fail
            authentication (another key, or moved from another run); they are never
            interpreted as anything else.
    """
    from checkpointers._crypto import looks_encrypted

    if blob is None:
        return None
    raw = bytes(blob)
    if encryption is not None:
        raw = encryption.decrypt(
            raw, context=_input_context(run_id), what=f"the input of queued run {run_id!r}"
        )
    elif looks_encrypted(raw):
        raise DeserializationError(
            f"the input of queued run {run_id!r} is encrypted; give the worker encryption= "
            "(the same keys as the checkpoints)",
            channel="run input",
        )
    data = default_serializer().loads(raw, channel="run input")
    if type(data) is not dict or len(data) != 1 or not set(data) <= {"input", "command"}:
        raise DeserializationError(
            "run input is malformed: expected {'input': ...} or {'command': {...}}",
            channel="run input",
        )
    if "command" in data:
        c = data["command"]
        if type(c) is not dict or set(c) != {"update", "goto", "resume"}:
            raise DeserializationError(
                "run input is malformed: a command needs exactly update, goto and resume",
                channel="run input",
            )
        goto = c["goto"]
        return Command(
            update=c["update"],
            goto=list(goto) if isinstance(goto, list) else goto,
            resume=c["resume"],
        )
    return data["input"]


class RunQueue:
    """The queue API: enqueue, inspect, cancel and wait for runs.

    Args:
        dsn: PostgreSQL connection string (the database that also holds the checkpoints).
        min_size: Smallest connection pool size.
        max_size: Largest connection pool size.
        encryption: Seal run inputs at rest with these keys (give the workers the same).
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 4,
        encryption: Encryption | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise GraphExecError("RunQueue needs a PostgreSQL DSN (postgresql://...)")
        self.dsn = dsn
        self.encryption = encryption
        self._min, self._max = min_size, max_size
        self._pools: dict[asyncio.AbstractEventLoop, Any] = {}
        self._ready: set[asyncio.AbstractEventLoop] = set()

    async def _pool(self) -> Any:
        import psycopg
        from psycopg_pool import AsyncConnectionPool, PoolTimeout

        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        options: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
        if "connect_timeout" not in self.dsn:
            options["connect_timeout"] = CONNECT_TIMEOUT
        try:
            if pool is None:
                # One direct connection first: an unreachable server is one clear error after at
                # most the connect timeout, not a pool retrying (and logging) in the background.
                probe = await psycopg.AsyncConnection.connect(self.dsn, **options)
                await probe.close()
                pool = AsyncConnectionPool(
                    self.dsn,
                    min_size=self._min,
                    max_size=self._max,
                    open=False,
                    kwargs=options,
                )
                await pool.open(wait=True, timeout=float(CONNECT_TIMEOUT) * 2)
                self._pools[loop] = pool
            if loop not in self._ready:
                await self._migrate(pool)
                self._ready.add(loop)
        except (psycopg.Error, PoolTimeout) as e:
            if pool is not None and loop not in self._pools:
                await pool.close()
            raise StorageError(
                redact_dsn(
                    f"run queue: cannot use PostgreSQL at {redact_dsn(self.dsn)}: {e}", self.dsn
                )
            ) from None
        return pool

    async def _migrate(self, pool: Any) -> None:
        async with pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            await conn.execute(MIGRATIONS[0])
            cur = await conn.execute("SELECT coalesce(max(version), 0) FROM graphexec_queue_schema")
            row = await cur.fetchone()
            current = int(row[0]) if row else 0
            for version in range(current + 1, len(MIGRATIONS)):
                await conn.execute(MIGRATIONS[version])
                await conn.execute(
                    "INSERT INTO graphexec_queue_schema (version) VALUES (%s)", (version,)
                )

    async def _exec(
        self, op: str, query: str, params: Sequence[Any] | Mapping[str, Any]
    ) -> list[Any]:
        import psycopg

        pool = await self._pool()
        try:
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(query, params)
                return list(await cur.fetchall()) if cur.description else []
        except psycopg.Error as e:
            raise StorageError(
                redact_dsn(f"run queue: {op} failed on PostgreSQL: {e}", self.dsn)
            ) from None

    async def setup(self) -> None:
        """Create or migrate the queue tables (idempotent, safe from many processes at once)."""
        await self._pool()

    async def aclose(self) -> None:
        """Close the connection pools."""
        pools, self._pools = self._pools, {}
        self._ready.clear()
        for pool in pools.values():
            await pool.close()

    async def enqueue(
        self,
        graph_name: str,
        input: Any,
        *,
        thread_id: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Record a run durably and return its id (it is stored before this returns).

        Args:
            graph_name: Name of the graph a worker serves (``compile(name=...)``).
            input: State input, ``None`` (resume the thread), or a ``Command``.
            thread_id: The thread; a new one is made when omitted.
            run_id: Your own id, for idempotent enqueueing: enqueueing an id that exists
                returns it without adding a second run.
        """
        if not graph_name:
            raise GraphExecError("enqueue: graph_name must be a non-empty string")
        thread = thread_id or uuid.uuid4().hex
        rid = run_id or uuid.uuid4().hex
        blob = _encode_input(input, rid, self.encryption)
        await self._exec(
            "enqueue",
            "INSERT INTO graphexec_runs (run_id, graph_name, thread_id, input, status) "
            "VALUES (%s, %s, %s, %s, 'queued') ON CONFLICT (run_id) DO NOTHING",
            (rid, graph_name, thread, blob),
        )
        existing = await self.get(rid)
        if existing is not None and (
            existing.graph_name != graph_name or existing.thread_id != thread
        ):
            raise GraphExecError(
                f"run id {rid!r} already exists for graph {existing.graph_name!r} on thread "
                f"{existing.thread_id!r}; choose another run_id"
            )
        return rid

    async def get(self, run_id: str) -> QueuedRun | None:
        """The run, or ``None``."""
        rows = await self._exec(
            "get", f"SELECT {_COLUMNS} FROM graphexec_runs WHERE run_id = %s", (run_id,)
        )
        return _row(rows[0]) if rows else None

    async def list(
        self,
        *,
        status: RunStatus | None = None,
        thread_id: str | None = None,
        limit: int = 100,
    ) -> list[QueuedRun]:
        """Runs, newest first, optionally filtered by status and thread."""
        if limit < 1:
            raise GraphExecError(f"limit must be >= 1, got {limit}")
        rows = await self._exec(
            "list",
            f"SELECT {_COLUMNS} FROM graphexec_runs "
            "WHERE (%(status)s::text IS NULL OR status = %(status)s) "
            "AND (%(thread)s::text IS NULL OR thread_id = %(thread)s) "
            "ORDER BY seq DESC LIMIT %(limit)s",
            {"status": status, "thread": thread_id, "limit": limit},
        )
        return [_row(r) for r in rows]

    async def cancel(self, run_id: str) -> QueuedRun:
        """Cancel a run: a queued one at once, a running one at its worker's next heartbeat."""
        rows = await self._exec(
            "cancel",
            "UPDATE graphexec_runs SET "
            "status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END, "
            "finished_at = CASE WHEN status = 'queued' THEN clock_timestamp() "
            "ELSE finished_at END, "
            "cancel_requested = (status = 'running') "
            f"WHERE run_id = %s RETURNING {_COLUMNS}",
            (run_id,),
        )
        if not rows:
            raise GraphExecError(f"no run {run_id!r} in the queue")
        return _row(rows[0])

    async def wait(self, run_id: str, *, timeout: float | None = None) -> QueuedRun:
        """Wait until the run has ended; raises ``TimeoutError`` after ``timeout`` seconds."""
        delay = 0.02

        async def poll() -> QueuedRun:
            nonlocal delay
            while True:
                run = await self.get(run_id)
                if run is None:
                    raise GraphExecError(f"no run {run_id!r} in the queue")
                if run.finished:
                    return run
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 0.5)

        return await asyncio.wait_for(poll(), timeout)

    # -- used by workers ------------------------------------------------------------------------

    async def _claim(
        self, graphs: Sequence[str], worker_id: str, ttl: float, max_attempts: int
    ) -> Any | None:
        # A run whose lease expired after its last allowed attempt (its workers kept dying in
        # it) ends failed here, in the same statement, instead of being claimed again.
        rows = await self._exec(
            "claim",
            """
            WITH given_up AS (
                UPDATE graphexec_runs SET status = 'failed', finished_at = clock_timestamp(),
                    lease_expires_at = NULL,
                    error = 'gave up after ' || attempts || ' attempt(s): each worker running '
                        || 'it stopped before it ended (lease expired)'
                        || coalesce('; last error: ' || error, '')
                WHERE graph_name = ANY(%(graphs)s) AND status = 'running'
                  AND lease_expires_at < clock_timestamp() AND attempts >= %(max)s
                RETURNING seq
            ),
            candidate AS (
                SELECT r.seq FROM graphexec_runs r
                WHERE r.graph_name = ANY(%(graphs)s)
                  AND NOT r.cancel_requested
                  AND (r.not_before IS NULL OR r.not_before <= clock_timestamp())
                  AND (r.status = 'queued'
                       OR (r.status = 'running' AND r.lease_expires_at < clock_timestamp()
                           AND r.attempts < %(max)s))
                  AND NOT EXISTS (
                      SELECT 1 FROM graphexec_runs o
                      WHERE o.thread_id = r.thread_id AND o.seq < r.seq
                        AND o.status IN ('queued', 'running'))
                ORDER BY r.seq
                FOR UPDATE SKIP LOCKED
                LIMIT 1
            )
            UPDATE graphexec_runs AS r SET
                status = 'running', worker_id = %(worker)s, attempts = r.attempts + 1,
                lease_expires_at = clock_timestamp() + %(ttl)s * interval '1 second',
                started_at = coalesce(r.started_at, clock_timestamp())
            FROM candidate WHERE r.seq = candidate.seq
            RETURNING r.run_id, r.graph_name, r.thread_id, r.input, r.attempts
            """,
            {"graphs": list(graphs), "worker": worker_id, "ttl": ttl, "max": max_attempts},
        )
        return rows[0] if rows else None

    async def _heartbeat(self, run_id: str, worker_id: str, ttl: float) -> bool | None:
        """Extend the lease. ``None``: lost the run; ``True``: cancel was requested."""
        rows = await self._exec(
            "heartbeat",
            "UPDATE graphexec_runs SET lease_expires_at = clock_timestamp() + "
            "%s * interval '1 second' WHERE run_id = %s AND worker_id = %s "
            "AND status = 'running' RETURNING cancel_requested",
            (ttl, run_id, worker_id),
        )
        return bool(rows[0][0]) if rows else None

    async def _finish(
        self,
        run_id: str,
        worker_id: str,
        status: str,
        *,
        error: str | None = None,
        checkpoint_id: str | None = None,
        delay: float = 0.0,
    ) -> None:
        if status == "queued":  # hand back: another worker resumes it from its checkpoint
            await self._exec(
                "release",
                "UPDATE graphexec_runs SET status = 'queued', worker_id = NULL, "
                "lease_expires_at = NULL, error = coalesce(%s, error), "
                "not_before = clock_timestamp() + %s * interval '1 second' "
                "WHERE run_id = %s AND worker_id = %s",
                (error, delay, run_id, worker_id),
            )
            return
        await self._exec(
            "finish",
            "UPDATE graphexec_runs SET status = %s, error = %s, checkpoint_id = %s, "
            "finished_at = clock_timestamp(), lease_expires_at = NULL "
            "WHERE run_id = %s AND worker_id = %s AND status = 'running'",
            (status, error, checkpoint_id, run_id, worker_id),
        )


_URL_PASSWORD = re.compile(r"(\w+://[^:/@?#\s]*:)([^@\s]*)(@)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)([^&#\s]*)", re.IGNORECASE)
_KV_PASSWORD = re.compile(r"((?<![?&\w])password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)", re.IGNORECASE)
_HIDDEN = "***"


def redact_dsn(text: str, dsn: str | None = None) -> str:
    """``text`` with every PostgreSQL password in it replaced by ``***``, for messages and logs.

    Covers URL DSNs (``postgresql://user:secret@host``, ``?password=secret``), key=value DSNs
    (``password=secret``, ``password = 'se cret'``), percent-encoded passwords, and -- when the
    ``dsn`` the text came from is given -- that DSN's password wherever else it appears (an
    error message quoting it, decoded or encoded).

    Args:
        text: A DSN, or a message that may contain one.
        dsn: The connection string in use, whose password must not appear in ``text``.
    """
    secrets: set[str] = set()
    if dsn:
        for pattern, group in ((_URL_PASSWORD, 2), (_QUERY_PASSWORD, 2), (_KV_PASSWORD, 2)):
            for m in pattern.finditer(dsn):
                value = m.group(group)
                if value.startswith("'"):
                    value = value.strip("'").replace("\\'", "'").replace("\\\\", "\\")
                secrets.update({value, unquote(value), quote(unquote(value), safe="")})
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + _HIDDEN + m.group(3), text)
    text = _QUERY_PASSWORD.sub(lambda m: m.group(1) + _HIDDEN, text)
    text = _KV_PASSWORD.sub(lambda m: m.group(1) + _HIDDEN, text)
    for secret in sorted(secrets - {"", _HIDDEN}, key=len, reverse=True):
        text = text.replace(secret, _HIDDEN)
    return text


def _row(r: Sequence[Any]) -> QueuedRun:
    return QueuedRun(
        run_id=r[0],
        graph_name=r[1],
        thread_id=r[2],
        status=r[3],
        worker_id=r[4],
        attempts=r[5],
        cancel_requested=r[6],
        enqueued_at=r[7],
        started_at=r[8],
        finished_at=r[9],
        error=r[10],
        checkpoint_id=r[11],
    )


class Worker:
    """Claims queued runs for its graphs and runs them; many may run on many machines.

    Args:
        dsn: The PostgreSQL database holding the queue and the checkpoints.
        graphs: The graphs this worker serves, by name. A graph compiled without a
            checkpointer gets a ``PostgresCheckpointer`` on ``dsn``.
        concurrency: Runs executed at once by this worker.
        lease_ttl: Seconds before a silent worker's runs may be taken over (renewed every
            third of that).
        poll_interval: Seconds between claims when the queue is empty (it backs off to this).
        grace: Seconds in-flight runs get to finish after :meth:`stop` / ``SIGTERM``.
        worker_id: A name for this worker (default: host and pid).
        max_attempts: Claims a run gets in all. A run whose worker died in it, or whose run
            raised a :class:`~graphexec.StorageError`, is retried until then, and then ends
            ``failed`` with its last error. (A run that ends ``failed`` on its own -- a node
            raised -- is not retried here: that is the graph's retry policy's job.)
        retry_delay: Seconds before the first retry of a run that raised; doubled on each
            further attempt, at most :data:`MAX_BACKOFF`.
        encryption: The keys of the queue's run inputs and of the default checkpointer.
    """

    def __init__(
        self,
        dsn: str,
        graphs: Mapping[str, CompiledGraph[Any]],
        *,
        concurrency: int = 4,
        lease_ttl: float = 30.0,
        poll_interval: float = 0.5,
        grace: float = 30.0,
        worker_id: str | None = None,
        max_attempts: int = 5,
        retry_delay: float = 1.0,
        encryption: Encryption | None = None,
    ) -> None:
        if not graphs:
            raise GraphExecError("a worker needs at least one graph")
        if concurrency < 1 or lease_ttl <= 0 or poll_interval <= 0 or grace < 0:
            raise GraphExecError(
                "concurrency must be >= 1, lease_ttl and poll_interval > 0, grace >= 0"
            )
        if max_attempts < 1 or retry_delay < 0:
            raise GraphExecError(
                f"max_attempts must be >= 1 and retry_delay >= 0, got {max_attempts} and "
                f"{retry_delay}"
            )
        self.queue = RunQueue(dsn, max_size=concurrency + 2, encryption=encryption)
        self.dsn = dsn
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.encryption = encryption
        self._given = dict(graphs)
        self.graphs: dict[str, CompiledGraph[Any]] = {}
        self.concurrency = concurrency
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.grace = grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._store: Any = None
        self.completed = 0

    def stop(self) -> None:
        """Stop claiming; in-flight runs get the grace period, then are handed back."""
        self._stopping.set()

    async def _prepare(self) -> None:
        from checkpointers.postgres import PostgresCheckpointer

        for name, graph in self._given.items():
            if graph.checkpointer is None:
                if self._store is None:
                    self._store = PostgresCheckpointer(self.dsn, encryption=self.encryption)
                graph = graph.with_checkpointer(self._store)
            self.graphs[name] = graph
        await self.queue.setup()

    async def run(self, *, max_runs: int | None = None, install_signals: bool = False) -> None:
        """Serve until :meth:`stop` (or ``SIGTERM``/``SIGINT`` with ``install_signals``).

        Args:
            max_runs: Stop after this many runs have ended here (for tests and batch jobs).
            install_signals: Handle SIGTERM/SIGINT as a graceful stop.
        """
        await self._prepare()
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        delay = 0.01
        try:
            while not self._stopping.is_set():
                if max_runs is not None and self.completed + len(self._tasks) >= max_runs:
                    if not self._tasks:
                        break
                    await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if len(self._tasks) >= self.concurrency:
                    await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
                    continue
                claimed = await self.queue._claim(
                    list(self.graphs), self.worker_id, self.lease_ttl, self.max_attempts
                )
                if claimed is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    delay = min(delay * 2, self.poll_interval)
                    continue
                delay = 0.01
                task = asyncio.create_task(self._execute(*claimed))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await self._drain()
        finally:
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            await self.queue.aclose()
            if self._store is not None:
                await self._store.aclose()

    async def _drain(self) -> None:
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=self.grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _execute(
        self, run_id: str, graph_name: str, thread_id: str, blob: bytes | None, attempts: int
    ) -> None:
        graph = self.graphs[graph_name]
        try:
            given = _decode_input(blob, run_id, self.encryption)
        except DeserializationError as e:  # a corrupt row must not be retried forever
            await self._fail(run_id, e)
            return
        run_input = given
        if attempts > 1:
            try:
                run_input = await self._takeover_input(graph, run_id, thread_id, given)
            except StorageError as e:
                await self._retry(run_id, attempts, e)
                return
        control = _Control()
        job = asyncio.create_task(
            graph.arun(
                run_input, thread_id=thread_id, metadata={"queue_run_id": run_id}, on_busy="wait"
            )
        )
        beat = asyncio.create_task(self._beat(run_id, job, control))
        try:
            result = await job
        except asyncio.CancelledError:
            if control.lost:
                return  # another worker owns the run now; record nothing
            status = "cancelled" if control.cancel else "queued"
            await asyncio.shield(self.queue._finish(run_id, self.worker_id, status))
            if status == "cancelled":
                self.completed += 1
            return
        except StorageError as e:  # the database, not the run: retry later, a bounded number
            await self._retry(run_id, attempts, e)
            return
        except Exception as e:  # deterministic (bad input, a refused resume): fail at once
            await self._fail(run_id, e)
            return
        finally:
            beat.cancel()
        error = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
        await self.queue._finish(
            run_id, self.worker_id, result.status, error=error, checkpoint_id=result.checkpoint_id
        )
        self.completed += 1

    async def _takeover_input(
        self, graph: CompiledGraph[Any], run_id: str, thread_id: str, given: Any
    ) -> Any:
        """What a run claimed again (taken over, handed back, retried) resumes with.

        If this run already committed a step, or recorded its answers (a ``Command(resume=...)``
        whose interrupts are no longer pending while the interrupted step still waits to run),
        its input is in the thread: resume from the checkpoint instead of applying it again.
        """
        head = await graph.aget_state(thread_id)
        if head is None:
            return given
        if head.metadata.get("queue_run_id") == run_id:
            return None
        if (
            isinstance(given, Command)
            and given.resume is not None
            and head.next
            and not head.interruptions
        ):
            return None
        return given

    async def _retry(self, run_id: str, attempts: int, e: Exception) -> None:
        if attempts >= self.max_attempts:
            await self.queue._finish(
                run_id,
                self.worker_id,
                "failed",
                error=f"gave up after {attempts} attempt(s): {type(e).__name__}: {e}",
            )
            self.completed += 1
            return
        delay = min(self.retry_delay * 2 ** (attempts - 1), MAX_BACKOFF)
        await self.queue._finish(
            run_id, self.worker_id, "queued", error=f"{type(e).__name__}: {e}", delay=delay
        )

    async def _fail(self, run_id: str, e: Exception) -> None:
        await self.queue._finish(run_id, self.worker_id, "failed", error=f"{type(e).__name__}: {e}")
        self.completed += 1

    async def _beat(self, run_id: str, job: asyncio.Task[Any], control: _Control) -> None:
        while not job.done():
            await asyncio.sleep(self.lease_ttl / 3)
            answer = await self.queue._heartbeat(run_id, self.worker_id, self.lease_ttl)
            if answer is None:  # another worker took the run over: stop, write nothing more
                control.lost = True
                job.cancel()
                return
            if answer:
                control.cancel = True
                job.cancel()
                return


@dataclass(slots=True)
class _Control:
    """Why a run's task was cancelled by its heartbeat."""

    lost: bool = False
    cancel: bool = False
