"""PostgreSQL's server-side functions and its :class:`~checkpointers._sql.Dialect`.

Reads, run starts, commits and pending writes run as PL/pgSQL functions, so their plans are
kept per server connection without client-side prepared statements (PgBouncer's transaction
mode works). They are installed by the migrations in :data:`checkpointers._sql.MIGRATIONS`
through the dialect's names; a changed function ships as ``CREATE OR REPLACE`` in a new
migration, never as an edit of a released one.
"""

from __future__ import annotations

from checkpointers._sql import Dialect

__all__ = [
    "PG_ACQUIRE_GET_FUNCTION",
    "PG_ACQUIRE_GET_FUNCTION_2",
    "PG_ACQUIRE_PUT_FUNCTION",
    "PG_GET_FUNCTION",
    "PG_PUT_FUNCTION",
    "PG_PUT_WRITES_FINAL_FUNCTION",
    "PG_PUT_WITH_WRITES_FINAL_FUNCTION",
    "PG_PUT_WRITES_FUNCTION",
    "POSTGRES",
]

PG_PUT_FUNCTION = """CREATE FUNCTION graphexec_put(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent_id text,
        p_expected_head text, p_epoch bigint, p_step bigint, p_source text, p_created_at bigint,
        p_graph_version text, p_next_nodes text, p_frontier bytea, p_metadata bytea,
        p_delta_depth bigint, p_delta_bytes bigint, p_snapshot_bytes bigint,
        p_has_snapshot bigint, p_default_ttl float8, p_checkpoints_table text, p_release boolean,
        p_roles text[], p_channels text[], p_ops text[], p_datas bytea[])
    RETURNS TABLE (o_verdict text, o_owner text, o_head text, o_dup boolean, o_written bigint)
    LANGUAGE plpgsql AS $put$
    DECLARE
        v_now float8 := extract(epoch FROM clock_timestamp())::float8;
        v_epoch bigint;
        v_expires float8;
        v_parent bigint;
        v_has_thread boolean;
        v_seq bigint;
    BEGIN
        o_written := 0;
        SELECT l.owner, l.epoch, l.expires_at INTO o_owner, v_epoch, v_expires
            FROM graphexec_leases AS l WHERE l.thread_id = p_thread_id FOR UPDATE;
        SELECT h.head_id INTO o_head FROM graphexec_heads AS h
            WHERE h.thread_id = p_thread_id AND h.checkpoint_ns = p_checkpoint_ns FOR UPDATE;
        SELECT c.cp_seq INTO v_parent FROM graphexec_checkpoints AS c
            WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
              AND c.checkpoint_id = p_parent_id FOR KEY SHARE;
        o_dup := EXISTS (SELECT 1 FROM graphexec_checkpoints AS d
            WHERE d.thread_id = p_thread_id AND d.checkpoint_ns = p_checkpoint_ns
              AND d.checkpoint_id = p_checkpoint_id);
        v_has_thread := EXISTS (SELECT 1 FROM graphexec_threads AS t
            WHERE t.thread_id = p_thread_id);
        o_verdict := CASE
            WHEN p_epoch IS NOT NULL AND (o_owner IS NULL OR v_epoch <> p_epoch)
                THEN 'lease_lost'
            WHEN p_epoch IS NULL AND o_owner IS NOT NULL AND v_expires > v_now THEN 'busy'
            WHEN o_head IS DISTINCT FROM p_expected_head THEN 'conflict'
            WHEN o_dup THEN 'duplicate'
            WHEN p_parent_id IS NOT NULL AND v_parent IS NULL THEN 'no_parent'
        END;
        IF o_verdict IS NOT NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
        INSERT INTO graphexec_heads AS x (thread_id, checkpoint_ns, head_id, head_seq)
            VALUES (p_thread_id, p_checkpoint_ns, p_checkpoint_id,
                nextval(pg_get_serial_sequence(p_checkpoints_table, 'cp_seq')))
            ON CONFLICT (thread_id, checkpoint_ns) DO UPDATE
            SET head_id = excluded.head_id, head_seq = excluded.head_seq
            WHERE x.head_id = p_expected_head
            RETURNING x.head_seq INTO v_seq;
        IF v_seq IS NULL THEN
            RETURN NEXT;
            RETURN;
        END IF;
        INSERT INTO graphexec_checkpoints (
                cp_seq, thread_id, checkpoint_ns, checkpoint_id, parent_id, step, source,
                created_at, graph_version, next_nodes, frontier, metadata, delta_depth,
                delta_bytes, snapshot_bytes, has_snapshot)
            OVERRIDING SYSTEM VALUE
            VALUES (v_seq, p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id, p_step,
                p_source, p_created_at, p_graph_version, p_next_nodes, p_frontier, p_metadata,
                p_delta_depth, p_delta_bytes, p_snapshot_bytes, p_has_snapshot);
        INSERT INTO graphexec_channels (cp_seq, role, channel, op, data)
            SELECT v_seq, r.role, r.channel, r.op, r.data
            FROM unnest(p_roles, p_channels, p_ops, p_datas) AS r(role, channel, op, data);
        IF v_parent IS NOT NULL THEN
            DELETE FROM graphexec_writes AS w WHERE w.cp_seq = v_parent;
        END IF;
        IF v_has_thread THEN
            UPDATE graphexec_threads AS t SET touched_at = v_now, expires_at = v_now + t.ttl
                WHERE t.thread_id = p_thread_id AND t.ttl IS NOT NULL;
        ELSIF p_default_ttl IS NOT NULL THEN
            INSERT INTO graphexec_threads (thread_id, ttl, touched_at, expires_at)
                VALUES (p_thread_id, p_default_ttl, v_now, v_now + p_default_ttl)
                ON CONFLICT (thread_id) DO NOTHING;
        END IF;
        IF p_release THEN
            UPDATE graphexec_leases AS l SET owner = NULL, expires_at = 0
                WHERE l.thread_id = p_thread_id AND l.epoch = p_epoch;
        END IF;
        o_written := 1;
        RETURN NEXT;
    END
    $put$"""
"""PostgreSQL's commit, as one server-side function: the checks of ``put`` under row locks
(lease row ``FOR UPDATE``, then the head row ``FOR UPDATE``, then the parent ``FOR KEY SHARE``),
then the head compare-and-set, the checkpoint and channel rows, the removal of the parent's
pending writes and the thread's TTL. Returns ``(verdict, lease owner, head, dup, written)``:
``verdict`` is NULL when every check passed, and ``written`` is then 1, or 0 when another
writer created the same new thread or namespace first.

A PL/pgSQL function keeps its statements' plans for the life of the server connection, so a
commit is parsed and planned once per connection without client-side prepared statements:
it works through transaction-mode poolers. (The backend qualifies its table names with the store's
schema, if it has one, and passes the checkpoints table's name for its sequence.)"""

_PG_ROW_COLUMNS = """o_kind text, o_seq bigint, o_pos integer, o_t1 text, o_t2 text, o_t3 text,
        o_t4 text, o_t5 text, o_b1 bytea, o_b2 bytea, o_i1 integer, o_i2 bigint, o_i3 integer,
        o_i4 bigint, o_i5 bigint, o_i6 integer, o_t6 text"""
"""The row layout of :data:`GET_CHECKPOINT` (see the table above it), as PL/pgSQL result
columns (``o_`` names, so they never shadow a table column inside the function bodies)."""

PG_GET_FUNCTION = f"""CREATE FUNCTION graphexec_get(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_known text)
    RETURNS TABLE ({_PG_ROW_COLUMNS})
    LANGUAGE plpgsql STABLE AS $get$
    BEGIN
        RETURN QUERY WITH RECURSIVE chain(seq, checkpoint_id, parent_id, has_snapshot, pos) AS (
            SELECT c.cp_seq, c.checkpoint_id, c.parent_id, c.has_snapshot, 0
            FROM graphexec_checkpoints AS c
            WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
              AND c.checkpoint_id = coalesce(p_checkpoint_id, (SELECT h.head_id
                  FROM graphexec_heads AS h
                  WHERE h.thread_id = p_thread_id AND h.checkpoint_ns = p_checkpoint_ns))
            UNION ALL
            SELECT p.cp_seq, p.checkpoint_id, p.parent_id, p.has_snapshot, chain.pos + 1
            FROM chain JOIN graphexec_checkpoints AS p
              ON p.thread_id = p_thread_id AND p.checkpoint_ns = p_checkpoint_ns
             AND p.checkpoint_id = chain.parent_id
            WHERE chain.has_snapshot = 0
              AND (p_known IS NULL
                   OR (chain.checkpoint_id <> p_known AND chain.parent_id <> p_known))
        )
        SELECT 'c'::text, s.seq, s.pos, c.checkpoint_id, c.parent_id, c.source, c.graph_version,
            c.next_nodes, c.frontier, c.metadata, c.step, c.created_at, c.delta_depth,
            c.delta_bytes, c.snapshot_bytes, c.has_snapshot,
            (SELECT h.head_id FROM graphexec_heads AS h
             WHERE h.thread_id = p_thread_id AND h.checkpoint_ns = p_checkpoint_ns)
        FROM chain AS s JOIN graphexec_checkpoints AS c ON c.cp_seq = s.seq
        UNION ALL
        SELECT 'b', s.seq, 0, b.role, b.channel, b.op, NULL, NULL, b.data, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL, NULL
        FROM chain AS s JOIN graphexec_channels AS b ON b.cp_seq = s.seq
        UNION ALL
        SELECT 'w', w.seq, 0, w.task_id, w.channel, NULL, NULL, NULL, w.data, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL, NULL
        FROM chain AS s JOIN graphexec_writes AS w ON w.cp_seq = s.seq
        WHERE s.pos = 0;
    END
    $get$"""
""":data:`GET_CHECKPOINT` as a server-side function: the same rows, but parsed and planned
once per server connection (PL/pgSQL keeps its statements' plans), not on every read, without
client-side prepared statements -- so it works through transaction-mode poolers too. Planning
that recursive union costs more than running it on a short chain."""

PG_ACQUIRE_GET_FUNCTION = f"""CREATE FUNCTION graphexec_acquire_get(
        p_thread_id text, p_owner text, p_ttl float8, p_checkpoint_id text, p_known text)
    RETURNS TABLE ({_PG_ROW_COLUMNS}, o_f1 float8)
    LANGUAGE plpgsql AS $acquire$
    DECLARE
        v_now float8;
        v_epoch bigint;
        v_expires float8;
        v_holder text;
        v_live boolean;
    BEGIN
        FOR i IN 1..5 LOOP
            v_now := extract(epoch FROM clock_timestamp())::float8;
            v_epoch := NULL;
            INSERT INTO graphexec_leases AS x (thread_id, owner, epoch, expires_at)
                VALUES (p_thread_id, p_owner, 1, v_now + p_ttl)
                ON CONFLICT (thread_id) DO UPDATE
                SET owner = excluded.owner, epoch = x.epoch + 1, expires_at = v_now + p_ttl
                WHERE x.owner IS NULL OR x.owner = excluded.owner OR x.expires_at <= v_now
                RETURNING x.epoch, x.expires_at INTO v_epoch, v_expires;
            IF v_epoch IS NOT NULL THEN
                RETURN QUERY SELECT 'lease'::text, v_epoch, 0, NULL::text, NULL::text,
                    NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::bytea, NULL::integer,
                    NULL::bigint, NULL::integer, NULL::bigint, NULL::bigint, NULL::integer,
                    NULL::text, v_expires;
                RETURN QUERY SELECT g.*, NULL::float8
                    FROM graphexec_get(p_thread_id, '', p_checkpoint_id, p_known) AS g;
                RETURN;
            END IF;
            SELECT l.owner, l.expires_at > extract(epoch FROM clock_timestamp())::float8
                INTO v_holder, v_live
                FROM graphexec_leases AS l WHERE l.thread_id = p_thread_id;
            IF v_holder IS NOT NULL AND v_live THEN
                RETURN QUERY SELECT 'busy'::text, NULL::bigint, 0, v_holder, NULL::text,
                    NULL::text, NULL::text, NULL::text, NULL::bytea, NULL::bytea, NULL::integer,
                    NULL::bigint, NULL::integer, NULL::bigint, NULL::bigint, NULL::integer,
                    NULL::text, NULL::float8;
                RETURN;
            END IF;
        END LOOP;
    END
    $acquire$"""
"""A run's start in one round trip: takes the thread's lease (free, expired or already this
owner's, with the next epoch -- the statement of ``acquire_lease``) and, only if it got it, reads
the root namespace like :data:`PG_GET_FUNCTION`. Returns a ``('lease', epoch, ..., expires_at)``
row followed by the read's rows; or one ``('busy', NULL, 0, owner, ...)`` row when another
owner holds a live lease; or nothing when the lease changed hands five times meanwhile. One
transaction: if the read fails, no lease was taken."""

PG_PUT_WRITES_FUNCTION = """CREATE FUNCTION graphexec_put_writes(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_epoch bigint,
        p_task_ids text[], p_channels text[], p_datas bytea[])
    RETURNS TABLE (o_verdict text, o_owner text)
    LANGUAGE plpgsql AS $writes$
    DECLARE
        v_epoch bigint;
        v_expires float8;
        v_seq bigint;
    BEGIN
        SELECT l.owner, l.epoch, l.expires_at INTO o_owner, v_epoch, v_expires
            FROM graphexec_leases AS l WHERE l.thread_id = p_thread_id FOR SHARE;
        SELECT c.cp_seq INTO v_seq FROM graphexec_checkpoints AS c
            WHERE c.thread_id = p_thread_id AND c.checkpoint_ns = p_checkpoint_ns
              AND c.checkpoint_id = p_checkpoint_id FOR KEY SHARE;
        o_verdict := CASE
            WHEN p_epoch IS NOT NULL AND (o_owner IS NULL OR v_epoch <> p_epoch)
                THEN 'lease_lost'
            WHEN p_epoch IS NULL AND o_owner IS NOT NULL
                 AND v_expires > extract(epoch FROM clock_timestamp())::float8 THEN 'busy'
            WHEN v_seq IS NULL THEN 'no_checkpoint'
        END;
        IF o_verdict IS NULL THEN
            INSERT INTO graphexec_writes (cp_seq, task_id, channel, data)
                SELECT v_seq, r.task_id, r.channel, r.data
                FROM unnest(p_task_ids, p_channels, p_datas) WITH ORDINALITY
                    AS r(task_id, channel, data, n)
                ORDER BY r.n
                ON CONFLICT (cp_seq, task_id, channel) DO UPDATE SET data = excluded.data;
        END IF;
        RETURN NEXT;
    END
    $writes$"""
"""Saves pending writes of one or more tasks of the step after one checkpoint, in one
transaction: the lease row ``FOR SHARE`` (so a takeover waits for it, and a fenced-out writer
is refused), the checkpoint ``FOR KEY SHARE`` (so a prune cannot delete it meanwhile), then the
upsert, in array order. Returns ``(verdict, lease owner)``: ``verdict`` is NULL when the writes
were saved, else ``lease_lost``, ``busy`` or ``no_checkpoint`` (and nothing was written). A
``(task, channel)`` may appear only once per call."""


def _replace_once(text: str, old: str, new: str) -> str:
    """``text`` with its one occurrence of ``old`` replaced (a changed line must exist, once)."""
    if text.count(old) != 1:
        raise ValueError(f"expected exactly one occurrence of {old!r}")
    return text.replace(old, new)


# The function of migration 14 with one change: its text stays as released, so derive this one.
PG_ACQUIRE_GET_FUNCTION_2 = _replace_once(
    _replace_once(
        PG_ACQUIRE_GET_FUNCTION,
        "CREATE FUNCTION graphexec_acquire_get(",
        "CREATE OR REPLACE FUNCTION graphexec_acquire_get(",
    ),
    """                RETURN QUERY SELECT g.*, NULL::float8
                    FROM graphexec_get(p_thread_id, '', p_checkpoint_id, p_known) AS g;
""",
    """                IF p_checkpoint_id IS NOT NULL OR EXISTS (SELECT 1 FROM graphexec_heads AS h
                        WHERE h.thread_id = p_thread_id AND h.checkpoint_ns = '') THEN
                    RETURN QUERY SELECT g.*, NULL::float8
                        FROM graphexec_get(p_thread_id, '', p_checkpoint_id, p_known) AS g;
                END IF;
""",
)
""":data:`PG_ACQUIRE_GET_FUNCTION`, but a thread without a head (a new thread: the start of most
runs) is not read: an index probe of its head row instead of the read's recursive union, whose
executor start-up alone costs more (about 0.09 ms of server time per run start, measured)."""

PG_PUT_WRITES_FINAL_FUNCTION = """CREATE FUNCTION graphexec_put_writes_final(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_epoch bigint,
        p_task_ids text[], p_channels text[], p_datas bytea[])
    RETURNS TABLE (o_verdict text, o_owner text)
    LANGUAGE plpgsql AS $final$
    BEGIN
        SELECT w.o_verdict, w.o_owner INTO o_verdict, o_owner
            FROM graphexec_put_writes(p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_epoch,
                p_task_ids, p_channels, p_datas) AS w;
        IF o_verdict IS NULL THEN
            UPDATE graphexec_leases AS l SET owner = NULL, expires_at = 0
                WHERE l.thread_id = p_thread_id AND l.epoch = p_epoch;
        END IF;
        RETURN NEXT;
    END
    $final$"""
"""A run's pause: :data:`PG_PUT_WRITES_FUNCTION`, then (only if the writes were saved) the
lease's release, in one transaction; returns ``(verdict, lease owner)`` like it. (The writes
hold the lease row ``FOR SHARE``; the release then takes it ``FOR UPDATE``, so it waits for any
other transaction holding it shared to finish.) A function rather than a statement so that it
is planned once per server connection, like the others."""

PG_ACQUIRE_PUT_FUNCTION = f"""CREATE FUNCTION graphexec_acquire_put(
        p_owner text, p_ttl float8, p_known text, p_thread_id text, p_checkpoint_id text,
        p_parent_id text, p_expected_head text, p_step bigint, p_source text,
        p_created_at bigint, p_graph_version text, p_next_nodes text, p_frontier bytea,
        p_metadata bytea, p_delta_depth bigint, p_delta_bytes bigint, p_snapshot_bytes bigint,
        p_has_snapshot bigint, p_default_ttl float8, p_checkpoints_table text, p_roles text[],
        p_channels text[], p_ops text[], p_datas bytea[])
    RETURNS TABLE ({_PG_ROW_COLUMNS}, o_f1 float8)
    LANGUAGE plpgsql AS $start$
    DECLARE
        v_epoch bigint;
        v_head text;
        v_verdict text;
        v_written bigint;
    BEGIN
        RETURN QUERY SELECT * FROM graphexec_acquire_get(p_thread_id, p_owner, p_ttl, NULL,
            p_known);
        SELECT l.epoch INTO v_epoch FROM graphexec_leases AS l
            WHERE l.thread_id = p_thread_id AND l.owner = p_owner;
        IF v_epoch IS NULL THEN
            RETURN;
        END IF;
        SELECT h.head_id INTO v_head FROM graphexec_heads AS h
            WHERE h.thread_id = p_thread_id AND h.checkpoint_ns = '';
        IF v_head IS DISTINCT FROM p_expected_head THEN
            RETURN;
        END IF;
        SELECT w.o_verdict, w.o_written INTO v_verdict, v_written
            FROM graphexec_put(p_thread_id, '', p_checkpoint_id, p_parent_id, p_expected_head,
                v_epoch, p_step, p_source, p_created_at, p_graph_version, p_next_nodes,
                p_frontier, p_metadata, p_delta_depth, p_delta_bytes, p_snapshot_bytes,
                p_has_snapshot, p_default_ttl, p_checkpoints_table, false, p_roles, p_channels,
                p_ops, p_datas) AS w;
        RETURN QUERY SELECT 'put'::text, v_written, 0, v_verdict, NULL::text, NULL::text,
            NULL::text, NULL::text, NULL::bytea, NULL::bytea, NULL::integer, NULL::bigint,
            NULL::integer, NULL::bigint, NULL::bigint, NULL::integer, NULL::text, NULL::float8;
    END
    $start$"""
"""A run's start with its first checkpoint, in one round trip: the lease and the read of
:data:`PG_ACQUIRE_GET_FUNCTION_2` (the same rows: ``'lease'`` or ``'busy'`` first, then the
head's rows if the thread has one) and, only when the lease was taken and the head is
``p_expected_head`` (NULL: the thread has no checkpoint), :data:`PG_PUT_FUNCTION` of the
checkpoint under that lease, reported by one last row ``('put', written, 0, verdict, ...)``."""

PG_PUT_WITH_WRITES_FINAL_FUNCTION = """CREATE FUNCTION graphexec_put_with_writes_final(
        p_thread_id text, p_checkpoint_ns text, p_checkpoint_id text, p_parent_id text,
        p_expected_head text, p_epoch bigint, p_step bigint, p_source text, p_created_at bigint,
        p_graph_version text, p_next_nodes text, p_frontier bytea, p_metadata bytea,
        p_delta_depth bigint, p_delta_bytes bigint, p_snapshot_bytes bigint,
        p_has_snapshot bigint, p_default_ttl float8, p_checkpoints_table text,
        p_roles text[], p_channels text[], p_ops text[], p_datas bytea[],
        p_task_id text, p_write_channels text[], p_write_datas bytea[])
    RETURNS TABLE (o_verdict text, o_owner text, o_head text, o_dup boolean, o_written bigint)
    LANGUAGE plpgsql AS $paused$
    DECLARE
        v_writes text;
    BEGIN
        SELECT p.o_verdict, p.o_owner, p.o_head, p.o_dup, p.o_written
            INTO o_verdict, o_owner, o_head, o_dup, o_written
            FROM graphexec_put(p_thread_id, p_checkpoint_ns, p_checkpoint_id, p_parent_id,
                p_expected_head, p_epoch, p_step, p_source, p_created_at, p_graph_version,
                p_next_nodes, p_frontier, p_metadata, p_delta_depth, p_delta_bytes,
                p_snapshot_bytes, p_has_snapshot, p_default_ttl, p_checkpoints_table, false,
                p_roles, p_channels, p_ops, p_datas) AS p;
        IF o_verdict IS NULL AND o_written = 1 THEN
            SELECT w.o_verdict INTO v_writes
                FROM graphexec_put_writes_final(p_thread_id, p_checkpoint_ns, p_checkpoint_id,
                    p_epoch, array_fill(p_task_id, ARRAY[cardinality(p_write_channels)]),
                    p_write_channels, p_write_datas) AS w;
            IF v_writes IS NOT NULL THEN  -- cannot happen: lease and checkpoint checked above
                RAISE EXCEPTION 'graphexec_put_with_writes_final: writes refused (%)', v_writes;
            END IF;
        END IF;
        RETURN NEXT;
    END
    $paused$"""
"""A run's pause with a checkpoint held back (``exit`` durability), in one transaction:
:data:`PG_PUT_FUNCTION` of the checkpoint, then, only if it was written,
:data:`PG_PUT_WRITES_FINAL_FUNCTION` of one task's writes on it (which releases the lease).
Returns what ``graphexec_put`` returns; a refusal of the writes after the put, which the put's
own checks rule out, raises and so rolls the put back too."""

POSTGRES = Dialect(
    name="postgres",
    blob="BYTEA",
    bigint="BIGINT",
    double="DOUBLE PRECISION",
    serial_pk="BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY",
    without_rowid="",
    put_function=PG_PUT_FUNCTION,
    op_results="""CREATE TABLE graphexec_op_results (
        op_id TEXT PRIMARY KEY,
        result BIGINT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    get_function=PG_GET_FUNCTION,
    acquire_get_function=PG_ACQUIRE_GET_FUNCTION,
    put_writes_function=PG_PUT_WRITES_FUNCTION,
    acquire_get_function_2=PG_ACQUIRE_GET_FUNCTION_2,
    put_writes_final_function=PG_PUT_WRITES_FINAL_FUNCTION,
    acquire_put_function=PG_ACQUIRE_PUT_FUNCTION,
    put_with_writes_final_function=PG_PUT_WITH_WRITES_FINAL_FUNCTION,
)
