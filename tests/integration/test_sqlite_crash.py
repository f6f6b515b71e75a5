"""Real crash recovery: SIGKILL a worker process at many points, resume in a fresh process.

The workflow (``sqlite_worker.build_crash_graph``) is a 12-step chain whose nodes each write a
256 KiB value, so commits take measurable time, with a 4-way parallel fan-out step in the
middle. Every node execution appends ``pid step task_id node`` to a side log. For each case the
parent kills the worker (right after the k-th commit marker, during the fan-out after some
parallel tasks saved their writes, inside a write transaction via an SQLite progress handler, or
after a random delay), reads what the file holds after the kill, resumes in a new process and
checks:

- the final state equals an uninterrupted run's;
- the resumed process executed no task of a step whose checkpoint was committed before the kill,
  and no task whose writes were saved before the kill (so a re-execution would be caught);
- ``PRAGMA integrity_check`` is ``ok`` after the kill and after the resume;
- the history is linear (one tip), one checkpoint per step, no pending writes left.

``GRAPHEXEC_CRASH_KILLS`` (default 24) sets how many kills to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlite_worker as worker

from checkpointers import SqliteCheckpointer
from graphexec import InMemoryCheckpointer

WORKER = Path(worker.__file__)
KILLS = int(os.environ.get("GRAPHEXEC_CRASH_KILLS", "24"))
LAST_STEP = 13  # input (0), s0..s5, the fan-out step, s6..s11


@dataclass
class Case:
    name: str
    plan: dict[str, Any] = field(default_factory=dict)
    """What the worker arms itself with (``arm_after``/``every``: kill inside a transaction)."""
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
    cases += [Case(f"after-commit-{k}", after_commit=k) for k in (0, 1, 3, 5, 6, 7, 9, 12)]
    cases += [Case("fan-out-1-done", after_parts=1), Case("fan-out-2-done", after_parts=2)]
    cases += [Case("fan-out-3-done", after_parts=3)]
    rest = max(0, total - len(cases))
    for i in range(rest // 2):
        step = rng.randrange(0, LAST_STEP)
        every = rng.choice([1, 2, 3, 5, 8, 13, 20, 30, 50, 80, 120, 200])
        cases.append(
            Case(f"in-transaction-{i}", plan={"arm_after": step, "every": every}),
        )
    for i in range(rest - rest // 2):
        cases.append(Case(f"random-delay-{i}", delay=rng.uniform(0.0, 0.35)))
    return cases[:total] if total < len(cases) else cases


def integrity(db: Path) -> str:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


async def after_kill(db: Path) -> tuple[int | None, set[str]]:
    """The committed head's step and the tasks whose writes were saved, as the file holds them."""
    async with SqliteCheckpointer.open(db) as cp:
        tup = await cp.get(worker.THREAD)
    if tup is None:
        return None, set()
    return tup.checkpoint.step, {w.task_id for w in tup.pending_writes if w.channel == "__route__"}


async def final_state(db: Path, log: Path) -> tuple[dict[str, Any], list[int], int, int]:
    async with SqliteCheckpointer.open(db) as cp:
        graph = worker.build_crash_graph(cp, log)
        state = await graph.aget_state(worker.THREAD)
        assert state is not None
        history = await graph.aget_state_history(worker.THREAD)
        tips = await cp.list_tips(worker.THREAD)
        head = await cp.get(worker.THREAD)
        assert head is not None
    steps = [s.step for s in reversed(history)]
    return dict(state.values), steps, len(tips), len(head.pending_writes)


def run_case(case: Case, base: Path, reference: dict[str, Any]) -> Outcome:
    work = base / case.name
    work.mkdir()
    db, log = work / "runs.db", work / "executions.log"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "crash", str(db), str(log), json.dumps(case.plan)],
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
                time.sleep(0.015)  # let the finished tasks' writes reach the file
                break
    proc.kill()
    _, crash_err = proc.communicate()
    problems: list[str] = []
    if proc.returncode not in (-9, 0):
        problems.append(f"crash worker failed ({proc.returncode}): {crash_err}")
    if db.exists() and integrity(db) != "ok":
        problems.append(f"integrity_check after the kill: {integrity(db)}")
    head_step, saved = asyncio.run(after_kill(db)) if db.exists() else (None, set())

    resumed = subprocess.run(
        [sys.executable, str(WORKER), "resume", str(db), str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if resumed.returncode != 0:
        problems.append(f"resume failed: {resumed.stderr}")
        return Outcome(case, proc.returncode, head_step, saved, [], proc.pid, -1, problems)
    resume_pid = -1
    executions = []
    for line in log.read_text().splitlines():
        pid, step, task_id, node = line.split()
        executions.append((int(pid), int(step), task_id, node))
    pids = {e[0] for e in executions} - {proc.pid}
    if len(pids) > 1:
        problems.append(f"executions from unexpected processes: {pids}")
    resume_pid = next(iter(pids), -1)

    values, steps, tips, pending = asyncio.run(final_state(db, log))
    if values != reference:
        diff = {k: (values.get(k), reference.get(k)) for k in reference if k != "blob"}
        problems.append(f"final state differs from an uninterrupted run: {diff}")
    if steps != list(range(LAST_STEP + 1)):
        problems.append(f"history steps {steps}, expected 0..{LAST_STEP} once each")
    if tips != 1:
        problems.append(f"{tips} branch tips: history forked")
    if pending:
        problems.append(f"{pending} pending writes left on the finished head")
    if integrity(db) != "ok":
        problems.append(f"integrity_check after the resume: {integrity(db)}")

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


def test_sigkill_at_many_points_then_resume(tmp_path: Path) -> None:
    ref_log = tmp_path / "reference.log"
    graph = worker.build_crash_graph(InMemoryCheckpointer(), ref_log)
    reference = asyncio.run(graph.ainvoke(worker.INPUT, thread_id=worker.THREAD))
    assert reference["log"][-1] == "s11" and sorted(reference["fan"]) == [0, 1, 2, 3]

    rng = random.Random(int(os.environ.get("GRAPHEXEC_CRASH_SEED", "20240517")))
    cases = plan_cases(KILLS, rng)
    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(lambda c: run_case(c, tmp_path, reference), cases))

    failures = [f"{o.case.name}: {p}" for o in outcomes for p in o.problems]
    assert not failures, "\n".join(failures)

    # The checks above can only fail if the kills really interrupted runs at varied points.
    killed = [o for o in outcomes if o.returncode == -9]
    missed = [o.case.name for o in outcomes if o.returncode != -9 and o.case.delay is None]
    assert not missed, f"these runs finished before their kill: {missed}"
    timed = [o for o in outcomes if o.case.delay is not None]
    assert sum(o.returncode == -9 for o in timed) >= len(timed) // 2
    heads = {o.head_step for o in killed}
    assert len(heads) >= 6, f"kills landed at too few points: {sorted(heads, key=str)}"
    assert any(o.saved_tasks for o in outcomes), "no kill landed after a fan-out task saved"
    rerun = [o for o in outcomes if any(e[0] == o.resume_pid for e in o.executions)]
    assert len(rerun) >= len(cases) // 2
