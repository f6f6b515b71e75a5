"""No accepted run is silently dropped: SIGKILL queue workers while they drain enqueued runs.

Runs are enqueued on PostgreSQL (an accepted run is one ``enqueue`` returned an id for); two
``graphexec worker`` processes drain them while a killer SIGKILLs a random worker at random
moments and starts a replacement. At the end every accepted run is ``done``, its thread holds
the full chain exactly once (no step lost or applied twice), and steps ran again only where a
kill interrupted them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rel_support import LONG, SEED, STATS, rng_for

pytestmark = pytest.mark.postgres

INTEGRATION = Path(__file__).resolve().parent.parent / "integration"
ROOT = INTEGRATION.parents[1]
RUNS = 40 if LONG else 12
KILLS = 20 if LONG else 4


def spawn(dsn: str, trace: Path, folder: Path) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(INTEGRATION), str(ROOT), env.get("PYTHONPATH", "")])
    env["GRAPHEXEC_TEST_TRACE"] = str(trace)
    env["GRAPHEXEC_TEST_STEP_SECONDS"] = "0.08"
    command = [sys.executable, "-m", "graphexec.cli", "worker", "--dsn", dsn, "--lease-ttl"]
    command += ["1.0", "--concurrency", "2", "queue_graphs:chain"]
    log = folder / f"worker.{time.monotonic_ns()}.log"
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(400 if LONG else 120)
async def test_killed_queue_workers_drop_no_accepted_run(tmp_path: Path) -> None:
    import psycopg
    from pg import fresh_schema, postgres_dsn, schema_dsn

    from checkpointers import PostgresCheckpointer
    from checkpointers.queue import RunQueue

    rng = rng_for("queue-crash")
    trace = tmp_path / "trace.txt"
    async with fresh_schema() as name:
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA "{name}"')
        dsn = schema_dsn(name)
        queue = RunQueue(dsn)
        await queue.setup()
        workers: list[subprocess.Popen[str]] = []
        try:
            ids = [
                await queue.enqueue("chain", {"log": []}, thread_id=f"q{i}") for i in range(RUNS)
            ]
            workers = [spawn(dsn, trace, tmp_path) for _ in range(2)]
            kills = 0
            deadline = time.monotonic() + (300 if LONG else 90)
            while len(await queue.list(status="done", limit=1000)) < RUNS:
                assert time.monotonic() < deadline, "the queue was not drained in time"
                await asyncio.sleep(rng.uniform(0.2, 0.8))
                running = await queue.list(status="running", limit=1000)
                if kills < KILLS and running:  # kill a worker that is (likely) mid-run
                    victim = workers.pop(rng.randrange(len(workers)))
                    victim.send_signal(signal.SIGKILL)
                    await asyncio.to_thread(victim.wait, 10)
                    kills += 1
                    STATS.add("kills", kind="kills postgres queue worker")
                    workers.append(spawn(dsn, trace, tmp_path))
                assert all(w.poll() is None for w in workers), "a worker died on its own"
            runs = [await queue.get(r) for r in ids]
            failed = [r for r in runs if r is None or r.status != "done"]
            STATS.add("lost", len(failed))
            assert not failed, f"seed {SEED}: runs dropped or failed: {failed}"
            assert kills >= min(KILLS, 3), f"only {kills} kills landed while runs were running"
            import queue_graphs

            async with PostgresCheckpointer.open(dsn) as cp:
                graph = queue_graphs.build_chain().with_checkpointer(cp)
                for i in range(RUNS):
                    state = await graph.aget_state(f"q{i}")
                    assert state is not None and state.next == ()
                    assert state.values["log"] == [f"s{j}" for j in range(6)], state.values
                    assert len(await cp.list_tips(f"q{i}")) == 1
            counts = Counter(x for x in trace.read_text().splitlines() if x.strip())
            assert len(counts) == 6 * RUNS  # every step of every run ran
            again = sum(n - 1 for n in counts.values())
            assert again <= kills * 3, f"{again} re-executed steps for {kills} kills"
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    await asyncio.to_thread(w.wait, 20)
                except subprocess.TimeoutExpired:
                    w.kill()
            await queue.aclose()
