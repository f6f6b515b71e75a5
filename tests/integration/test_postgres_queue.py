"""The PostgreSQL run queue and workers: durability, ordering, takeover, shutdown, cancel."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import psycopg
import pytest
from pg import fresh_schema, postgres_dsn, schema_dsn

from checkpointers import Encryption
from checkpointers.queue import RunQueue, Worker
from graphexec import Command

pytestmark = pytest.mark.postgres

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        async with await psycopg.AsyncConnection.connect(postgres_dsn(), autocommit=True) as c:
            await c.execute(f'CREATE SCHEMA "{name}"')
        yield schema_dsn(name)


@pytest.fixture
async def queue(dsn: str) -> AsyncIterator[RunQueue]:
    q = RunQueue(dsn)
    await q.setup()
    try:
        yield q
    finally:
        await q.aclose()


def graphs() -> dict[str, object]:
    sys.path.insert(0, str(HERE))
    import queue_graphs

    return {
        "chain": queue_graphs.build_chain(),
        "asking": queue_graphs.build_asking(),
        "broken": queue_graphs.build_broken(),
        "approving": queue_graphs.build_approving(),
    }


async def serve(dsn: str, runs: int, **options: float) -> Worker:
    worker = Worker(dsn, graphs(), lease_ttl=1.5, poll_interval=0.05, **options)  # type: ignore[arg-type]
    await asyncio.wait_for(worker.run(max_runs=runs), 60)
    return worker


def trace_counts(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line.strip() for line in path.read_text().splitlines() if line.strip())


def spawn_worker(
    dsn: str,
    trace: Path,
    *extra: str,
    step: float = 0.3,
    graph: str = "queue_graphs:chain",
    environ: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """A ``graphexec worker`` process; its output goes to a ``.log`` file beside ``trace``."""
    env = dict(os.environ)
    env.update(environ or {})
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    env["GRAPHEXEC_TEST_TRACE"] = str(trace)
    env["GRAPHEXEC_TEST_STEP_SECONDS"] = str(step)
    command = [sys.executable, "-m", "graphexec.cli", "worker", "--dsn", dsn]
    command += ["--lease-ttl", "1.5", graph, *extra]
    log = trace.with_suffix(f".{time.monotonic_ns()}.log")
    with log.open("w") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def logs(trace: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(trace.parent.glob("*.log")))


async def wait_for_trace(path: Path, lines: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while sum(trace_counts(path).values()) < lines:
        assert time.monotonic() < deadline, f"worker wrote {trace_counts(path)} in {timeout}s"
        await asyncio.sleep(0.02)


async def test_enqueue_is_durable_listed_and_cancellable(queue: RunQueue, dsn: str) -> None:
    rid = await queue.enqueue("chain", {"log": []}, thread_id="t1")
    again = await queue.enqueue("chain", {"log": []}, thread_id="t1", run_id=rid)
    assert again == rid  # idempotent by run id
    other = RunQueue(dsn)  # another client sees it at once: it was committed before returning
    try:
        run = await other.get(rid)
    finally:
        await other.aclose()
    assert run is not None and run.status == "queued" and run.thread_id == "t1"
    assert [r.run_id for r in await queue.list(status="queued")] == [rid]
    cancelled = await queue.cancel(rid)
    assert cancelled.status == "cancelled" and cancelled.finished
    assert await queue.get("nope") is None


async def test_worker_runs_records_status_and_keeps_thread_order(queue: RunQueue, dsn: str) -> None:
    first = await queue.enqueue("chain", {"log": ["a"]}, thread_id="t")
    second = await queue.enqueue("chain", {"log": ["b"]}, thread_id="t")
    third = await queue.enqueue("chain", {"log": ["c"]}, thread_id="other")
    # two workers at once: runs of thread "t" still go one after another, in order
    await asyncio.gather(serve(dsn, 2, concurrency=2), serve(dsn, 1, concurrency=2))
    runs = {r: await queue.wait(r, timeout=10) for r in (first, second, third)}
    assert {r.status for r in runs.values()} == {"done"}
    assert runs[first].finished_at is not None and runs[second].started_at is not None
    assert runs[first].finished_at <= runs[second].started_at
    g = graphs()["chain"]
    from checkpointers.postgres import PostgresCheckpointer

    store = PostgresCheckpointer(dsn)
    try:
        state = await g.with_checkpointer(store).aget_state("t")  # type: ignore[attr-defined]
    finally:
        await store.aclose()
    steps = [f"s{i}" for i in range(6)]
    assert state.values["log"] == ["a", *steps, "b", *steps]


async def test_interrupted_run_then_resume_through_the_queue(queue: RunQueue, dsn: str) -> None:
    rid = await queue.enqueue("asking", {"log": []}, thread_id="h")
    await serve(dsn, 1)
    paused = await queue.wait(rid, timeout=10)
    assert paused.status == "interrupted"
    resumed = await queue.enqueue("asking", Command(resume="yes"), thread_id="h")
    await serve(dsn, 1)
    done = await queue.wait(resumed, timeout=10)
    assert done.status == "done" and done.checkpoint_id is not None


async def test_failed_run_records_the_error(queue: RunQueue, dsn: str) -> None:
    rid = await queue.enqueue("broken", {"log": []}, thread_id="f")
    await serve(dsn, 1)
    run = await queue.wait(rid, timeout=10)
    assert run.status == "failed" and run.error is not None and "CRM is down" in run.error


async def test_sigkilled_worker_is_taken_over_and_resumed(
    queue: RunQueue, dsn: str, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.txt"
    rid = await queue.enqueue("chain", {"log": []}, thread_id="k")
    victim = spawn_worker(dsn, trace)
    try:
        await wait_for_trace(trace, 2)  # two steps done, the third running
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    done_before = trace_counts(trace)
    rescuer = spawn_worker(dsn, trace, "--max-runs", "1", step=0.0)
    try:
        assert rescuer.wait(60) == 0, logs(trace)
    finally:
        if rescuer.poll() is None:
            rescuer.kill()
    run = await queue.wait(rid, timeout=10)
    assert run.status == "done" and run.attempts == 2
    counts = trace_counts(trace)
    assert all(counts[f"k s{i}"] >= 1 for i in range(6))
    # steps committed before the kill ran once; at most the step in flight ran twice
    assert sum(counts.values()) - 6 <= 1
    assert all(counts[k] == 1 for k in done_before if k != max(done_before))


async def test_sigterm_hands_runs_back(queue: RunQueue, dsn: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    rid = await queue.enqueue("chain", {"log": []}, thread_id="g")
    leaving = spawn_worker(dsn, trace, "--grace", "0")
    try:
        await wait_for_trace(trace, 1)
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(20) == 0, logs(trace)
    finally:
        if leaving.poll() is None:
            leaving.kill()
    handed_back = await queue.get(rid)
    assert handed_back is not None and handed_back.status == "queued"
    await serve(dsn, 1)
    run = await queue.wait(rid, timeout=10)
    assert run.status == "done" and run.attempts == 2


async def test_cancel_a_running_run(queue: RunQueue, dsn: str, tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    rid = await queue.enqueue("chain", {"log": []}, thread_id="c")
    worker = spawn_worker(dsn, trace, "--max-runs", "1", step=0.5)
    try:
        await wait_for_trace(trace, 1)
        await queue.cancel(rid)
        run = await queue.wait(rid, timeout=15)
        assert run.status == "cancelled"
        assert worker.wait(20) == 0, logs(trace)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert sum(trace_counts(trace).values()) < 6


async def test_four_workers_drain_200_runs_none_lost_none_twice(
    queue: RunQueue, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.txt"
    ids = [await queue.enqueue("short", {"log": []}, thread_id=f"d{i}") for i in range(200)]
    workers = [
        spawn_worker(queue.dsn, trace, "--concurrency", "2", step=0.0, graph="queue_graphs:short")
        for _ in range(4)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(await queue.list(status="done", limit=1000)) < 200:
            assert time.monotonic() < deadline, logs(trace)
            assert all(w.poll() is None for w in workers), logs(trace)
            await asyncio.sleep(0.2)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
    runs = [await queue.get(r) for r in ids]
    assert all(r is not None and r.status == "done" and r.attempts == 1 for r in runs)
    counts = trace_counts(trace)
    assert len(counts) == 400 and set(counts.values()) == {1}  # every step of every run, once
    assert len({r.worker_id for r in runs if r is not None}) > 1  # the work was shared


def stop(*workers: subprocess.Popen[str]) -> None:
    for w in workers:
        if w.poll() is None:
            w.kill()
            w.wait(10)


async def test_takeover_after_the_answer_was_recorded_resumes_and_pays_once(
    queue: RunQueue, dsn: str, tmp_path: Path
) -> None:
    """SIGKILL inside the approved node; the next worker resumes with no input (#19.1)."""
    trace = tmp_path / "trace.txt"
    kill_once = {"GRAPHEXEC_TEST_KILL_ONCE": str(tmp_path / "killed")}
    first = await queue.enqueue("approving", {"log": []}, thread_id="a")
    await serve(dsn, 1)
    assert (await queue.wait(first, timeout=10)).status == "interrupted"
    rid = await queue.enqueue("approving", Command(resume="yes"), thread_id="a")
    graph = "queue_graphs:approving"
    victim = spawn_worker(dsn, trace, step=0.0, graph=graph, environ=kill_once)
    rescuer = None
    try:
        # the victim recorded the answer, entered the node and killed itself before paying
        assert victim.wait(60) == -signal.SIGKILL, logs(trace)
        assert (tmp_path / "killed").exists() and not trace_counts(trace)
        rescuer = spawn_worker(dsn, trace, "--max-runs", "1", step=0.0, graph=graph)
        assert rescuer.wait(30) == 0, logs(trace)
    finally:
        stop(victim, *([rescuer] if rescuer else []))
    run = await queue.wait(rid, timeout=10)
    assert (run.status, run.attempts, run.error) == ("done", 2, None)
    assert trace_counts(trace) == Counter({"a pay": 1})  # the effect happened exactly once
    from checkpointers.postgres import PostgresCheckpointer

    async with PostgresCheckpointer.open(dsn) as store:
        state = await graphs()["approving"].with_checkpointer(store).aget_state("a")  # type: ignore[attr-defined]
    assert state.values == {"log": ["paid"], "answer": "yes"} and state.next == ()


async def test_a_run_that_kills_every_worker_ends_failed_after_max_attempts(
    queue: RunQueue, dsn: str, tmp_path: Path
) -> None:
    """A poison run is claimed ``--max-attempts`` times, then ends failed with why (#19.1)."""
    trace = tmp_path / "trace.txt"
    rid = await queue.enqueue("crashing", {"log": []}, thread_id="p")
    options = ("--max-attempts", "2")
    for _ in range(2):
        w = spawn_worker(dsn, trace, *options, step=0.0, graph="queue_graphs:crashing")
        try:
            assert w.wait(60) == -signal.SIGKILL, logs(trace)
        finally:
            stop(w)
    last = spawn_worker(dsn, trace, *options, step=0.0, graph="queue_graphs:crashing")
    try:
        run = await queue.wait(rid, timeout=30)
        assert last.poll() is None, logs(trace)  # it gave up on the run instead of running it
    finally:
        last.send_signal(signal.SIGTERM)
        assert last.wait(20) == 0, logs(trace)
    assert run.status == "failed" and run.attempts == 2 and run.error is not None
    assert run.error.startswith("gave up after 2 attempt(s)") and "lease expired" in run.error
    assert trace_counts(trace) == Counter({"p die": 2})


async def test_a_run_whose_database_keeps_failing_backs_off_then_fails(
    queue: RunQueue, dsn: str
) -> None:
    """StorageError from the run: retried with a doubling delay, then failed with it (#19.1)."""
    from checkpointers.postgres import PostgresCheckpointer

    down = PostgresCheckpointer("postgresql://graphexec:s3cret@127.0.0.1:1/none")
    chain = graphs()["chain"].with_checkpointer(down)  # type: ignore[attr-defined]
    rid = await queue.enqueue("chain", {"log": []}, thread_id="s")
    worker = Worker(
        dsn, {"chain": chain}, poll_interval=0.05, lease_ttl=1.5, max_attempts=3, retry_delay=0.2
    )
    try:
        await asyncio.wait_for(worker.run(max_runs=1), 60)
    finally:
        await down.aclose()
    run = await queue.get(rid)
    assert run is not None and run.status == "failed" and run.attempts == 3, run
    assert run.error is not None and run.error.startswith("gave up after 3 attempt(s): Storage")
    assert "s3cret" not in run.error
    assert run.finished_at is not None and run.started_at is not None
    # not claimed again before its not_before: 0.2 s, then 0.4 s
    assert (run.finished_at - run.started_at).total_seconds() >= 0.6


async def test_run_input_is_encrypted_at_rest_and_bound_to_its_run(dsn: str) -> None:
    """The input blob is sealed with the checkpoints' keys and the run id (#19.14)."""
    enc = Encryption(keys={"k1": os.urandom(32)}, active="k1")
    q = RunQueue(dsn, encryption=enc)
    try:
        rid = await q.enqueue("chain", {"log": ["card 4242"]}, thread_id="e")
        moved = await q.enqueue("chain", {"log": []}, thread_id="e2")
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT input FROM graphexec_runs WHERE run_id = %s", (rid,))
            row = await cur.fetchone()
            assert row is not None and b"card 4242" not in bytes(row[0])
            # a copy of one run's input into another run's row fails authentication
            await conn.execute(
                "UPDATE graphexec_runs SET input = %s WHERE run_id = %s", (row[0], moved)
            )
        plain = Worker(dsn, graphs(), poll_interval=0.05)  # type: ignore[arg-type]
        await asyncio.wait_for(plain.run(max_runs=1), 60)  # no keys: refuses the thread's first
        refused = await q.get(rid)
        assert refused is not None and refused.status == "failed" and refused.error is not None
        assert "is encrypted; give the worker encryption=" in refused.error
        await q.enqueue("chain", {"log": ["card 4242"]}, thread_id="e3", run_id="r3")
        keyed = Worker(dsn, graphs(), poll_interval=0.05, encryption=enc)  # type: ignore[arg-type]
        await asyncio.wait_for(keyed.run(max_runs=2), 60)
        swapped = await q.get(moved)
        assert swapped is not None and swapped.status == "failed" and swapped.error is not None
        assert "failed authentication" in swapped.error
        done = await q.get("r3")
        assert done is not None and done.status == "done", done
    finally:
        await q.aclose()
