"""The SQLite checkpointer: one file, many processes, no server.

Durability and concurrency:

- The database runs in WAL mode: readers never block the writer and the writer never blocks
  readers. Every write is one ``BEGIN IMMEDIATE`` transaction, so a writer takes the file's write
  lock before it reads anything it will act on, and the checks in a commit (lease epoch, head
  compare-and-set) and the writes they guard are atomic across processes.
- A writer that finds the lock taken waits up to ``busy_timeout`` (SQLite's busy handler), and
  the whole transaction is retried a few times with jittered backoff before
  :class:`~graphexec.errors.StorageError` is raised. A failed transaction is rolled back: the
  file is left exactly as it was.
- ``synchronous="NORMAL"`` (the default) never corrupts the file and never loses a commit when a
  *process* dies, but the last commits before a power loss or OS crash may be lost.
  ``synchronous="FULL"`` fsyncs every commit, so a commit that returned survives power loss too,
  at the cost of one fsync per step.

Event loops: the same object works from any event loop (the sync facade's background loop,
pytest's loop, ``asyncio.run``). It opens a writer and a reader connection per loop, lazily,
and :meth:`SqliteCheckpointer.aclose` closes them all. A write transaction is sent whole to the
writer connection's thread and runs there from ``BEGIN IMMEDIATE`` to ``COMMIT``, so concurrent
coroutines can never interleave statements inside one another's transactions (and a cancelled
caller cannot leave one half done); reads are single statements on the reader connection and
never queue behind writes. A run starts with one transaction that takes the thread's lease and
reads its head (``acquire_lease_and_get``), or, on a thread the engine believes new, takes the
lease and commits the input checkpoint (``acquire_lease_and_put``).

Upgrades: the first open by a newer graphexec migrates the file in one transaction (other
processes opening it meanwhile wait for it); a graphexec older than the file's schema refuses
to open it. Processes of an older version that already have the file open are not stopped, and
their statements do not fit the new schema: stop them before the upgrade. (Schema 23 makes
their commits fail on a constraint, but their reads and prunes would misread the new rows.)

Retention: :meth:`~SqliteCheckpointer.prune`, :meth:`~SqliteCheckpointer.delete_thread` and
:meth:`~SqliteCheckpointer.expire` delete rows; SQLite then reuses the freed pages for new data,
but the file does not shrink. To give space back to the OS run ``VACUUM`` on the file while no
process uses it (for example ``sqlite3 runs.db 'VACUUM'``); it rewrites the whole database.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from checkpointers import _rows
from checkpointers import _sql as sql
from checkpointers import _sqlite_sql as lite
from checkpointers._crypto import Encryption
from checkpointers._reads import SqlReads
from checkpointers._sqlite_db import OffTheLoop, SqliteDatabase, fetch, on_loop
from graphexec._checkpoint import (
    BaseCheckpointer,
    Checkpoint,
    CheckpointTuple,
    Lease,
    SnapshotPolicy,
    check_run_start,
    validate_ttl,
)
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    LeaseLostError,
    ThreadBusyError,
)

__all__ = ["SqliteCheckpointer"]

_EXPIRE_BATCH = 200

# Transaction bodies run on a connection's thread, whose frame keeps the last one alive until the
# next call: they never capture the checkpointer, so a leaked one can still be collected (and warn).


def _check_lease(thread_id: str, lease: Lease | None, row: Sequence[Any], now: float) -> None:
    current = _rows.lease_row(row)
    if lease is not None:
        if lease.thread_id != thread_id:
            raise CheckpointError(
                f"lease for thread {lease.thread_id!r} used to write thread {thread_id!r}"
            )
        if current is None or current[1] != lease.epoch:
            raise LeaseLostError(
                f"thread {thread_id!r}: this run's lease (epoch {lease.epoch}) was lost to "
                "another owner; its write was rejected",
                thread_id=thread_id,
                epoch=lease.epoch,
            )
    elif current is not None and current[2] > now:
        raise ThreadBusyError(
            f"thread {thread_id!r} is owned by run {current[0]!r}; wait for it to finish "
            "or for its lease to expire",
            thread_id=thread_id,
            owner=current[0],
        )


def _acquire(db: sqlite3.Connection, thread_id: str, owner: str, ttl: float) -> Lease:
    now = time.time()
    rows = fetch(db, sql.GET_LEASE, {"thread_id": thread_id})
    row = rows[0] if rows else None
    current = _rows.lease_row(row)
    if current is not None and current[2] > now and current[0] != owner:
        raise ThreadBusyError(
            f"thread {thread_id!r} is owned by run {current[0]!r} until its lease "
            "expires; retry later or pass on_busy='wait'",
            thread_id=thread_id,
            owner=current[0],
        )
    lease = Lease(thread_id, owner, (0 if row is None else int(row[1])) + 1, now + ttl)
    fetch(
        db,
        sql.SET_LEASE,
        {
            "thread_id": thread_id,
            "owner": owner,
            "epoch": lease.epoch,
            "expires_at": lease.expires_at,
        },
    )
    return lease


def _key(checkpoint_id: str | None) -> Any:
    return None if checkpoint_id is None else _rows.id_key(checkpoint_id)


def _target(db: sqlite3.Connection, thread_id: str, checkpoint_id: str | None) -> str | None:
    """The checkpoint a read of ``thread_id`` starts at: ``checkpoint_id``, else the head."""
    if checkpoint_id is not None:
        return checkpoint_id
    rows = fetch(db, sql.HEAD_ID, {"thread_id": thread_id, "checkpoint_ns": ""})
    return _rows.id_text(rows[0][0]) if rows else None


def _store_checkpoint(
    db: sqlite3.Connection,
    check: tuple[Any, ...],
    *,
    cp: Checkpoint,
    params: dict[str, Any],
    rows: Sequence[_rows.ChannelRow],
    expected_head: str | None,
    lease: Lease | None,
    release: bool,
    default_ttl: float | None,
) -> int:
    """The body of a put, given the row ``sql.PUT_CHECK`` read in the same transaction.

    Returns the new checkpoint's ``cp_seq``.
    """
    head, owner, epoch, expires, dup, parent_seq, parent_writes, thread, ttl = check
    head = _rows.id_text(head)
    now = time.time()
    _check_lease(cp.thread_id, lease, (owner, epoch, expires), now)
    if head != expected_head:
        raise CheckpointConflictError(
            f"thread {cp.thread_id!r}: expected head {expected_head!r} but the head is "
            f"{head!r}; another run committed first. Reload the thread and retry.",
            thread_id=cp.thread_id,
            expected_head=expected_head,
            actual_head=head,
        )
    if dup is not None:
        raise CheckpointError(
            f"thread {cp.thread_id!r}: checkpoint {cp.checkpoint_id!r} already exists"
        )
    if cp.parent_id is not None and parent_seq is None:
        raise CheckpointError(
            f"thread {cp.thread_id!r}: parent checkpoint {cp.parent_id!r} does not exist"
        )
    seq = db.execute(lite.INSERT_CHECKPOINT, {**params, "parent_seq": parent_seq}).lastrowid
    assert seq is not None
    _insert_channels(db, seq, rows)
    fetch(db, sql.MOVE_HEAD, {**params, "cp_seq": seq})
    if parent_writes:
        fetch(db, sql.DELETE_WRITES_OF, {"cp_seq": parent_seq})
    key = {"thread_id": cp.thread_id, "now": now}
    if thread is not None:
        if ttl is not None:
            fetch(db, sql.TOUCH_THREAD, key)
    elif default_ttl is not None:
        fetch(db, sql.NEW_THREAD_TTL, {**key, "ttl": default_ttl})
    if release and lease is not None:
        fetch(db, sql.RELEASE_LEASE, {"thread_id": lease.thread_id, "epoch": lease.epoch})
    return seq


def _stored_bytes(
    params: Mapping[str, Any],
    rows: Sequence[_rows.ChannelRow],
    writes: Sequence[tuple[str, bytes]] = (),
) -> int:
    """The bytes of blobs and text one write stores: decides whether it may run on the loop."""
    size = sum(len(v) for v in params.values() if isinstance(v, (bytes, str)))
    size += sum(len(row[3]) for row in rows)
    return size + sum(len(data) for _, data in writes)


def _upsert_writes(
    db: sqlite3.Connection, seq: int, task_id: str, stored: Sequence[tuple[str, bytes]]
) -> None:
    if stored:
        db.executemany(
            sql.UPSERT_WRITE,
            [
                {"cp_seq": seq, "task_id": task_id, "channel": ch, "data": data}
                for ch, data in stored
            ],
        )


def _insert_channels(
    db: sqlite3.Connection, seq: int, rows: Sequence[_rows.ChannelRow], start: int = 0
) -> None:
    if start + len(rows) > lite.SLOTS:
        raise CheckpointError(
            f"a checkpoint can store at most {lite.SLOTS} channel rows, got {start + len(rows)}"
        )
    if rows:
        key = seq * lite.SLOTS + start
        db.executemany(
            lite.INSERT_CHANNEL,
            [
                {
                    "row_key": key + i,
                    "cp_seq": seq,
                    "role": role,
                    "channel": ch,
                    "op": op,
                    "data": data,
                }
                for i, (role, ch, op, data) in enumerate(rows)
            ],
        )


class SqliteCheckpointer(SqlReads, BaseCheckpointer):
    """Checkpoints in one SQLite file, shared safely by several processes.

    Stores deltas and periodic snapshots (see :class:`~graphexec.SnapshotPolicy`), one row per
    channel, so storage grows with what steps write, not with steps times state size. Reading a
    checkpoint, its delta chain and its pending writes is one SQL statement (a recursive CTE),
    whatever the chain length.

    Use it as an async context manager, or call :meth:`setup` (optional: the schema is created
    on first use) and :meth:`aclose`::

        async with SqliteCheckpointer.open("runs.db") as cp:
            graph = builder.compile(checkpointer=cp)
            await graph.ainvoke(inputs, thread_id="t1")

    A checkpointer garbage-collected with open connections emits a :class:`ResourceWarning`.

    Args:
        path: The database file (created if missing), or ``":memory:"`` for a private
            in-memory database (one connection, shared by every event loop; gone on close).
        synchronous: ``"NORMAL"`` (default: safe against process crashes) or ``"FULL"``
            (also safe against power loss; one fsync per commit).
        busy_timeout: Seconds a statement waits for another connection's write lock before the
            transaction is retried.
        wal_checkpoints: ``"inline"`` (default: SQLite's own; about every 200th commit copies
            the WAL into the file, 4-5 ms holding the write lock) or ``"background"``: a thread
            per file checkpoints without blocking anyone, for many processes writing one file;
            it costs a few percent of throughput on a small machine (see
            :mod:`checkpointers._sqlite_db`).
        snapshot_policy: Override when full snapshots are stored.
        encryption: Encrypt every stored blob (values, snapshots, frontier, pending writes,
            metadata) with AES-GCM bound to its row; see :class:`~checkpointers.Encryption`.
        default_ttl: Seconds of inactivity after which a thread is deleted by :meth:`expire`,
            applied to threads created from now on; :meth:`set_ttl` sets it per thread.
        loop_writes: ``True`` (default): a run's small commits (checkpoints and pending writes
            up to 64 KiB, lease changes, a run's start when the graph holds the thread's head)
            run on the event loop's thread when the file is not locked, in
            ``synchronous="NORMAL"``: about 55 us of loop time instead of a round trip to the
            connection's thread (about 0.12 ms on 2 CPUs). A locked file, a larger
            write, ``synchronous="FULL"`` and ``":memory:"`` always use the connection's
            thread, and the loop never waits on a lock or an fsync. ``False``: every statement
            runs on the connection's thread (see :mod:`checkpointers._sqlite_db`).
    """

    snapshot_policy: SnapshotPolicy = SnapshotPolicy(max_depth=1000, ratio=3.0, min_bytes=65536)
    """Snapshot when the deltas since the last one reach three times its size, or after 1000.

    Storage against read cost, measured with ``python -m benchmarks`` (SQLite, durability
    sync; bytes after ``wal_checkpoint(TRUNCATE)`` over raw content). A snapshot of an
    append-only channel stores the whole list again, so snapshots dominate the file of a long
    thread: with the byte rule at ratio ``r`` their sizes grow by ``1 + r`` each time, and a
    depth rule that fires before the byte rule adds one full copy per ``max_depth`` steps. The
    previous policy (depth 400, ratio 2, 16 KiB) stored the 1,000-step ``loop`` benchmark at
    3.48x its raw content (with compact rows; 4.24x before them), with snapshots at steps 0,
    81, 243 and 643; this one stores it at 2.83x (snapshots at 0 and 323), ``chat`` at 2.53x
    (2.27x) and ``chat-long`` at 1.95x (3.25x).

    The price is the cold read: a read folds every delta since the last snapshot -- at most
    ``max_depth`` of them -- unless the graph's cache already holds an older checkpoint's
    values (then it folds only the newer ones). At step 1000 of ``loop``, ``aget_state`` in a
    new process folds 677 deltas in about 12 ms, against 357 deltas in about 6 ms before (the
    cost per delta is unchanged); the worst case, 1000 deltas, is about 18 ms. A smaller depth
    buys cheaper cold reads with more storage: for append-only state any depth below the
    byte rule's spacing adds a full copy of the state every ``max_depth`` steps.
    """

    _get_sql = lite.GET_CHECKPOINT
    _list_sql = lite.LIST_CHECKPOINTS
    _tips_sql = lite.LIST_TIPS
    _key = staticmethod(_key)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 5.0,
        snapshot_policy: SnapshotPolicy | None = None,
        encryption: Encryption | None = None,
        default_ttl: float | None = None,
        wal_checkpoints: Literal["inline", "background"] = "inline",
        loop_writes: bool = True,
    ) -> None:
        default_ttl = validate_ttl(default_ttl)
        if snapshot_policy is not None:
            self.snapshot_policy = snapshot_policy
        self._db = SqliteDatabase(
            path,
            owner=f"{type(self).__name__}({os.fspath(path)!r})",
            migrations=sql.migrations(sql.SQLITE),
            version_table=sql.VERSION_TABLE,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            functions=lite.FUNCTIONS,
            wal_checkpoints=wal_checkpoints,
            loop_writes=loop_writes,
        )
        self._default_ttl = default_ttl
        self._codec = _rows.RowCodec(encryption, compact_metadata=True)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        busy_timeout: float = 5.0,
        snapshot_policy: SnapshotPolicy | None = None,
        encryption: Encryption | None = None,
        default_ttl: float | None = None,
        wal_checkpoints: Literal["inline", "background"] = "inline",
        loop_writes: bool = True,
    ) -> AsyncIterator[Self]:
        """Open (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor::

            async with SqliteCheckpointer.open("runs.db", synchronous="FULL") as cp: ...
        """
        cp = cls(
            path,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            snapshot_policy=snapshot_policy,
            encryption=encryption,
            default_ttl=default_ttl,
            wal_checkpoints=wal_checkpoints,
            loop_writes=loop_writes,
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
    def path(self) -> Path | None:
        """The database file, or ``None`` for ``":memory:"``."""
        return None if self._db.memory else Path(self._db.where)

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        """Open this event loop's connections and create or migrate the schema. Idempotent.

        Migrations run in one ``BEGIN IMMEDIATE`` transaction, so several processes opening a
        new file at once apply each migration exactly once.

        Raises:
            StorageError: The file cannot be opened, or it was written by a newer graphexec.
        """
        await self._db.open()

    async def aclose(self) -> None:
        """Close every connection this checkpointer opened, in every event loop.

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

        One transaction: lease check, head compare-and-set, the checkpoint row and its channel
        rows, the head move and the removal of the parent's pending writes.
        """
        await self._put(checkpoint, expected_head, lease, release=False)

    async def put_final(
        self, checkpoint: Checkpoint, *, expected_head: str | None, lease: Lease
    ) -> None:
        """See :meth:`BaseCheckpointer.put_final`. One transaction, the lease release included."""
        await self._put(checkpoint, expected_head, lease, release=True)

    def _encode_put(self, cp: Checkpoint) -> tuple[dict[str, Any], list[_rows.ChannelRow]]:
        if cp.parent_id is None and cp.snapshot is None:
            raise CheckpointError(
                f"thread {cp.thread_id!r}: checkpoint {cp.checkpoint_id!r} has no parent, so it "
                "must carry a snapshot"
            )
        params, rows = self._codec.encode(cp)
        params.update(
            checkpoint_id=_key(cp.checkpoint_id),
            parent_id=_key(cp.parent_id),
            graph_version=_rows.version_key(cp.graph_version),
        )
        return params, rows

    async def _put(
        self,
        checkpoint: Checkpoint,
        expected_head: str | None,
        lease: Lease | None,
        *,
        release: bool,
        writes: tuple[str, Sequence[tuple[str, bytes]]] | None = None,
    ) -> None:
        """One put transaction; ``writes``: ``(task id, writes)`` stored on the new checkpoint."""
        params, rows = self._encode_put(checkpoint)
        store = functools.partial(
            _store_checkpoint,
            cp=checkpoint,
            params=params,
            rows=rows,
            expected_head=expected_head,
            lease=lease,
            release=release,
            default_ttl=self._default_ttl,
        )
        task_id, stored = "", list[tuple[str, bytes]]()
        if writes is not None:
            cp = checkpoint
            task_id = writes[0]
            stored = self._codec.write_rows(
                cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id, task_id, writes[1]
            )

        def body(db: sqlite3.Connection) -> None:
            [check] = fetch(db, sql.PUT_CHECK, params)
            seq = store(db, check)
            _upsert_writes(db, seq, task_id, stored)

        op = "put" if writes is None else "put_with_writes_final"
        await self._db.write(op, body, size=_stored_bytes(params, rows, stored))

    async def put_with_writes_final(
        self,
        checkpoint: Checkpoint,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        expected_head: str | None,
        lease: Lease,
    ) -> None:
        """See :meth:`BaseCheckpointer.put_with_writes_final`.

        One transaction: :meth:`put`'s, with the task's writes and the lease release.
        """
        await self._put(checkpoint, expected_head, lease, release=True, writes=(task_id, writes))

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
        """See :meth:`BaseCheckpointer.put_writes`."""
        await self._put_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, writes, lease)

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
        """See :meth:`BaseCheckpointer.put_writes_final`. One transaction, the release included."""
        await self._put_writes(
            thread_id, checkpoint_ns, checkpoint_id, task_id, writes, lease, release=True
        )

    async def _put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        lease: Lease | None,
        *,
        release: bool = False,
    ) -> None:
        stored = self._codec.write_rows(thread_id, checkpoint_ns, checkpoint_id, task_id, writes)
        key = {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": _key(checkpoint_id),
        }

        def body(db: sqlite3.Connection) -> None:
            [(owner, epoch, expires, seq)] = fetch(db, sql.WRITES_CHECK, key)
            _check_lease(thread_id, lease, (owner, epoch, expires), time.time())
            if seq is None:
                raise CheckpointError(
                    f"thread {thread_id!r}: cannot save writes for unknown checkpoint "
                    f"{checkpoint_id!r}"
                )
            _upsert_writes(db, seq, task_id, stored)
            if release and lease is not None:
                fetch(db, sql.RELEASE_LEASE, {"thread_id": thread_id, "epoch": lease.epoch})

        op = "put_writes_final" if release else "put_writes"
        await self._db.write(op, body, size=_stored_bytes({}, (), stored))

    # -- reads ------------------------------------------------------------------------------

    async def _read(
        self, op: str, query: str, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        """Run one read statement (see :class:`~checkpointers._reads.SqlReads`)."""
        return await self._db.read(op, query, params)

    # -- retention --------------------------------------------------------------------------

    async def delete_thread(self, thread_id: str) -> None:
        """See :meth:`BaseCheckpointer.delete_thread`.

        Also drops the thread's TTL. The lease is released, but its epoch is kept so a run that
        held it before the deletion can never write again.
        """

        def body(db: sqlite3.Connection) -> None:
            for statement in lite.DELETE_THREAD:
                fetch(db, statement, {"thread_id": thread_id})

        await self._db.write("delete_thread", body)

    async def prune(
        self,
        thread_id: str,
        *,
        keep_last: int,
        rebase: tuple[str, Mapping[str, bytes]] | None = None,
    ) -> int:
        """See :meth:`BaseCheckpointer.prune`. One transaction, every namespace of the thread."""
        if keep_last < 1:
            raise ValueError(f"prune(keep_last={keep_last}): keep at least 1 checkpoint")
        codec = self._codec
        rebase_rows: list[_rows.ChannelRow] = []
        rebase_bytes = 0
        if rebase is not None:
            rebase_rows = codec.snapshot_rows(thread_id, "", rebase[0], rebase[1])
            rebase_bytes = sum(len(b) for b in rebase[1].values())

        def body(db: sqlite3.Connection) -> int:
            if rebase is not None:
                target = fetch(
                    db,
                    lite.REBASE_TARGET,
                    {"thread_id": thread_id, "checkpoint_id": _key(rebase[0])},
                )
                for seq, metadata, parent, *structure in target:
                    structure.insert(0, _rows.id_text(parent))
                    structure[3] = _rows.version_text(structure[3])  # STRUCTURE's order
                    if structure[-1]:  # has_snapshot: nothing to do
                        continue
                    manifest = fetch(db, lite.CHANNEL_MANIFEST, {"cp_seq": seq})
                    resealed = codec.rebased_metadata(
                        (thread_id, "", rebase[0]),
                        metadata,
                        structure,
                        [(r, c, o) for r, c, o in manifest],
                        rebase_rows,
                        rebase_bytes,
                    )
                    _insert_channels(db, seq, rebase_rows, start=len(manifest))
                    fetch(
                        db,
                        sql.REBASE,
                        {"cp_seq": seq, "snapshot_bytes": rebase_bytes, "metadata": resealed},
                    )
            plan = fetch(db, lite.PRUNE_PLAN, {"thread_id": thread_id, "keep_last": keep_last})
            orphans = [{"cp_seq": seq} for seq, orphan in plan if orphan]
            if orphans:
                db.executemany(lite.DETACH_PARENT, orphans)
            seqs = [{"cp_seq": seq} for seq, orphan in plan if not orphan]
            if seqs:
                for statement in (
                    lite.DELETE_CHANNELS_OF,
                    sql.DELETE_WRITES_OF,
                    sql.DELETE_CHECKPOINT,
                ):
                    db.executemany(statement, seqs)
            return len(seqs)

        return await self._db.write("prune", body)

    async def set_ttl(self, thread_id: str, ttl: float | None) -> None:
        """Delete ``thread_id`` (on the next :meth:`expire`) once idle for ``ttl`` seconds.

        Idle time counts from the thread's last committed checkpoint (from now, for a thread
        without checkpoints yet). ``None`` removes the TTL.

        Raises:
            InvalidTTLError: ``ttl`` is not finite seconds in 0 to 100 years
                (:func:`~graphexec._checkpoint.validate_ttl`); nothing is stored.
        """
        ttl = validate_ttl(ttl, thread_id=thread_id)

        def body(db: sqlite3.Connection) -> None:
            [(last,)] = fetch(db, sql.LAST_COMMIT, {"thread_id": thread_id})
            touched = time.time() if last is None else last / 1_000_000
            fetch(db, sql.SET_TTL, {"thread_id": thread_id, "ttl": ttl, "touched_at": touched})

        await self._db.write("set_ttl", body)

    async def expire(self) -> int:
        """Delete every thread idle for longer than its TTL; return how many were deleted.

        A thread whose lease is live (a run is on it) is skipped until its next sweep. Deletes
        in batches, one transaction each, so writers are never blocked for long.
        """
        total = 0
        while True:

            def body(db: sqlite3.Connection) -> int:
                expired = fetch(
                    db, sql.EXPIRED_THREADS, {"now": time.time(), "limit": _EXPIRE_BATCH}
                )
                params = [{"thread_id": thread_id} for (thread_id,) in expired]
                if params:
                    for statement in lite.DELETE_THREAD:
                        db.executemany(statement, params)
                return len(params)

            deleted = await self._db.write("expire", body)
            total += deleted
            if deleted < _EXPIRE_BATCH:
                return total

    # -- leases -----------------------------------------------------------------------------

    async def acquire_lease(self, thread_id: str, *, owner: str, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.acquire_lease`. Epochs increase across processes."""

        def body(db: sqlite3.Connection) -> Lease:
            return _acquire(db, thread_id, owner, ttl)

        return await self._db.write("acquire_lease", body, size=0)

    async def acquire_lease_and_get(
        self,
        thread_id: str,
        *,
        owner: str,
        ttl: float,
        checkpoint_id: str | None = None,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None]:
        """See :meth:`BaseCheckpointer.acquire_lease_and_get`. One transaction.

        The read is decoded inside the transaction too, so a checkpoint that cannot be read
        leaves the lease untaken.
        """
        codec = self._codec
        params = {
            "thread_id": thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": _key(checkpoint_id),
            "known": _key(known),
        }

        def body(db: sqlite3.Connection) -> tuple[Lease, CheckpointTuple | None]:
            if on_loop(db) and _target(db, thread_id, checkpoint_id) != known:
                # The thread moved past the caller's checkpoint (another graph object or
                # process ran it): the read may fold a long delta chain, not on the loop.
                raise OffTheLoop
            lease = _acquire(db, thread_id, owner, ttl)
            rows = fetch(db, lite.GET_CHECKPOINT, params)
            return lease, codec.checkpoint_tuple(thread_id, "", rows, known)

        # On the loop only when the caller holds the checkpoint to read: the read then stops
        # at it at once. Anything else reads and folds a delta chain on the writer's thread.
        return await self._db.write("acquire_lease", body, size=None if known is None else 0)

    async def acquire_lease_and_put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        owner: str,
        ttl: float,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None, bool]:
        """See :meth:`BaseCheckpointer.acquire_lease_and_put`. One transaction."""
        cp = checkpoint
        check_run_start(cp)
        params, rows = self._encode_put(cp)
        codec = self._codec
        read = {
            "thread_id": cp.thread_id,
            "checkpoint_ns": "",
            "checkpoint_id": None,
            "known": _key(known),
        }
        store = functools.partial(
            _store_checkpoint,
            cp=cp,
            params=params,
            rows=rows,
            expected_head=expected_head,
            release=False,
            default_ttl=self._default_ttl,
        )

        def body(db: sqlite3.Connection) -> tuple[Lease, CheckpointTuple | None, bool]:
            lease = _acquire(db, cp.thread_id, owner, ttl)
            [check] = fetch(db, sql.PUT_CHECK, params)
            if _rows.id_text(check[0]) != expected_head:
                if check[0] is not None and on_loop(db):
                    raise OffTheLoop  # the thread moved: a delta chain to fold, not on the loop
                rows = fetch(db, lite.GET_CHECKPOINT, read)
                return lease, codec.checkpoint_tuple(cp.thread_id, "", rows, known), False
            store(db, check, lease=lease)
            return lease, None, True

        # When the head is not the expected one, the body reads it instead (from ``known``
        # on, as acquire_lease_and_get does); without ``known`` it does that off the loop.
        return await self._db.write("acquire_lease", body, size=_stored_bytes(params, rows))

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.renew_lease`."""

        def body(db: sqlite3.Connection) -> Lease:
            expires_at = time.time() + ttl
            rows = fetch(
                db,
                sql.RENEW_LEASE,
                {"thread_id": lease.thread_id, "epoch": lease.epoch, "expires_at": expires_at},
            )
            if not rows:
                raise LeaseLostError(
                    f"thread {lease.thread_id!r}: lease epoch {lease.epoch} was taken over",
                    thread_id=lease.thread_id,
                    epoch=lease.epoch,
                )
            return Lease(lease.thread_id, rows[0][0], lease.epoch, expires_at)

        return await self._db.write("renew_lease", body, size=0)

    async def release_lease(self, lease: Lease) -> None:
        """See :meth:`BaseCheckpointer.release_lease`."""

        def body(db: sqlite3.Connection) -> None:
            fetch(db, sql.RELEASE_LEASE, {"thread_id": lease.thread_id, "epoch": lease.epoch})

        await self._db.write("release_lease", body, size=0)
