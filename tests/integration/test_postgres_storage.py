"""PostgreSQL-specific behaviour: migrations, schemas, plans, event loops, pools, leaks, errors."""

from __future__ import annotations

import asyncio
import gc
import operator
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from pg import admin_connection, fresh_schema, postgres_dsn, schema_dsn

from checkpointers import PostgresCheckpointer
from checkpointers import _sql as sql
from checkpointers import postgres as pg_backend
from checkpointers._pg_db import sql_text
from graphexec import (
    END,
    START,
    CheckpointError,
    CompiledGraph,
    PendingWrite,
    StateGraph,
    StorageError,
    ThreadBusyError,
)
from graphexec.testing import assert_eventually, make_checkpoint, put_chain

pytestmark = pytest.mark.postgres


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


def tagged_dsn(tag: str) -> str:
    """The test DSN with an ``application_name``, to find this store's server backends."""
    dsn = postgres_dsn()
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={tag}"


def backends(tag: str) -> int:
    with admin_connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
        ).fetchone()
    assert row is not None and isinstance(row[0], int)
    return row[0]


# -- migrations and schemas --------------------------------------------------------------------


async def test_migrations_run_once_and_reopening_changes_nothing(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        await cp.setup()  # idempotent
        assert cp.schema == schema
    query = f'SELECT version, applied_at FROM "{schema}".graphexec_migrations ORDER BY version'
    with admin_connection() as conn:
        first = conn.execute(query).fetchall()
    assert [v for v, _ in first] == list(range(len(sql.MIGRATIONS)))
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema):
        pass
    with admin_connection() as conn:
        assert conn.execute(query).fetchall() == first


async def test_a_newer_schema_is_refused(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema):
        pass
    with admin_connection() as conn:
        conn.execute(
            f'INSERT INTO "{schema}".graphexec_migrations VALUES (%s, 0)', (len(sql.MIGRATIONS),)
        )
    with pytest.raises(StorageError, match="newer than this graphexec"):
        async with PostgresCheckpointer.open(postgres_dsn(), schema=schema):
            pass


async def test_without_schema_the_tables_follow_the_search_path(schema: str) -> None:
    with admin_connection() as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    async with PostgresCheckpointer.open(schema_dsn(schema)) as cp:
        assert cp.schema is None
        [head] = await put_chain(cp, "t", 1)
    with admin_connection() as conn:
        row = conn.execute(f'SELECT checkpoint_id FROM "{schema}".graphexec_checkpoints').fetchone()
    assert row == (head.checkpoint_id,)


async def test_schemas_isolate_stores_in_one_database() -> None:
    async with fresh_schema() as a, fresh_schema() as b:
        async with (
            PostgresCheckpointer.open(postgres_dsn(), schema=a) as first,
            PostgresCheckpointer.open(postgres_dsn(), schema=b) as second,
        ):
            one = await put_chain(first, "t", 2)
            two = await put_chain(second, "t", 3)
            await first.acquire_lease("t", owner="run-a", ttl=60)
            await second.acquire_lease("t", owner="run-b", ttl=60)  # not busy: another schema
            assert [c.checkpoint_id for c in await first.list("t")] == [
                c.checkpoint_id for c in reversed(one)
            ]
            assert len(await second.list("t")) == len(two)


def test_statements_are_rewritten_for_psycopg() -> None:
    query = "SELECT x::text, '%' FROM graphexec_heads AS h JOIN graphexec_heads_x ON :a = :b"
    text = sql_text(query, tables={"graphexec_heads"}, schema="s", types={"a": "text"})
    assert text == (
        "SELECT x::text, '%%' FROM \"s\".graphexec_heads AS h JOIN graphexec_heads_x "
        "ON %(a)s::text = %(b)s"
    )
    assert sql_text("SELECT :a", tables={"graphexec_heads"}) == "SELECT %(a)s"
    # quoted text is kept (bar escaping %), comments go, whitespace collapses
    quoted = """SELECT  'a  :x %',  "graphexec_heads"  -- a :comment
        FROM   graphexec_heads WHERE b = '--' AND c = $$ :y $$ AND d = t.graphexec_heads"""
    assert sql_text(quoted, tables={"graphexec_heads"}, schema="s") == (
        "SELECT 'a  :x %%', \"graphexec_heads\" FROM \"s\".graphexec_heads WHERE b = '--' "
        "AND c = $$ :y $$ AND d = t.graphexec_heads"
    )


# -- query plans ---------------------------------------------------------------------------------

THREADS = 4000
STEPS = 6


def populate(schema: str) -> None:
    """Many threads (rows shaped like real ones, payloads empty), then ANALYZE."""
    s = f'"{schema}"'
    with admin_connection() as conn, conn.transaction():
        conn.execute(
            f"""INSERT INTO {s}.graphexec_checkpoints (thread_id, checkpoint_ns, checkpoint_id,
                parent_id, step, source, created_at, graph_version, next_nodes, frontier,
                metadata, delta_depth, delta_bytes, snapshot_bytes, has_snapshot)
            SELECT 't' || t, '', 'c' || t || '-' || k,
                CASE WHEN k > 0 THEN 'c' || t || '-' || (k - 1) END, k, 'loop', k, 'v', '[]',
                '\\x'::bytea, '\\x'::bytea, k, 0, 0, (k = 0)::int
            FROM generate_series(1, %s) AS t, generate_series(0, %s) AS k""",
            (THREADS, STEPS - 1),
        )
        conn.execute(
            f"""INSERT INTO {s}.graphexec_channels (cp_seq, role, channel, op, data)
            SELECT cp_seq, 'd', ch, 'set', '\\x00'::bytea
            FROM {s}.graphexec_checkpoints, unnest(ARRAY['a', 'b', 'c']) AS ch"""
        )
        conn.execute(
            f"""INSERT INTO {s}.graphexec_heads (thread_id, checkpoint_ns, head_id, head_seq)
            SELECT thread_id, '', checkpoint_id, cp_seq FROM {s}.graphexec_checkpoints
            WHERE step = %s""",
            (STEPS - 1,),
        )
        conn.execute(
            f"""INSERT INTO {s}.graphexec_writes (cp_seq, task_id, channel, data)
            SELECT head_seq, 'task', 'x', '\\x00'::bytea FROM {s}.graphexec_heads"""
        )
        conn.execute(
            f"""INSERT INTO {s}.graphexec_leases (thread_id, owner, epoch, expires_at)
            SELECT 't' || t, 'run', 1, 0 FROM generate_series(1, %s) AS t""",
            (THREADS,),
        )
        conn.execute(
            f"""INSERT INTO {s}.graphexec_threads (thread_id, ttl, touched_at, expires_at)
            SELECT 't' || t, 1e9, 0, 1e9 + t FROM generate_series(1, %s) AS t""",
            (THREADS,),
        )
    with admin_connection() as conn:
        conn.execute(f"ANALYZE {s}.graphexec_checkpoints, {s}.graphexec_channels")
        conn.execute(f"ANALYZE {s}.graphexec_heads, {s}.graphexec_writes")
        conn.execute(f"ANALYZE {s}.graphexec_leases, {s}.graphexec_threads")


BIG_TABLES = ("checkpoints", "channels", "heads", "writes", "leases", "threads")


async def test_every_query_path_uses_an_index_on_big_tables(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        populate(schema)
        thread, cid = "t1234", f"c1234-{STEPS - 1}"
        params: dict[str, Any] = {
            "thread_id": thread,
            "checkpoint_ns": "",
            "checkpoint_id": cid,
            "parent_id": f"c1234-{STEPS - 2}",
            "expected_head": f"c1234-{STEPS - 2}",
            "known": None,
            "before": None,
            "limit": 5,
            "keep_last": 3,
            "now": 1.0,
            "cp_seq": 1,
            "seqs": [1, 2],
            "ids": [thread, "t77"],
            "epoch": 1,
            "release": False,
            "owner": "run",
            "ttl": 30.0,
            "task_id": "task",
            "default_ttl": None,
            "checkpoints_table": f'"{schema}".graphexec_checkpoints',
            "roles": ["d"],
            "channels": ["a"],
            "ops": ["set"],
            "datas": [b"x"],
            **{k: 0 for k in ("step", "created_at", "delta_depth", "delta_bytes")},
            **{k: 0 for k in ("snapshot_bytes", "has_snapshot")},
            **{k: "x" for k in ("source", "graph_version", "next_nodes")},
            **{k: b"" for k in ("frontier", "metadata")},
        }
        queries = {
            "get": sql.GET_CHECKPOINT,
            "get by id": sql.GET_CHECKPOINT,
            "get since": sql.GET_CHECKPOINT,
            "list": sql.LIST_CHECKPOINTS,
            "tips": sql.LIST_TIPS,
            "put": pg_backend._PUT,
            "put_writes": pg_backend._PUT_WRITES,
            "acquire": pg_backend._ACQUIRE,
            "renew": pg_backend._RENEW,
            "release": sql.RELEASE_LEASE,
            "prune": sql.PRUNE_DOOMED,
            "rebase": sql.REBASE_TARGET,
            "set_ttl": pg_backend._SET_TTL,
            "expire": pg_backend._EXPIRED,
            "expire locks": pg_backend._LOCK_CHECKPOINTS_OF,
            "expire recheck": pg_backend._DELETE_EXPIRED,
            "lock doomed": pg_backend._LOCK_DOOMED,
            "lock thread": pg_backend._LOCK_CHECKPOINTS,
            **{f"delete {i}": q for i, q in enumerate(sql.DELETE_THREAD)},
        }
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as conn:
            for name, query in queries.items():
                bound = dict(params, checkpoint_id=None) if name == "get" else params
                if name == "get since":
                    bound = dict(params, checkpoint_id=None, known=f"c1234-{STEPS - 50}")
                cur = await conn.execute("EXPLAIN " + cp._db.sql(query), bound)
                plan = [str(row[0]) for row in await cur.fetchall()]
                scans = [
                    line.strip()
                    for line in plan
                    if "Seq Scan on graphexec_" in line
                    and line.split("Seq Scan on graphexec_")[1].split()[0] in BIG_TABLES
                ]
                assert not scans, (name, "\n".join(plan))
        # and the answers are right on the big tables
        got = await cp._db.fetch(
            "get",
            sql.GET_CHECKPOINT,
            {"thread_id": thread, "checkpoint_ns": "", "checkpoint_id": None, "known": None},
        )
        assert {r[3] for r in got if r[0] == "c"} == {f"c1234-{k}" for k in range(STEPS)}


async def test_get_list_put_and_put_writes_are_one_statement_each(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        cps = await put_chain(cp, "long", 300)
        statements: list[str] = []
        original = psycopg.AsyncConnection.execute

        async def counting(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            statements.append(str(query))
            return await original(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.AsyncConnection, "execute", counting)
        lease = await cp.acquire_lease("long", owner="run", ttl=60)
        for call in (
            lambda: cp.get("long"),
            lambda: cp.get("long", "", cps[150].checkpoint_id),
            lambda: cp.list("long"),
            lambda: cp.put_writes(
                "long", "", cps[-1].checkpoint_id, "t", [("x", b"1")], lease=lease
            ),
            lambda: cp.put(
                make_checkpoint("long", parent=cps[-1]),
                expected_head=cps[-1].checkpoint_id,
                lease=lease,
            ),
            lambda: cp.renew_lease(lease, ttl=60),
        ):
            statements.clear()
            await call()
            assert len(statements) == 1, statements
        got = await cp.get("long", "", cps[-1].checkpoint_id)
        assert got is not None and len(got.chain) == 299 and not got.is_head


async def test_reopen_reads_everything_back(schema: str) -> None:
    dsn = postgres_dsn()
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        lease = await cp.acquire_lease("t", owner="run-1", ttl=60)
        cps = await put_chain(cp, "t", 5, lease=lease, snapshot_steps={2})
        await put_chain(cp, "t", 2, ns="sub", lease=lease)
        await cp.put_writes("t", "", cps[-1].checkpoint_id, "task", [("a", b"1")], lease=lease)
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        got = await cp.get("t")
        assert got is not None
        assert got.checkpoint == cps[-1]
        assert [c.checkpoint_id for c in got.chain] == [c.checkpoint_id for c in cps[2:4]]
        assert got.pending_writes == (PendingWrite("task", "a", b"1"),)
        assert len(await cp.list("t", "sub")) == 2
        with pytest.raises(ThreadBusyError):
            await cp.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(cp, "t", 1, after=cps[-1], lease=lease)  # the lease survives reopening


async def test_missing_history_fails_loudly_instead_of_returning_empty_state(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        cps = await put_chain(cp, "t", 4)
        with admin_connection() as conn:
            conn.execute(
                f'DELETE FROM "{schema}".graphexec_checkpoints WHERE checkpoint_id = %s',
                (cps[1].checkpoint_id,),
            )
        with pytest.raises(CheckpointError, match="is missing"):
            await cp.get("t")


# -- event loops, the sync facade, lifecycle -------------------------------------------------------


class Count(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def count_graph(cp: PostgresCheckpointer) -> CompiledGraph[Any]:
    async def inc(state: Count) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": ["inc"]}

    def double(state: Count) -> dict[str, Any]:
        return {"n": state["n"] * 2, "log": ["double"]}

    b = StateGraph(Count)
    b.add_node("inc", inc)
    b.add_node("double", double)
    b.add_edge(START, "inc")
    b.add_edge("inc", "double")
    b.add_edge("double", END)
    return b.compile(checkpointer=cp)


@pytest.fixture
def sync_schema() -> Iterator[str]:
    name = f"gxtest_sync_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with admin_connection() as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_sync_facade_and_asyncio_run_share_one_checkpointer(sync_schema: str) -> None:
    tag = f"gx-sync-{uuid.uuid4().hex[:8]}"
    cp = PostgresCheckpointer(tagged_dsn(tag), schema=sync_schema)  # no setup: created on use
    graph = count_graph(cp)
    assert graph.invoke({"n": 1, "log": []}, thread_id="a") == {"n": 4, "log": ["inc", "double"]}
    out = asyncio.run(graph.ainvoke({"n": 1, "log": []}, thread_id="b"))
    assert out == {"n": 4, "log": ["inc", "double"]}
    again = graph.invoke({"n": 0, "log": []}, thread_id="b")
    assert again == {"n": 2, "log": ["inc", "double", "inc", "double"]}
    assert asyncio.run(graph.ainvoke({"n": 5, "log": []}, thread_id="c"))["n"] == 12
    state = graph.get_state("a")
    assert state is not None and state.values["n"] == 4
    assert len(graph.get_state_history("b")) == 6
    asyncio.run(cp.aclose())  # closes the background loop's pool too, and the dead loops'

    async def disconnected() -> None:  # (the server notices a closed socket a moment later)
        assert backends(tag) == 0

    asyncio.run(assert_eventually(disconnected))
    with pytest.raises(StorageError, match="closed"):
        graph.invoke({"n": 1, "log": []}, thread_id="c")


async def test_sync_and_async_callers_at_the_same_time(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema, pool_max=3) as cp:
        graph = count_graph(cp)

        def sync_side() -> None:
            for i in range(15):
                graph.invoke({"n": i, "log": []}, thread_id=f"sync-{i}")

        async def async_side() -> None:
            await asyncio.gather(
                *(graph.ainvoke({"n": i, "log": []}, thread_id=f"async-{i}") for i in range(15))
            )

        await asyncio.gather(asyncio.to_thread(sync_side), async_side())
        assert len(await cp.list_threads()) == 30
        for prefix in ("sync", "async"):
            state = await graph.aget_state(f"{prefix}-7")
            assert state is not None and state.values["n"] == 16


async def test_a_leaked_checkpointer_warns_and_its_connections_close(schema: str) -> None:
    tag = f"gx-leak-{uuid.uuid4().hex[:8]}"
    cp = PostgresCheckpointer(tagged_dsn(tag), schema=schema)
    await put_chain(cp, "t", 1)
    assert backends(tag) >= 1
    with pytest.warns(ResourceWarning, match="garbage-collected with open connections"):
        del cp
        gc.collect()

    async def connections_closed() -> None:
        assert backends(tag) == 0

    await assert_eventually(connections_closed)


async def test_a_closed_checkpointer_refuses_work(schema: str) -> None:
    cp = PostgresCheckpointer(postgres_dsn(), schema=schema)
    async with cp:
        await put_chain(cp, "t", 1)
    await cp.aclose()  # closing twice is fine
    with pytest.raises(StorageError, match="closed"):
        await cp.get("t")


async def test_an_unreachable_server_is_a_storage_error_without_the_password() -> None:
    dsn = "postgresql://someone:s3cret-pw@127.0.0.1:1/nowhere?connect_timeout=2"
    with pytest.raises(
        StorageError, match=r"cannot connect to PostgreSQL at 127\.0\.0\.1:1/nowhere"
    ) as info:
        async with PostgresCheckpointer.open(dsn):
            pass
    assert "s3cret-pw" not in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.OperationalError)


async def test_driver_errors_name_the_operation(schema: str) -> None:
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema) as cp:
        await put_chain(cp, "t", 1)
        with admin_connection() as conn:
            conn.execute(f'DROP TABLE "{schema}".graphexec_channels')
        with pytest.raises(
            StorageError, match=r"PostgreSQL get on .* failed: .*graphexec_channels"
        ):
            await cp.get("t")


def test_options_are_validated() -> None:
    dsn = "postgresql://u@localhost/db"
    with pytest.raises(ValueError, match="schema"):
        PostgresCheckpointer(dsn, schema="bad name; DROP")
    with pytest.raises(ValueError, match="pool_max"):
        PostgresCheckpointer(dsn, pool_min=5, pool_max=2)
    with pytest.raises(ValueError, match="pool_timeout"):
        PostgresCheckpointer(dsn, pool_timeout=0)
    with pytest.raises(ValueError, match="default_ttl"):
        PostgresCheckpointer(dsn, default_ttl=-1)
    with pytest.raises(ValueError, match="invalid PostgreSQL DSN"):
        PostgresCheckpointer("host=x port")
    assert "u@" not in repr(PostgresCheckpointer(dsn))


async def test_prepared_statements_when_asked_for(schema: str) -> None:
    async with PostgresCheckpointer.open(
        postgres_dsn(), schema=schema, prepare=True, pool_max=1
    ) as cp:
        for i in range(8):
            await put_chain(cp, f"t{i}", 2)
            assert await cp.get(f"t{i}") is not None

        async def prepared(s: Any) -> int:
            rows = await s.fetch("SELECT count(*) FROM pg_prepared_statements")
            return int(rows[0][0])

        assert await cp._db.run("count", prepared) > 0
    async with PostgresCheckpointer.open(postgres_dsn(), schema=schema, pool_max=1) as cp:
        for i in range(8):
            assert await cp.get(f"t{i}") is not None
        assert await cp._db.run("count", prepared) == 0  # the default: nothing kept per session
