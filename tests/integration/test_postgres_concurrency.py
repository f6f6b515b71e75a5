"""Several processes on one PostgreSQL schema: migrations, many runs, racing resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pg_worker as worker
import pytest
import sqlite_worker
from pg import admin_connection, fresh_schema, postgres_dsn

from checkpointers import PostgresCheckpointer
from checkpointers import _sql as sql

pytestmark = pytest.mark.postgres

WORKER = Path(worker.__file__)


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


def run_at_gate(gate: Path, commands: Sequence[list[str]], *, timeout: float = 120) -> list[Any]:
    """Start the workers, open the gate once all are ready, return each one's JSON line."""
    gate.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), *cmd],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in commands
    ]
    deadline = time.monotonic() + timeout
    while len(list(gate.glob("ready-*"))) < len(procs):
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    (gate / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_six_processes_migrating_a_fresh_schema_at_once_apply_each_migration_once(
    tmp_path: Path,
) -> None:
    dsn = postgres_dsn()
    for round_ in range(3):
        schema = f"gxtest_migrate_{uuid.uuid4().hex[:12]}_{round_}"  # unique across test runs
        gate = tmp_path / f"gate-{round_}"
        try:
            results = run_at_gate(
                gate, [["migrate", dsn, schema, str(gate), str(i)] for i in range(6)]
            )
            assert results == [{"ok": True}] * 6
            with admin_connection() as conn:
                versions = conn.execute(
                    f'SELECT version FROM "{schema}".graphexec_migrations ORDER BY version'
                ).fetchall()
                assert [v for (v,) in versions] == list(range(len(sql.MIGRATIONS)))
                tables = conn.execute(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = %s", (schema,)
                ).fetchone()
                assert tables == (
                    8,
                )  # checkpoints, channels, writes, heads, leases, threads, migrations, op results
        finally:
            with admin_connection() as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


async def test_four_processes_times_twenty_five_runs_on_distinct_threads(
    tmp_path: Path, schema: str
) -> None:
    dsn = postgres_dsn()
    gate = tmp_path / "gate"
    results = run_at_gate(gate, [["runs", dsn, schema, str(gate), str(i), "25"] for i in range(4)])
    errors = [e for r in results for e in r["errors"]]
    assert errors == []
    assert sum(r["done"] for r in results) == 100
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        threads = await cp.list_threads()
        assert {t.thread_id for t in threads} == {f"p{i}-t{j}" for i in range(4) for j in range(25)}
        assert all(t.next_nodes == () and t.checkpoints == 4 for t in threads)
        graph = sqlite_worker.build_count_graph(cp)
        state = await graph.aget_state("p3-t24")
        assert state is not None and state.values == {"n": 3, "log": ["c0", "c1", "c2"]}


async def test_racing_resumes_of_an_interrupted_thread_have_one_winner(
    tmp_path: Path, schema: str
) -> None:
    dsn = postgres_dsn()
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        graph = sqlite_worker.build_review_graph(cp)
        first = await graph.arun(
            {"draft": "release notes", "approvals": [], "published": []}, thread_id="review"
        )
        assert first.status == "interrupted"
        before = await cp.get("review")
        assert before is not None

    gate = tmp_path / "gate"
    results = run_at_gate(gate, [["race", dsn, schema, str(gate), str(i)] for i in range(4)])

    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["busy", "busy", "busy", "ran"], results
    [winner] = [r for r in results if r["outcome"] == "ran"]
    assert winner["status"] == "done"
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        graph = sqlite_worker.build_review_graph(cp)
        state = await graph.aget_state("review")
        assert state is not None
        assert len(state.values["approvals"]) == 1
        assert len(state.values["published"]) == 1
        assert len(await cp.list_tips("review")) == 1, "history forked"
        history = await graph.aget_state_history("review")
        steps = [s.step for s in history]
        assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)
        assert before.checkpoint.checkpoint_id in {s.checkpoint_id for s in history}
