"""Through a transaction-mode pooler: PgBouncer in front of the test server.

A pooler hands each transaction (here: each statement) to whichever server connection is free,
so nothing may rely on session state. The contract suite, concurrent migrations and real graph
runs must all work through it. Skipped when ``pgbouncer`` is not installed
(``apt-get install pgbouncer``); the module starts its own PgBouncer on a free local port and
stops it afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
import sqlite_worker
from pg import fresh_schema, postgres_dsn
from psycopg.conninfo import conninfo_to_dict

from checkpointers import PostgresCheckpointer
from checkpointers import _sql as sql
from graphexec import BaseCheckpointer, Command, ThreadBusyError
from graphexec.testing import CheckpointerContract

pytestmark = pytest.mark.postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def pooler_dsn() -> Iterator[str]:
    """A DSN through a PgBouncer (``pool_mode = transaction``) started for this module."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    server = conninfo_to_dict(postgres_dsn())
    user, password = str(server.get("user", "")), str(server.get("password", ""))
    dbname = str(server.get("dbname", user))
    if not user or not password:
        pytest.skip("the pooler test needs a user and password in GRAPHEXEC_TEST_POSTGRES_DSN")
    port = _free_port()
    work = Path(tempfile.mkdtemp(prefix="gx-pgbouncer-"))
    work.chmod(0o755)  # pgbouncer drops root privileges (-u) and must still read its files
    (work / "userlist.txt").write_text(f'"{user}" "{password}"\n')
    (work / "pgbouncer.ini").write_text(
        f"""[databases]
{dbname} = host={server.get("host", "127.0.0.1")} port={server.get("port", 5432)} dbname={dbname}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {work / "userlist.txt"}
pool_mode = transaction
default_pool_size = 8
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
"""
    )
    for f in work.iterdir():
        f.chmod(0o644)
    command = [binary, str(work / "pgbouncer.ini")]
    if os.geteuid() == 0:
        command[1:1] = ["-u", "postgres"]  # it refuses to run as root
    log = open(work / "pgbouncer.log", "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    dsn = f"postgresql://{user}:{password}@127.0.0.1:{port}/{dbname}"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with psycopg.connect(dsn, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"pgbouncer did not start: {(work / 'pgbouncer.log').read_text()}")
                time.sleep(0.05)
        yield dsn
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


class TestThroughPgBouncer(CheckpointerContract):
    @pytest.fixture
    async def checkpointer(self, pooler_dsn: str) -> AsyncIterator[BaseCheckpointer]:
        async with (
            fresh_schema() as schema,
            PostgresCheckpointer.open(pooler_dsn, schema=schema) as cp,
        ):
            yield cp


async def test_concurrent_migrations_through_the_pooler(pooler_dsn: str) -> None:
    # Pooled server connections are warm: their catalog caches must not decide what exists.
    for _ in range(3):
        async with fresh_schema() as schema:
            stores = [PostgresCheckpointer(pooler_dsn, schema=schema) for _ in range(6)]
            try:
                await asyncio.gather(*(cp.setup() for cp in stores))
            finally:
                for cp in stores:
                    await cp.aclose()
            with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
                rows = conn.execute(
                    f'SELECT version FROM "{schema}".graphexec_migrations ORDER BY version'
                ).fetchall()
            assert [v for (v,) in rows] == list(range(len(sql.MIGRATIONS)))


async def test_graph_runs_and_racing_resumes_through_the_pooler(pooler_dsn: str) -> None:
    async with fresh_schema() as schema:
        async with PostgresCheckpointer.open(pooler_dsn, schema=schema, pool_max=6) as cp:
            graph = sqlite_worker.build_count_graph(cp, steps=5)
            outs = await asyncio.gather(
                *(graph.ainvoke({"n": 0, "log": []}, thread_id=f"t{i}") for i in range(20))
            )
            assert all(out["n"] == 5 for out in outs)
            review = sqlite_worker.build_review_graph(cp)
            first = await review.arun(
                {"draft": "notes", "approvals": [], "published": []}, thread_id="review"
            )
            assert first.status == "interrupted"
            results = await asyncio.gather(
                *(review.arun(Command(resume=f"yes {i}"), thread_id="review") for i in range(4)),
                return_exceptions=True,
            )
            assert sum(not isinstance(r, BaseException) for r in results) == 1, results
            assert all(
                isinstance(r, ThreadBusyError) for r in results if isinstance(r, BaseException)
            )
            assert len(await cp.list_tips("review")) == 1
