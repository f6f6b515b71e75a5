"""The statements :class:`~checkpointers.postgres.PostgresCheckpointer` sends.

Calls of the server-side functions of :mod:`checkpointers._pg_sql` and the statements only
PostgreSQL runs (row locks, the database clock, writes in CTEs); the portable ones (reads,
retention, the schema) come from :mod:`checkpointers._sql`. Kept apart from the backend's
Python so each file reads as one thing.
"""

from __future__ import annotations

# Locks are always taken lease -> heads -> checkpoints/threads. "(SELECT count(*) FROM x) >= 0"
# in a CTE makes it read x first, which orders the row locks inside one statement.

_NOW = "extract(epoch FROM clock_timestamp())::float8"

_NO_FLUSH = "set_config('synchronous_commit', 'off', true)"
"""Lets this statement's transaction (only: ``is_local``) commit without waiting for its WAL
to reach the disk. PostgreSQL reads the setting at commit time and resets it afterwards, so it
keeps no session state and works through transaction-mode poolers."""

_PUT = """SELECT * FROM graphexec_put(:thread_id, :checkpoint_ns, :checkpoint_id, :parent_id,
        :expected_head, :epoch::bigint, :step::bigint, :source, :created_at::bigint,
        :graph_version, :next_nodes, :frontier::bytea, :metadata::bytea, :delta_depth::bigint,
        :delta_bytes::bigint, :snapshot_bytes::bigint, :has_snapshot::bigint,
        :default_ttl::float8, :checkpoints_table::text, :release::boolean, :roles::text[],
        :channels::text[], :ops::text[], :datas::bytea[])"""
"""Checks and commits one checkpoint (see :data:`checkpointers._pg_sql.PG_PUT_FUNCTION`); returns
``(verdict, lease owner, head, dup, written)``. With ``:release`` it also releases the lease
``:epoch`` once the commit is written (``put_final``)."""


def _relaxed(statement: str) -> str:
    """``statement`` (a ``SELECT * FROM`` a function) acknowledged before its commit is flushed."""
    if not statement.startswith("SELECT * FROM "):
        raise ValueError(f"not a function call: {statement[:40]!r}")
    return statement.replace("SELECT * FROM", f"SELECT *, {_NO_FLUSH} FROM", 1)


_PUT_RELAXED = _relaxed(_PUT)
""":data:`_PUT` acknowledged before its commit is flushed (``async`` durability only; see
:meth:`PostgresCheckpointer.put`)."""

_HEAD = """SELECT head_id FROM graphexec_heads
    WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns"""

_PUT_WRITES = """SELECT * FROM graphexec_put_writes(:thread_id, :checkpoint_ns, :checkpoint_id,
        :epoch::bigint, array_fill(:task_id, ARRAY[cardinality(:channels::text[])]),
        :channels::text[], :datas::bytea[])"""
"""Checks and saves one task's writes (see :data:`checkpointers._pg_sql.PG_PUT_WRITES_FUNCTION`);
returns ``(verdict, lease owner)``."""

_PUT_WRITES_BATCH = """SELECT * FROM graphexec_put_writes(:thread_id, :checkpoint_ns,
        :checkpoint_id, :epoch::bigint, :task_ids::text[], :channels::text[], :datas::bytea[])"""
"""Like :data:`_PUT_WRITES` for the writes of several tasks (``:task_ids``: one per write)."""

_PUT_WRITES_RELAXED = _relaxed(_PUT_WRITES)
_PUT_WRITES_BATCH_RELAXED = _relaxed(_PUT_WRITES_BATCH)

_PUT_WRITES_FINAL = """SELECT * FROM graphexec_put_writes_final(:thread_id, :checkpoint_ns,
        :checkpoint_id, :epoch::bigint, array_fill(:task_id, ARRAY[cardinality(:channels::text[])]),
        :channels::text[], :datas::bytea[])"""
""":data:`_PUT_WRITES`, then (only if the writes were saved) the lease's release, in one
statement (see :data:`checkpointers._pg_sql.PG_PUT_WRITES_FINAL_FUNCTION`)."""

_PUT_WITH_WRITES_FINAL = """SELECT * FROM graphexec_put_with_writes_final(:thread_id,
        :checkpoint_ns, :checkpoint_id, :parent_id, :expected_head, :epoch::bigint,
        :step::bigint, :source, :created_at::bigint, :graph_version, :next_nodes,
        :frontier::bytea, :metadata::bytea, :delta_depth::bigint, :delta_bytes::bigint,
        :snapshot_bytes::bigint, :has_snapshot::bigint, :default_ttl::float8,
        :checkpoints_table::text, :roles::text[], :channels::text[], :ops::text[],
        :datas::bytea[], :task_id, :write_channels::text[], :write_datas::bytea[])"""
""":data:`_PUT` of a checkpoint, then :data:`_PUT_WRITES_FINAL` of one task's writes on it, in one
statement (see :data:`checkpointers._pg_sql.PG_PUT_WITH_WRITES_FINAL_FUNCTION`)."""

_GET = "SELECT * FROM graphexec_get(:thread_id, :checkpoint_ns, :checkpoint_id, :known)"
"""The read of :data:`checkpointers._sql.GET_CHECKPOINT`, planned once per server connection."""

_ACQUIRE_GET = """SELECT * FROM graphexec_acquire_get(:thread_id, :owner, :ttl::float8,
        :checkpoint_id, :known)"""
"""A run's lease and its first read in one round trip (see
:data:`checkpointers._pg_sql.PG_ACQUIRE_GET_FUNCTION`)."""

_ACQUIRE_PUT = """SELECT * FROM graphexec_acquire_put(:owner, :ttl::float8, :known,
        :thread_id, :checkpoint_id, :parent_id, :expected_head, :step::bigint, :source,
        :created_at::bigint, :graph_version, :next_nodes, :frontier::bytea, :metadata::bytea,
        :delta_depth::bigint, :delta_bytes::bigint, :snapshot_bytes::bigint,
        :has_snapshot::bigint, :default_ttl::float8, :checkpoints_table::text, :roles::text[],
        :channels::text[], :ops::text[], :datas::bytea[])"""
"""A run's lease and its first checkpoint in one round trip (see
:data:`checkpointers._pg_sql.PG_ACQUIRE_PUT_FUNCTION`)."""

_ACQUIRE = f"""INSERT INTO graphexec_leases AS x (thread_id, owner, epoch, expires_at)
    VALUES (:thread_id, :owner, 1, {_NOW} + :ttl)
    ON CONFLICT (thread_id) DO UPDATE
    SET owner = excluded.owner, epoch = x.epoch + 1, expires_at = {_NOW} + :ttl
    WHERE x.owner IS NULL OR x.owner = excluded.owner OR x.expires_at <= {_NOW}
    RETURNING x.epoch, x.expires_at"""
"""Takes the lease if it is free, expired or already the owner's, with the next epoch."""

_LEASE_HOLDER = f"""SELECT owner, expires_at > {_NOW} FROM graphexec_leases
    WHERE thread_id = :thread_id"""

_RENEW = f"""UPDATE graphexec_leases SET expires_at = {_NOW} + :ttl
    WHERE thread_id = :thread_id AND epoch = :epoch AND owner IS NOT NULL
    RETURNING owner, expires_at"""

_LOCK_LEASE = "SELECT 1 FROM graphexec_leases WHERE thread_id = :thread_id FOR UPDATE"
_LOCK_HEADS = """SELECT 1 FROM graphexec_heads WHERE thread_id = :thread_id
    ORDER BY checkpoint_ns FOR UPDATE"""
_LOCK_CHECKPOINTS = """SELECT 1 FROM graphexec_checkpoints WHERE thread_id = :thread_id
    ORDER BY cp_seq FOR UPDATE"""
_OP_RESULT = "SELECT result FROM graphexec_op_results WHERE op_id = :op_id"
_RECORD_OP = """INSERT INTO graphexec_op_results (op_id, result, created_at)
    VALUES (:op_id, :result, extract(epoch FROM clock_timestamp()))"""
_FORGET_OLD_OPS = """DELETE FROM graphexec_op_results
    WHERE created_at < extract(epoch FROM clock_timestamp()) - 86400"""
"""A prune records how many checkpoints it deleted in its own transaction: when the COMMIT's
reply is lost and the transaction is retried, the retry finds that record and returns the count
the committed attempt deleted (instead of 0). Records older than a day are dropped."""

_LOCK_DOOMED = """SELECT 1 FROM graphexec_checkpoints WHERE cp_seq = ANY(:seqs::bigint[])
    ORDER BY cp_seq FOR UPDATE"""
"""Locking checkpoints before deleting them makes a ``put_writes`` in flight on one of them
either finish first (and its writes are deleted too) or find it gone (and fail)."""

_SET_TTL = f"""INSERT INTO graphexec_threads AS x (thread_id, ttl, touched_at, expires_at)
    SELECT :thread_id, :ttl::float8, s.touched, s.touched + :ttl::float8
    FROM (SELECT coalesce(
        (SELECT max(c.created_at) FROM graphexec_heads AS h
         JOIN graphexec_checkpoints AS c ON c.cp_seq = h.head_seq
         WHERE h.thread_id = :thread_id)::float8 / 1000000, {_NOW}) AS touched) AS s
    ON CONFLICT (thread_id) DO UPDATE
    SET ttl = excluded.ttl, expires_at = x.touched_at + excluded.ttl"""
"""Idle time counts from the thread's last commit, or from now for a thread without one."""

_EXPIRED = f"""SELECT t.thread_id FROM graphexec_threads AS t
    LEFT JOIN graphexec_leases AS l ON l.thread_id = t.thread_id
    WHERE t.expires_at < {_NOW} AND (l.owner IS NULL OR l.expires_at <= {_NOW})
    ORDER BY t.expires_at
    LIMIT :limit"""
_LOCK_LEASES_OF = """SELECT 1 FROM graphexec_leases WHERE thread_id = ANY(:ids::text[])
    ORDER BY thread_id FOR UPDATE"""
_LOCK_HEADS_OF = """SELECT 1 FROM graphexec_heads WHERE thread_id = ANY(:ids::text[])
    ORDER BY thread_id, checkpoint_ns FOR UPDATE"""
_LOCK_CHECKPOINTS_OF = """SELECT 1 FROM graphexec_checkpoints WHERE thread_id = ANY(:ids::text[])
    ORDER BY cp_seq FOR UPDATE"""
_DELETE_EXPIRED = f"""DELETE FROM graphexec_threads AS t
    WHERE t.thread_id = ANY(:ids::text[]) AND t.expires_at < {_NOW}
      AND NOT EXISTS (SELECT 1 FROM graphexec_leases AS l
          WHERE l.thread_id = t.thread_id AND l.owner IS NOT NULL AND l.expires_at > {_NOW})
    RETURNING t.thread_id"""
"""Re-checks expiry under the locks (a commit or a lease may have come in meanwhile)."""
