"""The PostgreSQL checkpointer: many worker processes on many machines, one database.

PostgreSQL is the coordinator: every commit's checks (the run's lease and its fencing epoch, the
parent-is-head compare-and-set) are made under row locks in the statement that writes it, so two
runs can never fork a thread's history and a fenced-out worker can never write, whichever
machines they run on.

Commits are single statements:

- ``put`` is one statement (one round trip, in autocommit: its own transaction). It locks the
  thread's lease row (``FOR UPDATE``), then its head row (``FOR UPDATE``), then the parent
  checkpoint (``FOR KEY SHARE``, so a concurrent ``prune`` cannot delete it), decides, and only
  if every check passes moves the head (``INSERT ... ON CONFLICT DO UPDATE ... WHERE head_id =
  expected``, whose row count is the compare-and-set), inserts the checkpoint and its channel
  rows and deletes the parent's pending writes. A failed check writes nothing and reports why.
- ``put_writes`` is one statement too (lease row ``FOR SHARE``, checkpoint ``FOR KEY SHARE``),
  and concurrent calls for the same step share one: the tasks of a fan-out that finish while a
  save is in flight are saved together by the next statement (group commit).
- A run starts with one statement as well: ``acquire_lease_and_get`` takes the lease and reads
  the thread in the same transaction. On a thread the engine believes new,
  ``acquire_lease_and_put`` also commits the run's input checkpoint in that statement (when
  the thread has a checkpoint after all, it returns the read instead and writes nothing else).

The statements a run repeats are server-side PL/pgSQL functions (``graphexec_put``,
``graphexec_put_writes``, ``graphexec_get``, ``graphexec_acquire_get``,
``graphexec_acquire_put``; see
:mod:`checkpointers._sql`). PostgreSQL keeps a function's plans for the life of the server
connection, so their statements are planned once per connection rather than per call -- most of
the gain of prepared statements, without server-side prepared statements, so transaction-mode
poolers work too. (Only the short call itself is still parsed every time; ``prepare=True``
saves that as well.)
- Every operation takes its locks in one order -- lease row, head rows (by namespace), then
  checkpoint and thread rows -- so concurrent writers, pruners and the expiry sweep cannot
  deadlock.

Clock: lease expiry and thread TTLs are decided with the database clock
(``clock_timestamp()``), never the workers' clocks, so machines whose clocks disagree still agree
on when a lease has expired. :attr:`~graphexec.Lease.expires_at` is that clock's Unix time.
(``created_at`` of a checkpoint is the writer's clock, as with every backend.)
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from checkpointers import _pg_sql, _rows
from checkpointers import _sql as sql
from checkpointers._crypto import Encryption
from checkpointers._pg_db import PostgresDatabase, Session
from checkpointers._pg_statements import (
    _ACQUIRE,
    _ACQUIRE_GET,
    _ACQUIRE_PUT,
    _DELETE_EXPIRED,
    _EXPIRED,
    _FORGET_OLD_OPS,
    _GET,
    _HEAD,
    _LEASE_HOLDER,
    _LOCK_CHECKPOINTS,
    _LOCK_CHECKPOINTS_OF,
    _LOCK_DOOMED,
    _LOCK_HEADS,
    _LOCK_HEADS_OF,
    _LOCK_LEASE,
    _LOCK_LEASES_OF,
    _OP_RESULT,
    _PUT,
    _PUT_RELAXED,
    _PUT_WITH_WRITES_FINAL,
    _PUT_WRITES,
    _PUT_WRITES_BATCH,
    _PUT_WRITES_BATCH_RELAXED,
    _PUT_WRITES_FINAL,
    _PUT_WRITES_RELAXED,
    _RECORD_OP,
    _RENEW,
    _SET_TTL,
)
from checkpointers._reads import SqlReads
from graphexec._checkpoint import (
    BaseCheckpointer,
    Checkpoint,
    CheckpointTuple,
    Lease,
    SnapshotPolicy,
    check_run_start,
    validate_ttl,
)
from graphexec._tasks import relaxed_commit
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    LeaseLostError,
    StorageError,
    ThreadBusyError,
)

__all__ = ["PostgresCheckpointer"]

_TEXT_PARAMS = (
    "thread_id",
    "checkpoint_ns",
    "checkpoint_id",
    "parent_id",
    "expected_head",
    "before",
    "known",
    "owner",
    "task_id",
    "role",
    "channel",
    "op",
    "source",
    "graph_version",
    "next_nodes",
)
"""Parameters sent as ``text`` (psycopg sends strings and ``None`` untyped)."""
_EXPIRE_BATCH = 200
_ACQUIRE_TRIES = 5


@dataclass(eq=False, slots=True)
class _Writes:
    """One ``put_writes`` call waiting for a batch (see :meth:`PostgresCheckpointer.put_writes`)."""

    task_id: str
    rows: list[tuple[str, bytes]]
    relaxed: bool
    """Stored by the ``async`` committer (see :data:`graphexec._tasks.relaxed_commit`)."""
    done: asyncio.Future[tuple[Any, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


_WritesKey = tuple[asyncio.AbstractEventLoop, str, str, str, int | None]


def _next_batch(waiting: list[_Writes]) -> list[_Writes]:
    """Remove and return the longest prefix of ``waiting`` with no ``(task, channel)`` twice.

    One upsert statement may not write the same row twice, so a task's repeated write waits for
    the next batch (which also keeps the calls' order).
    """
    seen: set[tuple[str, str]] = set()
    n = 0
    for call in waiting:
        keys = {(call.task_id, channel) for channel, _ in call.rows}
        if n and not seen.isdisjoint(keys):
            break
        seen |= keys
        n += 1
    batch = waiting[:n]
    del waiting[:n]
    return batch


def _lease_error(verdict: str, thread_id: str, lease: Lease | None, owner: Any) -> CheckpointError:
    if verdict == "lease_lost":
        assert lease is not None
        return LeaseLostError(
            f"thread {thread_id!r}: this run's lease (epoch {lease.epoch}) was lost to another "
            "owner; its write was rejected",
            thread_id=thread_id,
            epoch=lease.epoch,
        )
    return ThreadBusyError(
        f"thread {thread_id!r} is owned by run {owner!r}; wait for it to finish or for its "
        "lease to expire",
        thread_id=thread_id,
        owner=None if owner is None else str(owner),
    )


def _put_error(
    verdict: str,
    cp: Checkpoint,
    expected_head: str | None,
    lease: Lease | None,
    owner: Any,
    head: Any,
) -> CheckpointError:
    """The error for a ``graphexec_put`` verdict other than NULL (written)."""
    if verdict in ("lease_lost", "busy"):
        return _lease_error(verdict, cp.thread_id, lease, owner)
    if verdict == "conflict":
        return CheckpointConflictError(
            f"thread {cp.thread_id!r}: expected head {expected_head!r} but the head is "
            f"{head!r}; another run committed first. Reload the thread and retry.",
            thread_id=cp.thread_id,
            expected_head=expected_head,
            actual_head=head,
        )
    if verdict == "duplicate":
        return CheckpointError(
            f"thread {cp.thread_id!r}: checkpoint {cp.checkpoint_id!r} already exists"
        )
    return CheckpointError(
        f"thread {cp.thread_id!r}: parent checkpoint {cp.parent_id!r} does not exist"
    )


def _started_lease(rows: Sequence[tuple[Any, ...]], thread_id: str, owner: str) -> Lease:
    """The lease a run start took, from the first row ``graphexec_acquire_get`` returns."""
    if not rows:
        raise StorageError(
            f"acquire_lease({thread_id!r}): the lease changed hands {_ACQUIRE_TRIES} times "
            "while it was being taken; retry"
        )
    first = rows[0]
    if first[0] == "busy":
        raise ThreadBusyError(
            f"thread {thread_id!r} is owned by run {first[3]!r} until its lease "
            "expires; retry later or pass on_busy='wait'",
            thread_id=thread_id,
            owner=first[3],
        )
    return Lease(thread_id, owner, int(first[1]), float(first[17]))


def _check_lease_thread(thread_id: str, lease: Lease | None) -> None:
    if lease is not None and lease.thread_id != thread_id:
        raise CheckpointError(
            f"lease for thread {lease.thread_id!r} used to write thread {thread_id!r}"
        )


class PostgresCheckpointer(SqlReads, BaseCheckpointer):
    """Checkpoints in PostgreSQL, shared by any number of worker processes and machines.

    The same delta storage, rows and queries as :class:`~checkpointers.SqliteCheckpointer`:
    reading a checkpoint with its delta chain and pending writes, or listing a branch, is one
    statement (a recursive CTE) and one round trip; so is every commit (see the module
    docstring for how it locks), and so is a run's start (its lease and its first read). Runs
    own threads through leases whose epochs only ever increase (across releases and thread
    deletions), checked by every commit. A run of ``n`` steps thus costs ``n + 2`` round
    trips (lease and read, the input checkpoint, one commit per step, the last one releasing
    the lease), plus its tasks' pending writes, which concurrent tasks share.

    Use it as an async context manager, or call :meth:`setup` (optional: the schema is created
    on first use) and :meth:`aclose`::

        async with PostgresCheckpointer.open("postgresql://app@db/app") as cp:
            graph = builder.compile(checkpointer=cp)
            await graph.ainvoke(inputs, thread_id="t1")

    Connections come from a :class:`psycopg_pool.AsyncConnectionPool` per event loop (the
    engine's sync facade runs on its own background loop), so up to ``pool_max`` connections
    per loop and process. A checkpointer garbage-collected with open pools emits a
    :class:`ResourceWarning`.

    Schema: the tables (all named ``graphexec_*``) live in ``schema`` when given (created if
    missing; every statement names it, so this works through any pooler), else in the first
    schema of the connection's ``search_path``. Versioned migrations run in one transaction
    under a transaction-level advisory lock, so many workers may start on an empty database at
    once; a database migrated by a newer graphexec is refused. (No migration needs
    ``CREATE INDEX CONCURRENTLY``: every index is created with its still empty table.)

    Poolers: works through a transaction-mode pooler such as PgBouncer. It keeps no session
    state (no ``SET``, no session advisory locks, no ``LISTEN``, no temporary tables) and, unless
    ``prepare=True``, uses no server-side prepared statements. Limits: with a pooler, choose the
    schema with ``schema=`` rather than ``options=-csearch_path=...`` in the DSN (PgBouncer
    rejects or ignores startup options); ``prepare=True`` needs PgBouncer >= 1.21 with
    ``max_prepared_statements`` set (older ones fail with "prepared statement ... already
    exists"); a statement cancelled by the client is cancelled through the pooler, which
    PgBouncer supports. The test suite runs the contract through PgBouncer 1.18 in transaction
    mode.

    Durability: every commit waits for its WAL to be flushed (per the server's settings), except
    the ``put`` and ``put_writes`` calls that a run in ``async`` durability makes from its
    background committer (see :data:`graphexec._tasks.relaxed_commit`): those commit with
    ``synchronous_commit = off`` for their own transaction only, and the run's last store (its
    last checkpoint, its pause, or the release of its lease), which is always flushed, flushes
    them all before ``invoke`` returns. So a crash of the database server can lose only what
    ``async`` durability already may: the last steps of a run still in progress (PostgreSQL
    keeps commit order, so a prefix of the run survives). Measured on a local server: a step
    commit replayed on one connection 0.55 -> 0.33 ms; the 10-node chain benchmark in ``async``
    durability 0.63 -> 0.53 ms per step.

    Failures: driver errors are raised as :class:`~graphexec.errors.StorageError` naming the
    operation. PostgreSQL rolls back whatever a broken connection left unfinished. An operation
    whose connection broke is retried on a fresh one (a few times); a retried ``put`` whose
    first try did commit recognises its own checkpoint and succeeds, and the other writes are
    idempotent (only the count a retried ``prune`` or ``expire`` returns may then be short).

    Args:
        dsn: A libpq connection string or URI, for example
            ``"postgresql://user:password@host:5432/dbname"``.
        schema: Keep the tables in this schema instead of the ``search_path``'s first.
        pool_min: Connections each event loop's pool keeps open.
        pool_max: Most connections each event loop's pool opens.
        pool_timeout: Seconds an operation waits for a free connection before
            :class:`~graphexec.errors.StorageError`.
        prepare: Use server-side prepared statements for frequent statements (direct
            connections, or a pooler that supports them). The server then no longer parses
            each call of the functions; measured on a local server: a commit 0.43 -> 0.34 ms,
            the 10-node chain 0.70 -> 0.63 ms per step, an interrupt round trip 3.1 -> 2.5 ms.
        snapshot_policy: Override when full snapshots are stored.
        encryption: Encrypt every stored blob (values, snapshots, frontier, pending writes,
            metadata) with AES-GCM bound to its row; see :class:`~checkpointers.Encryption`.
        default_ttl: Seconds of inactivity after which a thread is deleted by :meth:`expire`,
            applied to threads created from now on; :meth:`set_ttl` sets it per thread.
    """

    snapshot_policy: SnapshotPolicy = SnapshotPolicy(max_depth=400, ratio=2.0, min_bytes=16384)
    """The SQLite backend's policy (same rows, same trade-off; see its measurements)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
        prepare: bool = False,
        snapshot_policy: SnapshotPolicy | None = None,
        encryption: Encryption | None = None,
        default_ttl: float | None = None,
    ) -> None:
        default_ttl = validate_ttl(default_ttl)
        if snapshot_policy is not None:
            self.snapshot_policy = snapshot_policy
        self._db = PostgresDatabase(
            dsn,
            owner=f"{type(self).__name__}(schema={schema!r})",
            migrations=sql.migrations(_pg_sql.POSTGRES),
            version_table=sql.VERSION_TABLE,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
            prepare=prepare,
            param_types=dict.fromkeys(_TEXT_PARAMS, "text"),
        )
        self._default_ttl = default_ttl
        self._waiting_writes: dict[_WritesKey, list[_Writes]] = {}
        self._flushers: set[asyncio.Task[None]] = set()
        self._codec = _rows.RowCodec(encryption)
        self._checkpoints_table = self._db.table("graphexec_checkpoints")

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
        prepare: bool = False,
        snapshot_policy: SnapshotPolicy | None = None,
        encryption: Encryption | None = None,
        default_ttl: float | None = None,
    ) -> AsyncIterator[Self]:
        """Open (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor::

            async with PostgresCheckpointer.open(dsn, schema="agents") as cp: ...
        """
        cp = cls(
            dsn,
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
            prepare=prepare,
            snapshot_policy=snapshot_policy,
            encryption=encryption,
            default_ttl=default_ttl,
        )
        try:
            await cp.setup()
            yield cp
        finally:
            await cp.aclose()

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
        return f"{type(self).__name__}({self._db.where!r})"

    @property
    def schema(self) -> str | None:
        """The schema holding the tables (``None``: the ``search_path``'s first)."""
        return self._db.schema

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        """Open this event loop's pool and create or migrate the schema. Idempotent.

        Raises:
            StorageError: The server cannot be reached, or the schema was written by a newer
                graphexec.
        """
        await self._db.open()

    async def aclose(self) -> None:
        """Close every pool this checkpointer opened, in every event loop.

        The checkpointer cannot be used afterwards.
        """
        await self._db.aclose()

    # -- writes -----------------------------------------------------------------------------

    async def put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        lease: Lease | None = None,
    ) -> None:
        """See :meth:`BaseCheckpointer.put`.

        One statement: lease check, head compare-and-set, the checkpoint row and its channel
        rows, the head move, the removal of the parent's pending writes and the thread's TTL.
        """
        await self._put(checkpoint, expected_head, lease, release=False)

    async def put_final(
        self, checkpoint: Checkpoint, *, expected_head: str | None, lease: Lease
    ) -> None:
        """See :meth:`BaseCheckpointer.put_final`. The same single statement as :meth:`put`."""
        await self._put(checkpoint, expected_head, lease, release=True)

    def _put_params(self, cp: Checkpoint) -> dict[str, Any]:
        """The parameters of ``graphexec_put`` that come from the checkpoint itself."""
        if cp.parent_id is None and cp.snapshot is None:
            raise CheckpointError(
                f"thread {cp.thread_id!r}: checkpoint {cp.checkpoint_id!r} has no parent, so it "
                "must carry a snapshot"
            )
        params, rows = self._codec.encode(cp)
        params.update(
            default_ttl=self._default_ttl,
            checkpoints_table=self._checkpoints_table,
            roles=[r[0] for r in rows],
            channels=[r[1] for r in rows],
            ops=[r[2] for r in rows],
            datas=[r[3] for r in rows],
        )
        return params

    async def _put(
        self,
        checkpoint: Checkpoint,
        expected_head: str | None,
        lease: Lease | None,
        *,
        release: bool,
        writes: tuple[str, Sequence[tuple[str, bytes]]] | None = None,
    ) -> None:
        """One put statement (:data:`_PUT`, or :data:`_PUT_WITH_WRITES_FINAL` with ``writes``).

        ``writes``: ``(task id, writes)`` stored on the new checkpoint; only with ``release``.
        """
        cp = checkpoint
        _check_lease_thread(cp.thread_id, lease)
        params = self._put_params(cp)
        params.update(
            expected_head=expected_head,
            epoch=None if lease is None else lease.epoch,
            release=release and lease is not None,
        )
        if writes is not None:
            assert release and lease is not None, "writes go with a final put"
            task_id = writes[0]
            stored = self._write_rows(
                cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id, task_id, writes[1], lease
            )
            params.update(
                task_id=task_id,
                write_channels=[channel for channel, _ in stored],
                write_datas=[data for _, data in stored],
            )
            statement = _PUT_WITH_WRITES_FINAL
        else:
            statement = _PUT_RELAXED if not release and relaxed_commit.get() else _PUT

        async def body(s: Session) -> tuple[Any, ...]:
            row = await s.fetch_one(statement, params)
            assert row is not None
            verdict, owner, head, dup, written = row[:5]
            if verdict is None and not written:  # another writer created the thread/ns first
                current = await s.fetch_one(_HEAD, params)
                head = None if current is None else current[0]
                verdict = "conflict"
            return verdict, owner, head, dup, s.attempt

        op = "put" if writes is None else "put_with_writes_final"
        verdict, owner, head, dup, attempt = await self._db.run(op, body)
        if verdict is None:
            return
        if attempt > 1 and dup:
            return  # the try whose connection broke did commit: this checkpoint (and all) is ours
        raise _put_error(verdict, cp, expected_head, lease, owner, head)

    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        lease: Lease | None = None,
    ) -> None:
        """See :meth:`BaseCheckpointer.put_writes`. One statement, shared by concurrent calls.

        Group commit: while one call's statement for a step (thread, namespace, checkpoint and
        lease epoch) is in flight, further calls for that step wait and then go together in
        the next statement -- one transaction, one round trip and one commit for a whole
        fan-out's worth of finished tasks instead of one each. Every call still returns only
        once its own writes are committed, with its own verdict, and each call's writes are
        saved atomically (a batch is atomic as a whole).
        """
        stored = self._write_rows(thread_id, checkpoint_ns, checkpoint_id, task_id, writes, lease)
        epoch = None if lease is None else lease.epoch
        key: _WritesKey = (
            asyncio.get_running_loop(),
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            epoch,
        )
        waiting = self._waiting_writes.get(key)
        relaxed = relaxed_commit.get()
        if waiting is not None:  # a statement for this step is in flight: join the next one
            call = _Writes(task_id, stored, relaxed)
            waiting.append(call)
            verdict, owner = await call.done
        else:
            self._waiting_writes[key] = waiting = []
            try:
                verdict, owner = await self._save_writes(key, [_Writes(task_id, stored, relaxed)])
            finally:
                if waiting:  # calls arrived meanwhile: a task sends them on
                    flusher = asyncio.create_task(self._flush_writes(key, waiting))
                    self._flushers.add(flusher)
                    flusher.add_done_callback(self._flushers.discard)
                else:
                    del self._waiting_writes[key]
        self._check_writes(verdict, owner, thread_id, checkpoint_id, lease)

    async def put_writes_final(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        lease: Lease,
    ) -> None:
        """See :meth:`BaseCheckpointer.put_writes_final`. One statement."""
        stored = self._write_rows(thread_id, checkpoint_ns, checkpoint_id, task_id, writes, lease)
        params = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "task_id": task_id,
            "epoch": lease.epoch,
            "channels": [channel for channel, _ in stored],
            "datas": [data for _, data in stored],
        }
        [(verdict, owner)] = await self._db.fetch("put_writes", _PUT_WRITES_FINAL, params)
        self._check_writes(verdict, owner, thread_id, checkpoint_id, lease)

    async def put_with_writes_final(
        self,
        checkpoint: Checkpoint,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        expected_head: str | None,
        lease: Lease,
    ) -> None:
        """See :meth:`BaseCheckpointer.put_with_writes_final`. One statement."""
        await self._put(checkpoint, expected_head, lease, release=True, writes=(task_id, writes))

    def _write_rows(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        lease: Lease | None,
    ) -> list[tuple[str, bytes]]:
        """The rows ``put_writes`` stores, one per channel and task.

        A channel written twice keeps its first position and its last value.
        """
        _check_lease_thread(thread_id, lease)
        last = dict(writes)
        return self._codec.write_rows(
            thread_id, checkpoint_ns, checkpoint_id, task_id, list(last.items())
        )

    def _check_writes(
        self, verdict: Any, owner: Any, thread_id: str, checkpoint_id: str, lease: Lease | None
    ) -> None:
        if verdict is None:
            return
        if verdict == "no_checkpoint":
            raise CheckpointError(
                f"thread {thread_id!r}: cannot save writes for unknown checkpoint {checkpoint_id!r}"
            )
        raise _lease_error(verdict, thread_id, lease, owner)

    async def _save_writes(self, key: _WritesKey, batch: Sequence[_Writes]) -> tuple[Any, Any]:
        """Save ``batch`` in one statement; returns ``(verdict, lease owner)``."""
        _, thread_id, checkpoint_ns, checkpoint_id, epoch = key
        params: dict[str, Any] = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
            "epoch": epoch,
            "channels": [channel for call in batch for channel, _ in call.rows],
            "datas": [data for call in batch for _, data in call.rows],
        }
        relaxed = all(call.relaxed for call in batch)  # flushed if any caller needs it
        if len(batch) == 1:
            params["task_id"] = batch[0].task_id
            statement = _PUT_WRITES_RELAXED if relaxed else _PUT_WRITES
        else:
            params["task_ids"] = [call.task_id for call in batch for _ in call.rows]
            statement = _PUT_WRITES_BATCH_RELAXED if relaxed else _PUT_WRITES_BATCH
        [row] = await self._db.fetch("put_writes", statement, params)
        return row[0], row[1]

    async def _flush_writes(self, key: _WritesKey, waiting: list[_Writes]) -> None:
        """Send the calls waiting for ``key`` in batches until none is left."""
        try:
            while waiting:
                batch = _next_batch(waiting)
                try:
                    result = await self._save_writes(key, batch)
                except Exception as e:
                    for call in batch:
                        if not call.done.done():
                            call.done.set_exception(e)
                    continue
                except BaseException:  # cancelled: the batch's callers are cancelled too
                    for call in batch:
                        call.done.cancel()
                    raise
                for call in batch:
                    if not call.done.done():
                        call.done.set_result(result)
        finally:
            del self._waiting_writes[key]
            for call in waiting:  # only if this task was cancelled
                call.done.cancel()

    # -- reads ------------------------------------------------------------------------------

    async def _read(
        self, op: str, query: str, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        """Run one read statement (see :class:`~checkpointers._reads.SqlReads`)."""
        return await self._db.fetch(op, query, params)

    async def _get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, known: str | None
    ) -> CheckpointTuple | None:
        """``get`` and ``get_since``: the shared read, through its server-side function."""
        rows = await self._db.fetch(
            "get",
            _GET,
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint_id,
                "known": known,
            },
        )
        return self._codec.checkpoint_tuple(thread_id, checkpoint_ns, rows, known)

    # -- retention --------------------------------------------------------------------------

    async def delete_thread(self, thread_id: str) -> None:
        """See :meth:`BaseCheckpointer.delete_thread`.

        Also drops the thread's TTL. The lease is released, but its epoch is kept so a run that
        held it before the deletion can never write again.
        """
        key = {"thread_id": thread_id}

        async def body(s: Session) -> None:
            await s.fetch(_LOCK_LEASE, key)
            await s.fetch(_LOCK_HEADS, key)
            await s.fetch(_LOCK_CHECKPOINTS, key)
            for statement in sql.DELETE_THREAD:
                await s.fetch(statement, key)

        await self._db.transaction("delete_thread", body)

    async def prune(
        self,
        thread_id: str,
        *,
        keep_last: int,
        rebase: tuple[str, Mapping[str, bytes]] | None = None,
    ) -> int:
        """See :meth:`BaseCheckpointer.prune`. One transaction, every namespace of the thread.

        The thread's head rows are locked first, so commits to the thread wait for the prune
        (and a prune waits for a commit in flight) instead of racing it.
        """
        if keep_last < 1:
            raise ValueError(f"prune(keep_last={keep_last}): keep at least 1 checkpoint")
        codec = self._codec
        rebase_rows: list[_rows.ChannelRow] = []
        rebase_bytes = 0
        if rebase is not None:
            rebase_rows = codec.snapshot_rows(thread_id, "", rebase[0], rebase[1])
            rebase_bytes = sum(len(b) for b in rebase[1].values())

        op_id = uuid.uuid4().hex

        async def body(s: Session) -> int:
            if s.attempt > 1:  # maybe a retry after a lost COMMIT reply: did it commit?
                done = await s.fetch_one(_OP_RESULT, {"op_id": op_id})
                if done is not None:
                    return int(done[0])
            await s.fetch(_LOCK_HEADS, {"thread_id": thread_id})
            if rebase is not None:
                target = await s.fetch(
                    sql.REBASE_TARGET, {"thread_id": thread_id, "checkpoint_id": rebase[0]}
                )
                for seq, metadata, *structure in target:
                    if structure[-1]:  # has_snapshot: nothing to do
                        continue
                    manifest = await s.fetch(sql.CHANNEL_MANIFEST, {"cp_seq": seq})
                    resealed = codec.rebased_metadata(
                        (thread_id, "", rebase[0]),
                        metadata,
                        structure,
                        [(r, c, o) for r, c, o in manifest],
                        rebase_rows,
                        rebase_bytes,
                    )
                    await s.execute_many(
                        sql.INSERT_CHANNEL,
                        [
                            {"cp_seq": seq, "role": role, "channel": ch, "op": op, "data": data}
                            for role, ch, op, data in rebase_rows
                        ],
                    )
                    await s.fetch(
                        sql.REBASE,
                        {"cp_seq": seq, "snapshot_bytes": rebase_bytes, "metadata": resealed},
                    )
            doomed = await s.fetch(
                sql.PRUNE_DOOMED, {"thread_id": thread_id, "keep_last": keep_last}
            )
            seqs = [{"cp_seq": seq} for (seq,) in doomed]
            if seqs:
                await s.fetch(_LOCK_DOOMED, {"seqs": [seq for (seq,) in doomed]})
            for statement in (sql.DELETE_CHANNELS_OF, sql.DELETE_WRITES_OF, sql.DELETE_CHECKPOINT):
                await s.execute_many(statement, seqs)
            await s.fetch(_FORGET_OLD_OPS)
            await s.fetch(_RECORD_OP, {"op_id": op_id, "result": len(seqs)})
            return len(seqs)

        return await self._db.transaction("prune", body)

    async def set_ttl(self, thread_id: str, ttl: float | None) -> None:
        """Delete ``thread_id`` (on the next :meth:`expire`) once idle for ``ttl`` seconds.

        Idle time counts from the thread's last committed checkpoint (from now, for a thread
        without checkpoints yet). ``None`` removes the TTL.

        Raises:
            InvalidTTLError: ``ttl`` is not finite seconds in 0 to 100 years
                (:func:`~graphexec._checkpoint.validate_ttl`); nothing is stored.
        """
        ttl = validate_ttl(ttl, thread_id=thread_id)
        await self._db.fetch("set_ttl", _SET_TTL, {"thread_id": thread_id, "ttl": ttl})

    async def expire(self) -> int:
        """Delete every thread idle for longer than its TTL; return how many were deleted.

        A thread whose lease is live (a run is on it) is skipped until its next sweep. Deletes
        in batches, one transaction each; several processes may sweep at once.
        """
        total = 0
        while True:

            async def body(s: Session) -> tuple[int, int]:
                found = [t for (t,) in await s.fetch(_EXPIRED, {"limit": _EXPIRE_BATCH})]
                if not found:
                    return 0, 0
                ids = {"ids": sorted(found)}
                await s.fetch(_LOCK_LEASES_OF, ids)
                await s.fetch(_LOCK_HEADS_OF, ids)
                await s.fetch(_LOCK_CHECKPOINTS_OF, ids)
                doomed = [{"thread_id": t} for (t,) in await s.fetch(_DELETE_EXPIRED, ids)]
                for statement in sql.DELETE_THREAD:
                    await s.execute_many(statement, doomed)
                return len(found), len(doomed)

            found, deleted = await self._db.transaction("expire", body)
            total += deleted
            if found < _EXPIRE_BATCH:
                return total

    # -- leases -----------------------------------------------------------------------------

    async def acquire_lease(self, thread_id: str, *, owner: str, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.acquire_lease`. Epochs increase across processes."""
        params = {"thread_id": thread_id, "owner": owner, "ttl": float(ttl)}

        async def body(s: Session) -> Lease:
            for _ in range(_ACQUIRE_TRIES):
                taken = await s.fetch_one(_ACQUIRE, params)
                if taken is not None:
                    return Lease(thread_id, owner, int(taken[0]), float(taken[1]))
                holder = await s.fetch_one(_LEASE_HOLDER, params)
                if holder is not None and holder[0] is not None and holder[1]:
                    raise ThreadBusyError(
                        f"thread {thread_id!r} is owned by run {holder[0]!r} until its lease "
                        "expires; retry later or pass on_busy='wait'",
                        thread_id=thread_id,
                        owner=holder[0],
                    )
                # released or expired between the two statements: try again
            raise StorageError(
                f"acquire_lease({thread_id!r}): the lease changed hands {_ACQUIRE_TRIES} times "
                "while it was being taken; retry"
            )

        return await self._db.run("acquire_lease", body)

    async def acquire_lease_and_get(
        self,
        thread_id: str,
        *,
        owner: str,
        ttl: float,
        checkpoint_id: str | None = None,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None]:
        """See :meth:`BaseCheckpointer.acquire_lease_and_get`. One statement, one round trip.

        The lease is taken exactly as :meth:`acquire_lease` takes it, and the read is made in
        the same transaction, after it.
        """
        rows = await self._db.fetch(
            "acquire_lease",
            _ACQUIRE_GET,
            {
                "thread_id": thread_id,
                "owner": owner,
                "ttl": float(ttl),
                "checkpoint_id": checkpoint_id,
                "known": known,
            },
        )
        lease = _started_lease(rows, thread_id, owner)
        try:
            tup = self._codec.checkpoint_tuple(thread_id, "", rows[1:], known)
        except BaseException:
            await self.release_lease(lease)
            raise
        return lease, tup

    async def acquire_lease_and_put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        owner: str,
        ttl: float,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None, bool]:
        """See :meth:`BaseCheckpointer.acquire_lease_and_put`. One statement, one round trip."""
        cp = checkpoint
        check_run_start(cp)
        params = self._put_params(cp)
        params.update(owner=owner, ttl=float(ttl), known=known, expected_head=expected_head)
        rows = await self._db.fetch("acquire_lease", _ACQUIRE_PUT, params)
        lease = _started_lease(rows, cp.thread_id, owner)
        try:
            if rows[-1][0] == "put":
                verdict, written = rows[-1][3], rows[-1][1]
                if verdict is None and written:
                    return lease, None, True
                raise _put_error(verdict or "conflict", cp, expected_head, lease, None, None)
            tup = self._codec.checkpoint_tuple(cp.thread_id, "", rows[1:], known)
        except BaseException:
            await self.release_lease(lease)
            raise
        if tup is not None and tup.checkpoint.checkpoint_id == cp.checkpoint_id:
            # A retry after a lost reply: the try that broke did commit, and it was this one.
            return lease, None, True
        return lease, tup, False

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.renew_lease`."""
        rows = await self._db.fetch(
            "renew_lease",
            _RENEW,
            {"thread_id": lease.thread_id, "epoch": lease.epoch, "ttl": float(ttl)},
        )
        if not rows:
            raise LeaseLostError(
                f"thread {lease.thread_id!r}: lease epoch {lease.epoch} was taken over",
                thread_id=lease.thread_id,
                epoch=lease.epoch,
            )
        owner, expires_at = rows[0]
        return Lease(lease.thread_id, owner, lease.epoch, float(expires_at))

    async def release_lease(self, lease: Lease) -> None:
        """See :meth:`BaseCheckpointer.release_lease`."""
        await self._db.fetch(
            "release_lease", sql.RELEASE_LEASE, {"thread_id": lease.thread_id, "epoch": lease.epoch}
        )
