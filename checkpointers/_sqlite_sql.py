"""SQL of SQLite's compact checkpoint rows (schema version 23 on; see :data:`~._sql.MIGRATIONS`).

SQLite stores the same tables as PostgreSQL (:mod:`checkpointers._sql`), with these differences
(together a checkpoint row about 40% smaller, and one b-tree less per channel row):

- Ids: ``checkpoint_id`` and ``head_id`` hold a canonical UUID as its 16 bytes, any other id as
  text (:func:`~._rows.id_key`). SQLite's columns are dynamically typed, so the ``TEXT`` columns
  hold either; every statement is given ids already mapped, and ids read back are mapped to text
  (:func:`~._rows.id_text`) before anything else sees them.
- Parents: ``parent_seq`` is the parent's ``cp_seq``, and ``parent_id`` is NULL -- except once
  prune deletes the parent: prune then copies the parent's id into ``parent_id`` and clears
  ``parent_seq`` (:data:`DETACH_PARENT`), so a retained checkpoint still reports its parent.
  Walks along parents (get, list, prune) follow ``parent_seq``: a rowid lookup per step.
- Graph versions: the engine's 16 hex digits are stored as 8 bytes
  (:func:`~._rows.version_key`); rows written before schema 19 keep their text. No statement
  looks a version up, so both forms may stay.
- Channel rows: ``row_key``, the table's ``INTEGER PRIMARY KEY``, is ``cp_seq * SLOTS +
  position``, so a checkpoint's rows are one range of the table's own b-tree (there is no
  ``graphexec_channels_by_checkpoint`` index) and come back in the order they were written.
  Nothing but the writer's own code keeps ``(cp_seq, role, channel)`` unique: one checkpoint's
  rows are written from one mapping per role, and prune's rebase adds ``'s'`` rows only to a
  checkpoint that has none.

The reads return the row layout of :mod:`checkpointers._sql` (its ``'c'``/``'b'``/``'w'``
union), with one more column on ``'c'`` rows: ``parent_seq``, so that a parent deleted behind
the store's back is reported as missing. Statements not here are the shared ones, given mapped
ids (``PUT_CHECK``, ``MOVE_HEAD``, ``WRITES_CHECK``, ``LIST_THREADS``, deletions ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from checkpointers import _rows
from checkpointers import _sql as sql

__all__ = [
    "CHANNEL_MANIFEST",
    "DELETE_CHANNELS_OF",
    "DELETE_THREAD",
    "DETACH_PARENT",
    "FUNCTIONS",
    "GET_CHECKPOINT",
    "INSERT_CHANNEL",
    "INSERT_CHECKPOINT",
    "LIST_CHECKPOINTS",
    "LIST_TIPS",
    "PRUNE_PLAN",
    "REBASE_TARGET",
    "SLOTS",
]


def _id_key(value: Any) -> Any:
    return _rows.id_key(value) if isinstance(value, str) else value


SLOTS = 1 << 20
"""Channel rows a checkpoint can have: ``row_key`` is ``cp_seq * SLOTS + position``."""

_ROWS_OF = "BETWEEN {seq} * 1048576 AND {seq} * 1048576 + 1048575"
"""A checkpoint's ``row_key`` range (1048576 is :data:`SLOTS`)."""

FUNCTIONS: Mapping[str, Callable[[Any], Any]] = {"graphexec_id_key": _id_key}
"""SQL functions the migrations use (registered on every connection of the checkpointer)."""

_PARENT = """coalesce(c.parent_id, (SELECT p.checkpoint_id FROM graphexec_checkpoints AS p
        WHERE p.cp_seq = c.parent_seq))"""
_CP_COLUMNS = f"""c.checkpoint_id, {_PARENT}, c.source, c.graph_version, c.next_nodes,
        c.frontier, c.metadata, c.step, c.created_at, c.delta_depth, c.delta_bytes,
        c.snapshot_bytes, c.has_snapshot"""
_NULL_CP_COLUMNS = "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"
_HEAD_OF_NS = """(SELECT h.head_id FROM graphexec_heads AS h
        WHERE h.thread_id = :thread_id AND h.checkpoint_ns = :checkpoint_ns)"""
_HEAD_SEQ = """(SELECT h.head_seq FROM graphexec_heads AS h
        WHERE h.thread_id = :thread_id AND h.checkpoint_ns = :checkpoint_ns)"""


def _seq_of(param: str) -> str:
    return f"""(SELECT k.cp_seq FROM graphexec_checkpoints AS k
        WHERE k.thread_id = :thread_id AND k.checkpoint_ns = :checkpoint_ns
          AND k.checkpoint_id = :{param})"""


def _checkpoint_rows(cte: str, source: str, *, with_writes: bool) -> str:
    """The union of :mod:`._sql` over the checkpoints named by ``source`` (``seq``, ``pos``)."""
    writes = f"""
    UNION ALL
    SELECT 'w', w.seq, 0, w.task_id, w.channel, NULL, NULL, NULL, w.data, {_NULL_CP_COLUMNS}
    FROM {source} AS s JOIN graphexec_writes AS w ON w.cp_seq = s.seq
    WHERE s.pos = 0"""
    return f"""{cte}
    SELECT 'c', s.seq, s.pos, {_CP_COLUMNS}, {_HEAD_OF_NS}, c.parent_seq
    FROM {source} AS s JOIN graphexec_checkpoints AS c ON c.cp_seq = s.seq
    UNION ALL
    SELECT 'b', s.seq, 0, b.role, b.channel, b.op, NULL, NULL, b.data, {_NULL_CP_COLUMNS}
    FROM {source} AS s JOIN graphexec_channels AS b
      ON b.row_key {_ROWS_OF.format(seq="s.seq")}{writes if with_writes else ""}"""


GET_CHECKPOINT = _checkpoint_rows(
    f"""WITH RECURSIVE chain(seq, checkpoint_id, parent_seq, has_snapshot, pos) AS (
        SELECT c.cp_seq, c.checkpoint_id, c.parent_seq, c.has_snapshot, 0
        FROM graphexec_checkpoints AS c
        WHERE c.cp_seq = (CASE WHEN :checkpoint_id IS NULL THEN {_HEAD_SEQ}
            ELSE {_seq_of("checkpoint_id")} END)
        UNION ALL
        SELECT p.cp_seq, p.checkpoint_id, p.parent_seq, p.has_snapshot, chain.pos + 1
        FROM chain JOIN graphexec_checkpoints AS p ON p.cp_seq = chain.parent_seq
        WHERE chain.has_snapshot = 0
          AND (:known IS NULL
               OR (chain.checkpoint_id IS NOT :known AND p.checkpoint_id IS NOT :known))
    )""",
    "chain",
    with_writes=True,
)
"""``_sql.GET_CHECKPOINT``: a checkpoint, its ancestors back to a snapshot (or to ``:known``
or its child), and its writes."""

LIST_CHECKPOINTS = _checkpoint_rows(
    f"""WITH RECURSIVE walk(seq, parent_seq, pos) AS (
        SELECT c.cp_seq, c.parent_seq, 0
        FROM graphexec_checkpoints AS c
        WHERE c.cp_seq = (CASE WHEN :before IS NULL THEN {_HEAD_SEQ}
            ELSE (SELECT b.parent_seq FROM graphexec_checkpoints AS b
                  WHERE b.thread_id = :thread_id AND b.checkpoint_ns = :checkpoint_ns
                    AND b.checkpoint_id = :before) END)
        UNION ALL
        SELECT p.cp_seq, p.parent_seq, walk.pos + 1
        FROM walk JOIN graphexec_checkpoints AS p ON p.cp_seq = walk.parent_seq
        WHERE walk.pos + 1 < :limit
    )""",
    "walk",
    with_writes=False,
)
"""``_sql.LIST_CHECKPOINTS``: the current branch from the head (or from ``before``'s parent)."""

LIST_TIPS = _checkpoint_rows(
    """WITH tips(seq, pos) AS (
        SELECT c.cp_seq, 1
        FROM graphexec_checkpoints AS c
        WHERE c.thread_id = :thread_id AND c.checkpoint_ns = :checkpoint_ns
          AND c.cp_seq NOT IN (
              SELECT k.parent_seq FROM graphexec_checkpoints AS k
              WHERE k.thread_id = :thread_id AND k.checkpoint_ns = :checkpoint_ns
                AND k.parent_seq IS NOT NULL)
    )""",
    "tips",
    with_writes=False,
)
"""``_sql.LIST_TIPS``: checkpoints without children."""

INSERT_CHECKPOINT = """INSERT INTO graphexec_checkpoints (
        thread_id, checkpoint_ns, checkpoint_id, parent_seq, step, source, created_at,
        graph_version, next_nodes, frontier, metadata, delta_depth, delta_bytes,
        snapshot_bytes, has_snapshot)
    VALUES (:thread_id, :checkpoint_ns, :checkpoint_id, :parent_seq, :step, :source,
        :created_at, :graph_version, :next_nodes, :frontier, :metadata, :delta_depth,
        :delta_bytes, :snapshot_bytes, :has_snapshot)"""
"""The new row's ``cp_seq`` is the cursor's ``lastrowid`` (cheaper than ``RETURNING``)."""

PRUNE_PLAN = """WITH RECURSIVE keep(seq, parent_seq, has_snapshot, n) AS (
        SELECT c.cp_seq, c.parent_seq, c.has_snapshot, 1
        FROM graphexec_heads AS h JOIN graphexec_checkpoints AS c ON c.cp_seq = h.head_seq
        WHERE h.thread_id = :thread_id
        UNION ALL
        SELECT p.cp_seq, p.parent_seq, p.has_snapshot, keep.n + 1
        FROM keep JOIN graphexec_checkpoints AS p ON p.cp_seq = keep.parent_seq
        WHERE keep.n < :keep_last OR keep.has_snapshot = 0
    )
    SELECT c.cp_seq, 0 FROM graphexec_checkpoints AS c
    WHERE c.thread_id = :thread_id AND c.cp_seq NOT IN (SELECT seq FROM keep)
    UNION ALL
    SELECT k.seq, 1 FROM keep AS k
    WHERE k.parent_seq IS NOT NULL AND k.parent_seq NOT IN (SELECT seq FROM keep)"""
"""``_sql.PRUNE_DOOMED`` as ``(cp_seq, 0)`` rows, plus ``(cp_seq, 1)`` for each retained
checkpoint whose parent is among them (to :data:`DETACH_PARENT` first)."""

DETACH_PARENT = """UPDATE graphexec_checkpoints
    SET parent_id = (SELECT p.checkpoint_id FROM graphexec_checkpoints AS p
                     WHERE p.cp_seq = graphexec_checkpoints.parent_seq),
        parent_seq = NULL
    WHERE cp_seq = :cp_seq"""
"""Keeps a checkpoint's parent id in its own row before prune deletes that parent."""

REBASE_TARGET = f"""SELECT c.cp_seq, c.metadata, {_PARENT}, c.step, c.source, c.graph_version,
        c.next_nodes, c.created_at, c.delta_depth, c.delta_bytes, c.snapshot_bytes,
        c.has_snapshot
    FROM graphexec_checkpoints AS c
    WHERE c.thread_id = :thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = :checkpoint_id"""
"""``_sql.REBASE_TARGET`` (the parent column holds a stored id: map it with ``id_text``)."""

INSERT_CHANNEL = """INSERT INTO graphexec_channels (row_key, cp_seq, role, channel, op, data)
    VALUES (:row_key, :cp_seq, :role, :channel, :op, :data)"""

CHANNEL_MANIFEST = f"""SELECT role, channel, op FROM graphexec_channels
    WHERE row_key {_ROWS_OF.format(seq=":cp_seq")}"""
"""``_sql.CHANNEL_MANIFEST``, in row order (so its length is the next free position)."""

DELETE_CHANNELS_OF = f"""DELETE FROM graphexec_channels
    WHERE row_key {_ROWS_OF.format(seq=":cp_seq")}"""

DELETE_THREAD: tuple[str, ...] = (
    f"""DELETE FROM graphexec_channels WHERE row_key IN (
        SELECT b.row_key FROM graphexec_checkpoints AS c
        JOIN graphexec_channels AS b ON b.row_key {_ROWS_OF.format(seq="c.cp_seq")}
        WHERE c.thread_id = :thread_id)""",
    *sql.DELETE_THREAD[1:],
)
"""``_sql.DELETE_THREAD`` with the channel rows found by range."""
