"""Real crash recovery on PostgreSQL: SIGKILL a worker at several points, resume in a new process.

The workflow and the checks are those of ``test_sqlite_crash`` (a 12-step chain of 256 KiB values
with a 4-way parallel fan-out step; every node execution is logged to a side file). For each case
the parent kills the worker -- right after the k-th commit, during the fan-out after some tasks
saved their writes, while a statement is on its way to the server or running there (an armed
``execute`` sends it and kills the process after a chosen delay), or after a random delay --
waits until the server has finished with the dead client's connections, reads what the database
holds, resumes in a new process and checks:

- the final state equals an uninterrupted run's;
- the resumed process re-ran no task of a step committed before the kill, and no task whose
  writes were saved before the kill;
- no orphan rows, dangling heads or missing parents, after the kill and after the resume;
- the history is linear (one tip), one checkpoint per step, no pending writes left.

``GRAPHEXEC_PG_CRASH_KILLS`` (default 10) sets how many kills to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pg_worker as worker
import pytest
import sqlite_worker
from pg import admin_connection, fresh_schema, postgres_dsn

from checkpointers import PostgresCheckpointer
from graphexec import InMemoryCheckpointer

pytestmark = pytest.mark.postgres

WORKER = Path(worker.__file__)
KILLS = int(os.environ.get("GRAPHEXEC_PG_CRASH_KILLS", "10"))
LAST_STEP = 13  # input (0), s0..s5, the fan-out step, s6..s11


@dataclass
class Case:
    name: str
    plan: dict[str, Any] = field(default_factory=dict)
    """What the worker arms itself with (``arm_after``, ``calls``, ``delay``)."""
    after_commit: int | None = None
    after_parts: int | None = None
    delay: float | None = None


@dataclass
class Outcome:
    case: Case
    returncode: int
    head_step: int | None
    saved_tasks: set[str]
    executions: list[tuple[int, int, str, str]]
    crash_pid: int
    resume_pid: int
    problems: list[str]


def plan_cases(total: int, rng: random.Random) -> list[Case]:
    cases = [Case("before-first-commit", delay=0.0)]
    cases += [Case(f"after-commit-{k}", after_commit=k) for k in (0, 4, 7, 12)]
    cases += [Case("fan-out-2-done", after_parts=2)]
    for i, delay in enumerate((0.0, 0.0005, 0.003)):  # before sending, in flight, after commit
        step = rng.randrange(0, LAST_STEP - 1)
        cases.append(
            Case(
                f"in-statement-{i}",
                plan={"arm_after": step, "calls": rng.choice([1, 2, 3]), "delay": delay},
            )
        )
    while len(cases) < total:
        cases.append(Case(f"random-delay-{len(cases)}", delay=rng.uniform(0.0, 0.6)))
    return cases[:total]


def wait_for_disconnect(tag: str) -> None:
    """Until the server has finished with the killed client's connections (and their work)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with admin_connection() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
            ).fetchone()
        if row == (0,):
            return
        time.sleep(0.01)
    raise TimeoutError(f"the server kept the backends of {tag} for 30 s")


async def after_kill(dsn: str, schema: str) -> tuple[int | None, set[str]]:
    """The committed head's step and the tasks whose writes were saved, as stored."""
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        tup = await cp.get(worker.THREAD)
    if tup is None:
        return None, set()
    return tup.checkpoint.step, {w.task_id for w in tup.pending_writes if w.channel == "__route__"}


async def final_state(
    dsn: str, schema: str, log: Path
) -> tuple[dict[str, Any], list[int], int, int]:
    async with PostgresCheckpointer.open(dsn, schema=schema) as cp:
        graph = sqlite_worker.build_crash_graph(cp, log)
        state = await graph.aget_state(worker.THREAD)
        assert state is not None
        history = await graph.aget_state_history(worker.THREAD)
        tips = await cp.list_tips(worker.THREAD)
        head = await cp.get(worker.THREAD)
        assert head is not None
    steps = [s.step for s in reversed(history)]
    return dict(state.values), steps, len(tips), len(head.pending_writes)


def run_case(case: Case, base: Path, schema: str, reference: dict[str, Any]) -> Outcome:
    work = base / case.name
    work.mkdir()
    log = work / "executions.log"
    tag = f"gx-crash-{uuid.uuid4().hex[:10]}"
    dsn = postgres_dsn()
    crash_dsn = dsn + ("&" if "?" in dsn else "?") + f"application_name={tag}"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "crash", crash_dsn, schema, str(log), json.dumps(case.plan)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    parts = 0
    for line in proc.stdout:
        line = line.strip()
        if line == "READY" and case.delay is not None:
            time.sleep(case.delay)
            break
        if case.after_commit is not None and line == f"COMMIT {case.after_commit}":
            break
        if case.after_parts is not None and line == "END part":
            parts += 1
            if parts == case.after_parts:
                time.sleep(0.015)  # let the finished tasks' writes reach the database
                break
    proc.kill()
    _, crash_err = proc.communicate()
    problems: list[str] = []
    if proc.returncode not in (-9, 0):
        problems.append(f"crash worker failed ({proc.returncode}): {crash_err}")
    wait_for_disconnect(tag)
    problems += [f"after the kill: {p}" for p in worker.integrity_problems(dsn, schema)]
    head_step, saved = asyncio.run(after_kill(dsn, schema))

    resumed = subprocess.run(
        [sys.executable, str(WORKER), "resume", dsn, schema, str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if resumed.returncode != 0:
        problems.append(f"resume failed: {resumed.stderr}")
        return Outcome(case, proc.returncode, head_step, saved, [], proc.pid, -1, problems)
    executions = []
    for line in log.read_text().splitlines():
        pid_text, step_text, task, name = line.split()
        executions.append((int(pid_text), int(step_text), task, name))
    pids = {e[0] for e in executions} - {proc.pid}
    if len(pids) > 1:
        problems.append(f"executions from unexpected processes: {pids}")
    resume_pid = next(iter(pids), -1)

    values, steps, tips, pending = asyncio.run(final_state(dsn, schema, log))
    if values != reference:
        diff = {k: (values.get(k), reference.get(k)) for k in reference if k != "blob"}
        problems.append(f"final state differs from an uninterrupted run: {diff}")
    if steps != list(range(LAST_STEP + 1)):
        problems.append(f"history steps {steps}, expected 0..{LAST_STEP} once each")
    if tips != 1:
        problems.append(f"{tips} branch tips: history forked")
    if pending:
        problems.append(f"{pending} pending writes left on the finished head")
    problems += [f"after the resume: {p}" for p in worker.integrity_problems(dsn, schema)]

    committed = -1 if head_step is None else head_step
    for pid, step, task_id, node in executions:
        if pid != resume_pid:
            continue
        if step <= committed:
            problems.append(
                f"{node} (step {step}) ran again although step {committed} was committed"
            )
        if task_id in saved:
            problems.append(f"{node} (step {step}) ran again although its writes were saved")
    per_task = Counter(e[2] for e in executions)
    per_process = Counter((e[0], e[2]) for e in executions)
    if max(per_task.values(), default=0) > 2 or max(per_process.values(), default=0) > 1:
        problems.append(f"a task ran more than once per process: {per_process.most_common(2)}")
    return Outcome(
        case, proc.returncode, head_step, saved, executions, proc.pid, resume_pid, problems
    )


@pytest.fixture
async def schemas() -> AsyncIterator[list[str]]:
    """A fresh schema per crash case (cases run two at a time), dropped afterwards."""
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(fresh_schema()) for _ in range(KILLS)]


def test_sigkill_at_several_points_then_resume(tmp_path: Path, schemas: list[str]) -> None:
    ref_log = tmp_path / "reference.log"
    graph = sqlite_worker.build_crash_graph(InMemoryCheckpointer(), ref_log)
    reference = asyncio.run(graph.ainvoke(sqlite_worker.INPUT, thread_id=worker.THREAD))
    assert reference["log"][-1] == "s11" and sorted(reference["fan"]) == [0, 1, 2, 3]

    rng = random.Random(int(os.environ.get("GRAPHEXEC_CRASH_SEED", "20240517")))
    cases = plan_cases(KILLS, rng)
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(
            pool.map(
                lambda pair: run_case(pair[0], tmp_path, pair[1], reference),
                zip(cases, schemas, strict=False),
            )
        )

    failures = [f"{o.case.name}: {p}" for o in outcomes for p in o.problems]
    assert not failures, "\n".join(failures)

    # The checks above can only fail if the kills really interrupted runs at varied points.
    killed = [o for o in outcomes if o.returncode == -9]
    missed = [o.case.name for o in outcomes if o.returncode != -9 and o.case.delay is None]
    assert not missed, f"these runs finished before their kill: {missed}"
    heads = {o.head_step for o in killed}
    assert len(heads) >= min(5, len(cases) // 2), f"kills landed at too few points: {heads}"
    assert any(o.saved_tasks for o in outcomes), "no kill landed after a fan-out task saved"
    rerun = [o for o in outcomes if any(e[0] == o.resume_pid for e in o.executions)]
    assert len(rerun) >= len(cases) // 2
