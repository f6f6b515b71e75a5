"""SQL shared by the durable checkpointers: schema migrations and queries.

The backends (``sqlite.py``, ``postgres.py``) only do I/O; everything that decides what is
stored where lives here and, for the row layout of checkpoints, in ``_rows.py``.

Schema (every name is prefixed ``graphexec_`` so the tables can share a file with memory stores):

``graphexec_migrations``
    One row per applied migration; its ``version`` is the index into :data:`MIGRATIONS`.
``graphexec_checkpoints``
    One row per checkpoint. ``cp_seq`` is a surrogate key that is never reused, so the child
    tables reference an integer instead of repeating ``(thread_id, checkpoint_ns,
    checkpoint_id)``. ``frontier`` and ``metadata`` are blobs (encrypted when encryption is on);
    ``next_nodes`` is a JSON array kept readable for listings; ``created_at`` is microseconds
    since the Unix epoch (UTC). SQLite stores these rows more compactly (schema version 19
    on: canonical UUID ids as 16 bytes, the parent as ``parent_seq``, the engine's graph
    version as 8 bytes; see :mod:`checkpointers._sqlite_sql`), and with it the metadata the
    engine records without the ``source`` and ``step`` the row already has
    (:meth:`checkpointers._rows.RowCodec.pack_metadata`).
``graphexec_channels``
    What a checkpoint stores per channel: one row per channel for its deltas (``role='d'``,
    ``op`` ``set`` -- the value -- or ``fold`` -- the msgpack list of updates) and, when the
    checkpoint carries a snapshot, one row per channel of it (``role='s'``, ``op`` ``set``, or
    ``same`` when the snapshot value is byte-identical to the ``set`` delta of the same
    checkpoint, which is then stored once). With encryption on, every blob is bound to its
    row -- thread, namespace, checkpoint, role, channel and op -- and the metadata blob also
    to the row's structural columns and its list of channel rows (see
    :meth:`checkpointers._rows.RowCodec.encode`).
    SQLite (schema version 23 on) keys these rows by ``row_key = cp_seq * 2**20 + position``
    instead of indexing ``(cp_seq, role, channel)``: a checkpoint's rows are one range of the
    table itself, in the order they were written.
``graphexec_heads``
    The head of each ``(thread_id, checkpoint_ns)``; the compare-and-set target of ``put``.
``graphexec_writes``
    Pending writes of the step after a checkpoint, keyed ``(cp_seq, task_id, channel)``;
    ``seq`` keeps insertion order (an upsert keeps the original position).
``graphexec_leases``
    One row per thread ever leased. Releasing sets ``owner`` to NULL but keeps ``epoch``, so
    epochs only ever increase, across processes and thread deletions.
``graphexec_threads``
    Per-thread retention: ``ttl`` seconds after ``touched_at`` (the last commit) the thread
    expires; ``expires_at`` is materialised so the expiry sweep is an index range scan.

Portability: migrations are templates whose few type names differ per :class:`Dialect`; queries
use named parameters (``:name``), which a psycopg backend rewrites to ``%(name)s``. Union queries
keep one type per column position so PostgreSQL accepts them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MIGRATIONS",
    "SQLITE",
    "VERSION_TABLE",
    "Dialect",
    "OnlyOn",
    "migrations",
]


# -- dialects and migrations --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dialect:
    """The few type names that differ between SQL backends.

    Attributes:
        name: ``"sqlite"`` or ``"postgres"``.
        blob: Binary column type.
        bigint: 64-bit integer type.
        double: Floating point type.
        serial_pk: An auto-incrementing integer primary key whose values are never reused.
        without_rowid: Table suffix for small keyed tables (SQLite stores them in the key's
            b-tree, saving an index); empty elsewhere.
        put_function: The server-side commit function (PostgreSQL; see
            :data:`~._pg_sql.PG_PUT_FUNCTION`), or a statement that does nothing.
        op_results: The table where a non-idempotent operation records its result in its own
            transaction, so a retry after a lost COMMIT reply can return it (PostgreSQL), or a
            statement that does nothing where replies cannot be lost.
        get_function: The server-side read of a checkpoint with its chain and pending writes
            (PostgreSQL; see :data:`~._pg_sql.PG_GET_FUNCTION`), or a statement that does nothing.
        acquire_get_function: The server-side lease acquisition plus that read (PostgreSQL; see
            :data:`~._pg_sql.PG_ACQUIRE_GET_FUNCTION`), or a statement that does nothing.
        put_writes_function: The server-side save of pending writes (PostgreSQL; see
            :data:`~._pg_sql.PG_PUT_WRITES_FUNCTION`), or a statement that does nothing.
        acquire_get_function_2: :data:`~._pg_sql.PG_ACQUIRE_GET_FUNCTION_2` (PostgreSQL), or a
            statement that does nothing.
        put_writes_final_function: :data:`~._pg_sql.PG_PUT_WRITES_FINAL_FUNCTION`
            (PostgreSQL), or a statement that does nothing.
        acquire_put_function: :data:`~._pg_sql.PG_ACQUIRE_PUT_FUNCTION` (PostgreSQL), or a
            statement that does nothing.
        put_with_writes_final_function:
            :data:`~._pg_sql.PG_PUT_WITH_WRITES_FINAL_FUNCTION` (PostgreSQL), or a statement
            that does nothing.
    """

    name: str
    blob: str
    bigint: str
    double: str
    serial_pk: str
    without_rowid: str
    put_function: str = "SELECT 1"
    op_results: str = "SELECT 1"
    get_function: str = "SELECT 1"
    acquire_get_function: str = "SELECT 1"
    put_writes_function: str = "SELECT 1"
    acquire_get_function_2: str = "SELECT 1"
    put_writes_final_function: str = "SELECT 1"
    acquire_put_function: str = "SELECT 1"
    put_with_writes_final_function: str = "SELECT 1"


SQLITE = Dialect(
    name="sqlite",
    blob="BLOB",
    bigint="INTEGER",
    double="REAL",
    serial_pk="INTEGER PRIMARY KEY AUTOINCREMENT",
    without_rowid=" WITHOUT ROWID",
)


@dataclass(frozen=True, slots=True)
class OnlyOn:
    """A migration for one dialect; every other dialect records its version and does nothing.

    Attributes:
        dialect: The :attr:`Dialect.name` it applies to.
        statement: The statement, a template like the plain entries of :data:`MIGRATIONS`.
    """

    dialect: str
    statement: str


MIGRATIONS: tuple[str | OnlyOn, ...] = (
    # 0: the version table itself (created before anything is read from it)
    """CREATE TABLE IF NOT EXISTS graphexec_migrations (
        version INTEGER PRIMARY KEY,
        applied_at {double} NOT NULL
    )""",
    # 1
    """CREATE TABLE graphexec_checkpoints (
        cp_seq {serial_pk},
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        checkpoint_id TEXT NOT NULL,
        parent_id TEXT,
        step INTEGER NOT NULL,
        source TEXT NOT NULL,
        created_at {bigint} NOT NULL,
        graph_version TEXT NOT NULL,
        next_nodes TEXT NOT NULL,
        frontier {blob} NOT NULL,
        metadata {blob} NOT NULL,
        delta_depth INTEGER NOT NULL,
        delta_bytes {bigint} NOT NULL,
        snapshot_bytes {bigint} NOT NULL,
        has_snapshot INTEGER NOT NULL
    )""",
    # 2: lookups by id, parent walks (get, list, prune), per-thread scans (delete, tips, count)
    """CREATE UNIQUE INDEX graphexec_checkpoints_by_id
        ON graphexec_checkpoints (thread_id, checkpoint_ns, checkpoint_id)""",
    # 3
    """CREATE TABLE graphexec_channels (
        cp_seq {bigint} NOT NULL,
        role TEXT NOT NULL,
        channel TEXT NOT NULL,
        op TEXT NOT NULL,
        data {blob}
    )""",
    # 4
    """CREATE UNIQUE INDEX graphexec_channels_by_checkpoint
        ON graphexec_channels (cp_seq, role, channel)""",
    # 5
    """CREATE TABLE graphexec_heads (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL,
        head_id TEXT NOT NULL,
        head_seq {bigint} NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns)
    ){without_rowid}""",
    # 6
    """CREATE TABLE graphexec_writes (
        seq {serial_pk},
        cp_seq {bigint} NOT NULL,
        task_id TEXT NOT NULL,
        channel TEXT NOT NULL,
        data {blob} NOT NULL
    )""",
    # 7
    """CREATE UNIQUE INDEX graphexec_writes_by_task
        ON graphexec_writes (cp_seq, task_id, channel)""",
    # 8
    """CREATE TABLE graphexec_leases (
        thread_id TEXT PRIMARY KEY,
        owner TEXT,
        epoch {bigint} NOT NULL,
        expires_at {double} NOT NULL
    ){without_rowid}""",
    # 9
    """CREATE TABLE graphexec_threads (
        thread_id TEXT PRIMARY KEY,
        ttl {double},
        touched_at {double} NOT NULL,
        expires_at {double}
    ){without_rowid}""",
    # 10
    """CREATE INDEX graphexec_threads_by_expiry ON graphexec_threads (expires_at)""",
    # 11: PostgreSQL's commit function (nothing on SQLite)
    "{put_function}",
    # 12: results of non-idempotent operations, for retries after a lost reply (PostgreSQL)
    "{op_results}",
    # 13-15: PostgreSQL's reads, run starts and pending writes as functions (nothing on SQLite)
    "{get_function}",
    "{acquire_get_function}",
    "{put_writes_function}",
    # 16-19: SQLite's compact checkpoint rows (see checkpointers/_sqlite_sql.py): the parent as
    # the integer parent_seq (parent_id keeps an id only once that parent is pruned), and ids
    # that are canonical UUIDs as their 16 bytes (graphexec_id_key: _sqlite_sql.FUNCTIONS)
    OnlyOn("sqlite", "ALTER TABLE graphexec_checkpoints ADD COLUMN parent_seq INTEGER"),
    OnlyOn(
        "sqlite",
        """UPDATE graphexec_checkpoints SET parent_seq = (
            SELECT p.cp_seq FROM graphexec_checkpoints AS p
            WHERE p.thread_id = graphexec_checkpoints.thread_id
              AND p.checkpoint_ns = graphexec_checkpoints.checkpoint_ns
              AND p.checkpoint_id = graphexec_checkpoints.parent_id)
        WHERE parent_id IS NOT NULL""",
    ),
    OnlyOn(
        "sqlite",
        """UPDATE graphexec_checkpoints SET checkpoint_id = graphexec_id_key(checkpoint_id),
            parent_id = CASE WHEN parent_seq IS NULL THEN graphexec_id_key(parent_id) END""",
    ),
    OnlyOn("sqlite", "UPDATE graphexec_heads SET head_id = graphexec_id_key(head_id)"),
    # 20-23: SQLite keys channel rows by row_key = cp_seq * 2**20 + position, so a checkpoint's
    # rows are one range of the table's own b-tree; graphexec_channels_by_checkpoint goes with
    # the old table. Old rows keep the order that index gave them (role, channel). The CHECK
    # also makes a process still running an older graphexec fail its commits loudly (its
    # inserts leave row_key to SQLite) instead of filing rows under another checkpoint.
    OnlyOn(
        "sqlite",
        """CREATE TABLE graphexec_channel_rows (
            row_key INTEGER PRIMARY KEY,
            cp_seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            channel TEXT NOT NULL,
            op TEXT NOT NULL,
            data BLOB,
            CHECK (row_key >> 20 = cp_seq)
        )""",
    ),
    OnlyOn(
        "sqlite",
        """INSERT INTO graphexec_channel_rows (row_key, cp_seq, role, channel, op, data)
        SELECT cp_seq * 1048576 + row_number() OVER (PARTITION BY cp_seq ORDER BY role, channel)
            - 1, cp_seq, role, channel, op, data
        FROM graphexec_channels""",
    ),
    OnlyOn("sqlite", "DROP TABLE graphexec_channels"),
    OnlyOn("sqlite", "ALTER TABLE graphexec_channel_rows RENAME TO graphexec_channels"),
    # 24-25: PostgreSQL: run starts skip the read of a new thread; a run's pause as a function
    "{acquire_get_function_2}",
    "{put_writes_final_function}",
    # 26: PostgreSQL: a run on a new thread takes its lease and commits its input at once
    "{acquire_put_function}",
    # 27: PostgreSQL: a pausing run's held-back checkpoint, interruption and release at once
    "{put_with_writes_final_function}",
)
"""Schema migrations in order; a database at version ``v`` has applied ``MIGRATIONS[:v + 1]``.

Append only: never edit or reorder a released entry. Each entry is a single statement, so a
backend can run the pending ones inside one transaction with its plain ``execute``. An
:class:`OnlyOn` entry changes one dialect's schema only; the others record its version and run
nothing (``SELECT 1``).
"""


def migrations(dialect: Dialect) -> list[str]:
    """:data:`MIGRATIONS` with ``dialect``'s type names filled in."""
    names = {
        "blob": dialect.blob,
        "bigint": dialect.bigint,
        "double": dialect.double,
        "serial_pk": dialect.serial_pk,
        "without_rowid": dialect.without_rowid,
        "put_function": dialect.put_function,
        "op_results": dialect.op_results,
        "get_function": dialect.get_function,
        "acquire_get_function": dialect.acquire_get_function,
        "put_writes_function": dialect.put_writes_function,
        "acquire_get_function_2": dialect.acquire_get_function_2,
        "put_writes_final_function": dialect.put_writes_final_function,
        "acquire_put_function": dialect.acquire_put_function,
        "put_with_writes_final_function": dialect.put_with_writes_final_function,
    }
    return [
        m.format(**names)
        if isinstance(m, str)
        else m.statement.format(**names)
        if m.dialect == dialect.name
        else "SELECT 1"
        for m in MIGRATIONS
    ]


VERSION_TABLE = "graphexec_migrations"
"""Created by ``MIGRATIONS[0]``; one ``(version, applied_at)`` row per applied migration."""

# -- queries -------------------------------------------------------------------------------------
#
# Reads that return checkpoints are single statements: the checkpoint rows ('c'), their channel
# rows ('b') and, for get, the pending writes ('w'), as one UNION ALL with a fixed column layout
# (see _ROW). One statement is one consistent snapshot and one round trip.
#
#   kind  seq     pos    t1             t2         t3      t4             t5          b1
#   'c'   cp_seq  order  checkpoint_id  parent_id  source  graph_version  next_nodes  frontier
#   'b'   cp_seq  0      role           channel    op      NULL           NULL        data
#   'w'   seq     0      task_id        channel    NULL    NULL           NULL        data
#
#   b2        i1    i2          i3           i4           i5              i6            t6
#   metadata  step  created_at  delta_depth  delta_bytes  snapshot_bytes  has_snapshot  head_id
#   NULL ...

_CP_COLUMNS = """c.checkpoint_id, c.parent_id, c.source, c.graph_version, c.next_nodes,
        c.frontier, c.metadata, c.step, c.created_at, c.delta_depth, c.delta_bytes,
        c.snapshot_bytes, c.has_snapshot"""
_NULL_CP_COLUMNS = "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
_HEAD_OF_NS = """(SELECT h.head_id FROM graphexec_heads AS h
        WHERE h.thread_id = :thread_id AND h.checkpoint_ns = :checkpoint_ns)"""


def _checkpoint_rows(cte: str, source: str, *, with_writes: bool) -> str:
    """A UNION ALL over the checkpoints named by ``source`` (a CTE with ``seq`` and ``pos``)."""
    writes = f"""
    UNION ALL
    SELECT 'w', w.seq, 0, w.task_id, w.channel, NULL, NULL, NULL, w.data, {_NULL_CP_COLUMNS}
    FROM {source} AS s JOIN graphexec_writes AS w ON w.cp_seq = s.seq
    WHERE s.pos = 0"""
    return f"""{cte}
    SELECT 'c', s.seq, s.pos, {_CP_COLUMNS}, {_HEAD_OF_NS}
    FROM {source} AS s JOIN graphexec_checkpoints AS c ON c.cp_seq = s.seq
    UNION ALL
    SELECT 'b', s.seq, 0, b.role, b.channel, b.op, NULL, NULL, b.data, {_NULL_CP_COLUMNS}
    FROM {source} AS s JOIN graphexec_channels AS b ON b.cp_seq = s.seq{
        writes if with_writes else ""
    }"""


GET_CHECKPOINT = _checkpoint_rows(
    f"""WITH RECURSIVE chain(seq, checkpoint_id, parent_id, has_snapshot, pos) AS (
        SELECT c.cp_seq, c.checkpoint_id, c.parent_id, c.has_snapshot, 0
        FROM graphexec_checkpoints AS c
        WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
          AND c.checkpoint_id = coalesce(:checkpoint_id, {_HEAD_OF_NS})
        UNION ALL
        SELECT p.cp_seq, p.checkpoint_id, p.parent_id, p.has_snapshot, chain.pos + 1
        FROM chain JOIN graphexec_checkpoints AS p
          ON p.thread_id = :thread_id AND p.checkpoint_ns = :checkpoint_ns
         AND p.checkpoint_id = chain.parent_id
        WHERE chain.has_snapshot = 0
          AND (:known IS NULL OR (chain.checkpoint_id <> :known AND chain.parent_id <> :known))
    )""",
    "chain",
    with_writes=True,
)
"""A checkpoint (``pos`` 0), its ancestors back to the nearest snapshot, and its writes.

With ``:known`` (see :meth:`~graphexec.BaseCheckpointer.get_since`) the walk also stops at
``:known`` or its child, whichever it reaches first."""

LIST_CHECKPOINTS = _checkpoint_rows(
    f"""WITH RECURSIVE walk(seq, parent_id, pos) AS (
        SELECT c.cp_seq, c.parent_id, 0
        FROM graphexec_checkpoints AS c
        WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
          AND c.checkpoint_id = (CASE WHEN :before IS NULL THEN {_HEAD_OF_NS}
              ELSE (SELECT b.parent_id FROM graphexec_checkpoints AS b
                    WHERE b.thread_id = :thread_id AND b.checkpoint_ns = :checkpoint_ns
                      AND b.checkpoint_id = :before) END)
        UNION ALL
        SELECT p.cp_seq, p.parent_id, walk.pos + 1
        FROM walk JOIN graphexec_checkpoints AS p
          ON p.thread_id = :thread_id AND p.checkpoint_ns = :checkpoint_ns
         AND p.checkpoint_id = walk.parent_id
        WHERE walk.pos + 1 < :limit
    )""",
    "walk",
    with_writes=False,
)
"""The current branch from the head (or from ``before``'s parent), newest first by ``pos``."""

LIST_TIPS = _checkpoint_rows(
    """WITH tips(seq, pos) AS (
        SELECT c.cp_seq, 1
        FROM graphexec_checkpoints AS c
        WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
          AND c.checkpoint_id NOT IN (
              SELECT k.parent_id FROM graphexec_checkpoints AS k
              WHERE k.thread_id = :thread_id AND k.checkpoint_ns = :checkpoint_ns
                AND k.parent_id IS NOT NULL)
    )""",
    "tips",
    with_writes=False,
)
"""Checkpoints without children (``NOT IN`` builds one temporary index: O(n log n))."""

LIST_THREADS = """SELECT h.thread_id, h.head_id, c.step, c.created_at, c.next_nodes,
        (SELECT count(*) FROM graphexec_checkpoints AS k
         WHERE k.thread_id = h.thread_id AND k.checkpoint_ns = '')
    FROM graphexec_heads AS h JOIN graphexec_checkpoints AS c ON c.cp_seq = h.head_seq
    WHERE h.checkpoint_ns = ''
    ORDER BY c.created_at DESC, h.thread_id DESC"""

HEAD_ID = """SELECT head_id FROM graphexec_heads
    WHERE thread_id = :thread_id AND checkpoint_ns = :checkpoint_ns"""

PUT_CHECK = f"""SELECT {_HEAD_OF_NS}, l.owner, l.epoch, l.expires_at,
        (SELECT c.cp_seq FROM graphexec_checkpoints AS c
         WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
           AND c.checkpoint_id = :checkpoint_id),
        p.cp_seq,
        (SELECT count(*) FROM graphexec_writes AS w WHERE w.cp_seq = p.cp_seq),
        t.thread_id, t.ttl
    FROM (SELECT :thread_id AS thread_id) AS k
    LEFT JOIN graphexec_leases AS l ON l.thread_id = k.thread_id
    LEFT JOIN graphexec_threads AS t ON t.thread_id = k.thread_id
    LEFT JOIN graphexec_checkpoints AS p
      ON p.thread_id = :thread_id AND p.checkpoint_ns = :checkpoint_ns
     AND p.checkpoint_id = :parent_id"""
"""Everything ``put`` checks, in one read: head, lease, duplicate id, parent, thread TTL."""

INSERT_CHANNEL = """INSERT INTO graphexec_channels (cp_seq, role, channel, op, data)
    VALUES (:cp_seq, :role, :channel, :op, :data)"""

MOVE_HEAD = """INSERT INTO graphexec_heads (thread_id, checkpoint_ns, head_id, head_seq)
    VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :cp_seq)
    ON CONFLICT (thread_id, checkpoint_ns)
    DO UPDATE SET head_id = excluded.head_id, head_seq = excluded.head_seq"""

DELETE_WRITES_OF = "DELETE FROM graphexec_writes WHERE cp_seq = :cp_seq"

WRITES_CHECK = """SELECT l.owner, l.epoch, l.expires_at,
        (SELECT c.cp_seq FROM graphexec_checkpoints AS c
         WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
           AND c.checkpoint_id = :checkpoint_id)
    FROM (SELECT :thread_id AS thread_id) AS k
    LEFT JOIN graphexec_leases AS l ON l.thread_id = k.thread_id"""

UPSERT_WRITE = """INSERT INTO graphexec_writes (cp_seq, task_id, channel, data)
    VALUES (:cp_seq, :task_id, :channel, :data)
    ON CONFLICT (cp_seq, task_id, channel) DO UPDATE SET data = excluded.data"""

# -- leases

GET_LEASE = "SELECT owner, epoch, expires_at FROM graphexec_leases WHERE thread_id = :thread_id"
SET_LEASE = """INSERT INTO graphexec_leases (thread_id, owner, epoch, expires_at)
    VALUES (:thread_id, :owner, :epoch, :expires_at)
    ON CONFLICT (thread_id) DO UPDATE
    SET owner = excluded.owner, epoch = excluded.epoch, expires_at = excluded.expires_at"""
RENEW_LEASE = """UPDATE graphexec_leases SET expires_at = :expires_at
    WHERE thread_id = :thread_id AND epoch = :epoch AND owner IS NOT NULL
    RETURNING owner"""
RELEASE_LEASE = """UPDATE graphexec_leases SET owner = NULL, expires_at = 0
    WHERE thread_id = :thread_id AND epoch = :epoch"""

# -- retention

PRUNE_DOOMED = """WITH RECURSIVE keep(seq, ns, parent_id, has_snapshot, n) AS (
        SELECT c.cp_seq, c.checkpoint_ns, c.parent_id, c.has_snapshot, 1
        FROM graphexec_heads AS h JOIN graphexec_checkpoints AS c ON c.cp_seq = h.head_seq
        WHERE h.thread_id = :thread_id
        UNION ALL
        SELECT p.cp_seq, p.checkpoint_ns, p.parent_id, p.has_snapshot, keep.n + 1
        FROM keep JOIN graphexec_checkpoints AS p
          ON p.thread_id = :thread_id AND p.checkpoint_ns = keep.ns
         AND p.checkpoint_id = keep.parent_id
        WHERE keep.n < :keep_last OR keep.has_snapshot = 0
    )
    SELECT c.cp_seq FROM graphexec_checkpoints AS c
    WHERE c.thread_id = :thread_id AND c.cp_seq NOT IN (SELECT seq FROM keep)"""
"""Checkpoints ``prune`` deletes: all but the last ``keep_last`` of each namespace's current
branch and what those need back to a snapshot (the walk goes on past ``keep_last`` only while
the checkpoint it stands on has no snapshot)."""

REBASE_TARGET = """SELECT cp_seq, metadata, parent_id, step, source, graph_version, next_nodes,
        created_at, delta_depth, delta_bytes, snapshot_bytes, has_snapshot
    FROM graphexec_checkpoints
    WHERE thread_id = :thread_id AND checkpoint_ns = '' AND checkpoint_id = :checkpoint_id"""
"""The checkpoint prune's rebase gives a snapshot: its metadata and structure (STRUCTURE order)."""
CHANNEL_MANIFEST = "SELECT role, channel, op FROM graphexec_channels WHERE cp_seq = :cp_seq"
REBASE = """UPDATE graphexec_checkpoints
    SET has_snapshot = 1, delta_depth = 0, delta_bytes = 0, snapshot_bytes = :snapshot_bytes,
        metadata = :metadata
    WHERE cp_seq = :cp_seq"""
DELETE_CHANNELS_OF = "DELETE FROM graphexec_channels WHERE cp_seq = :cp_seq"
DELETE_CHECKPOINT = "DELETE FROM graphexec_checkpoints WHERE cp_seq = :cp_seq"

DELETE_THREAD: tuple[str, ...] = (
    """DELETE FROM graphexec_channels WHERE cp_seq IN
        (SELECT cp_seq FROM graphexec_checkpoints WHERE thread_id = :thread_id)""",
    """DELETE FROM graphexec_writes WHERE cp_seq IN
        (SELECT cp_seq FROM graphexec_checkpoints WHERE thread_id = :thread_id)""",
    "DELETE FROM graphexec_checkpoints WHERE thread_id = :thread_id",
    "DELETE FROM graphexec_heads WHERE thread_id = :thread_id",
    "DELETE FROM graphexec_threads WHERE thread_id = :thread_id",
    # the lease row stays (released) so the thread's epochs keep increasing
    "UPDATE graphexec_leases SET owner = NULL, expires_at = 0 WHERE thread_id = :thread_id",
)
"""Everything of one thread, every namespace."""

TOUCH_THREAD = """UPDATE graphexec_threads
    SET touched_at = :now, expires_at = :now + ttl WHERE thread_id = :thread_id"""
NEW_THREAD_TTL = """INSERT INTO graphexec_threads (thread_id, ttl, touched_at, expires_at)
    VALUES (:thread_id, :ttl, :now, :now + :ttl)"""
LAST_COMMIT = """SELECT max(c.created_at) FROM graphexec_heads AS h
    JOIN graphexec_checkpoints AS c ON c.cp_seq = h.head_seq WHERE h.thread_id = :thread_id"""
SET_TTL = """INSERT INTO graphexec_threads (thread_id, ttl, touched_at, expires_at)
    VALUES (:thread_id, :ttl, :touched_at, :touched_at + :ttl)
    ON CONFLICT (thread_id) DO UPDATE
    SET ttl = excluded.ttl, expires_at = graphexec_threads.touched_at + excluded.ttl"""
EXPIRED_THREADS = """SELECT t.thread_id FROM graphexec_threads AS t
    LEFT JOIN graphexec_leases AS l ON l.thread_id = t.thread_id
    WHERE t.expires_at < :now AND (l.owner IS NULL OR l.expires_at <= :now)
    ORDER BY t.expires_at
    LIMIT :limit"""
"""Threads past their TTL that no run currently owns (a live lease postpones expiry)."""
