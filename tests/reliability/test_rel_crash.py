"""Crash fuzzing: SIGKILL worker processes at random moments, resume in fresh processes.

For every backend (a SQLite file, a PostgreSQL schema), reference workflow and durability mode,
the driver starts ``rel_worker.py`` on a thread, kills it after a random number of its events
plus a random delay, starts the next generation on the same thread (which resumes it), and so
on until the planned kills are spent and a generation runs the thread to its end. Then:

- the final state (and, for the memory workflow, the facts and session items) equals a
  crash-free run's;
- in ``sync`` mode no step is lost: the stored head is at least the last step a killed worker
  reported committed; in every mode nothing committed is re-executed: no later generation runs
  a task of a step at or before the head it found, nor a task whose writes were saved;
- side effects recorded with ``ctx.effect`` reach the ledger once per idempotency key (a kill
  between the effect and its record may invoke it again with the same key; those are counted);
- no forked history (one tip), no pending writes on the finished head, and the storage passes
  ``PRAGMA integrity_check`` (SQLite) or the orphan/dangling-row checks (PostgreSQL).

A PostgreSQL run queue test kills ``graphexec worker``-style processes draining enqueued runs
and checks that no accepted run is dropped or finished twice.

Kills per (backend, workflow, durability): 2 in the quick profile, 10 in the long one.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import rel_workflows as flows
from rel_backends import Backend, backend_params, make_backend
from rel_support import LONG, SEED, STATS, rng_for

from graphexec import InMemoryCheckpointer

WORKER = Path(__file__).resolve().parent / "rel_worker.py"
KILLS_PER_CASE = int(os.environ.get("GRAPHEXEC_RELIABILITY_KILLS", "10" if LONG else "2"))
MAX_THREADS_PER_CASE = 4 * KILLS_PER_CASE + 2
EVENTS = {"linear": 17, "fanout": 14, "loop": 29, "hitl": 10, "memory": 13}
"""About how many lines a worker prints in one uninterrupted run (kill targets are drawn below)."""


# -- the crash-free reference -------------------------------------------------------------------

_references: dict[str, tuple[dict[str, Any], dict[str, Any] | None, int]] = {}


async def _reference(workflow: str, folder: Path) -> tuple[dict[str, Any], Any, int]:
    from memory import SqliteMemory

    folder.mkdir(parents=True, exist_ok=True)
    async with SqliteMemory.open(folder / "memory.db") as mem:
        graph = flows.build(workflow, InMemoryCheckpointer(), mem, folder)
        values = await flows.drive(graph, "reference", fresh=True)
        contents = await flows.memory_contents(mem) if workflow == "memory" else None
    effects = (
        (folder / "effects.log").read_text().splitlines()
        if (folder / "effects.log").exists()
        else []
    )
    return values, contents, len(effects)


async def reference(workflow: str, folder: Path) -> tuple[dict[str, Any], Any, int]:
    if workflow not in _references:
        _references[workflow] = await _reference(workflow, folder / f"ref-{workflow}")
    return _references[workflow]


# -- one thread, killed again and again -----------------------------------------------------------


@dataclass
class Generation:
    pid: int
    returncode: int
    commits: list[int]
    lines: list[str]
    stderr: str
    head_after: int | None = None
    saved_after: set[str] = field(default_factory=set)


async def _inspect(backend: Backend, thread: str) -> tuple[int | None, set[str]]:
    async with backend.open() as cp:
        tup = await cp.get(thread)
    if tup is None:
        return None, set()
    saved = {w.task_id for w in tup.pending_writes if w.channel == "__route__"}
    return tup.checkpoint.step, saved


def _run_generation(spec: dict[str, Any], kill_after: int | None, delay: float) -> Generation:
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    seen = -1  # READY is event 0
    for raw in proc.stdout:
        line = raw.strip()
        lines.append(line)
        seen += 1
        if kill_after is not None and line != "READY" and seen >= kill_after:
            time.sleep(delay)
            break
        if kill_after is not None and kill_after == 0 and line == "READY":
            time.sleep(delay)
            break
    if kill_after is not None:
        proc.kill()
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err = "TIMEOUT (hang)\n" + err
    lines += [x.strip() for x in out.splitlines()]
    commits = [int(x.split()[1]) for x in lines if x.startswith("COMMIT ")]
    return Generation(proc.pid, proc.returncode, commits, lines, err)


@dataclass
class CaseResult:
    kills: int = 0
    missed: int = 0
    threads: int = 0
    problems: list[str] = field(default_factory=list)


def _check_thread(
    backend: Backend,
    workflow: str,
    durability: str,
    thread: str,
    gens: list[Generation],
    folder: Path,
    ref: tuple[dict[str, Any], Any, int],
) -> list[str]:
    problems: list[str] = []
    where = f"{backend.kind}/{workflow}/{durability}/{thread}"
    # a) nothing committed lost (sync), nothing committed re-executed (every mode)
    executions = []
    log = folder / "exec.log"
    for line in log.read_text().splitlines() if log.exists() else []:
        pid, step, task_id, node = line.split()
        executions.append((int(pid), int(step), task_id, node))
    gen_of = {g.pid: i for i, g in enumerate(gens)}
    for i, g in enumerate(gens[:-1]):
        if g.returncode != -9:
            continue
        if durability == "sync" and g.commits:
            if g.head_after is None or g.head_after < max(g.commits):
                problems.append(
                    f"{where}: generation {i} reported step {max(g.commits)} committed, but the "
                    f"store's head after the kill is step {g.head_after}: a committed step was lost"
                )
        committed = -1 if g.head_after is None else g.head_after
        for pid, step, task_id, node in executions:
            later = gen_of.get(pid)
            if later is None or later <= i:
                continue
            if step <= committed:
                problems.append(
                    f"{where}: {node} (step {step}) ran in generation {later} although step "
                    f"{committed} was committed before generation {i} was killed"
                )
            if task_id in g.saved_after and later == i + 1:
                problems.append(f"{where}: {node} ran again although its writes were saved")
    # b) the end state
    final = gens[-1]
    if final.returncode != 0 or "DONE" not in final.lines:
        problems.append(f"{where}: the last generation failed ({final.returncode}): {final.stderr}")
        return problems

    async def end_state() -> tuple[dict[str, Any], int, list[int], int, Any]:
        from memory import SqliteMemory

        async with backend.open() as cp:
            graph = flows.build(workflow, cp, None, folder)
            state = await graph.aget_state(thread)
            assert state is not None
            tips = len(await cp.list_tips(thread))
            steps = [s.step for s in await graph.aget_state_history(thread)]
            head = await cp.get(thread)
            assert head is not None
        contents = None
        if workflow == "memory":
            async with SqliteMemory.open(folder / "memory.db") as mem:
                contents = await flows.memory_contents(mem)
        return dict(state.values), tips, steps, len(head.pending_writes), contents

    values, tips, steps, pending, contents = asyncio.run(end_state())
    ref_values, ref_contents, ref_effects = ref
    if values != ref_values:
        diff = {k: (values.get(k), ref_values.get(k)) for k in ref_values if k != "messages"}
        problems.append(f"{where}: final state differs from a crash-free run: {diff}")
    if contents != ref_contents:
        # In every mode: a step whose checkpoint was lost re-runs under the same idempotency
        # keys (anchored on durable facts), so memory writes made with op_key do not repeat.
        problems.append(f"{where}: memory differs from a crash-free run: {contents}")
    if tips != 1:
        problems.append(f"{where}: {tips} branch tips: history forked")
    if steps != sorted(set(steps), reverse=True):
        problems.append(f"{where}: history steps {steps} are not one line")
    if pending:
        problems.append(f"{where}: {pending} pending writes left on the finished head")
    # c) effects: once per idempotency key
    ledger = folder / "effects.log"
    entries = (
        [tuple(x.split()[1:]) for x in ledger.read_text().splitlines()] if ledger.exists() else []
    )
    distinct = set(entries)
    kills = sum(g.returncode == -9 for g in gens)
    if len(distinct) != ref_effects:
        problems.append(
            f"{where}: {len(distinct)} distinct effects, a crash-free run makes {ref_effects}"
        )
    again = len(entries) - len(distinct)
    if again > kills:
        problems.append(f"{where}: effects re-invoked {again} times with only {kills} kills")
    STATS.add("effects_deduplicated", again)
    problems += [f"{where}: {p}" for p in backend.integrity_problems()]
    return problems


def run_case(backend: Backend, workflow: str, durability: str, base: Path, ref: Any) -> CaseResult:
    rng = rng_for(f"crash:{backend.kind}:{workflow}:{durability}")
    result = CaseResult()
    while result.kills < KILLS_PER_CASE and result.threads < MAX_THREADS_PER_CASE:
        thread = f"{workflow}-{durability}-{result.threads}"
        result.threads += 1
        folder = base / thread
        folder.mkdir(parents=True)
        spec = {
            "store": backend.spec,
            "workflow": workflow,
            "durability": durability,
            "folder": str(folder),
            "thread": thread,
        }
        gens: list[Generation] = []
        thread_kills = 0
        while True:
            kill = result.kills + thread_kills < KILLS_PER_CASE and len(gens) < 12
            events = (
                EVENTS[workflow] // 2 if durability == "exit" else EVENTS[workflow]
            )  # no COMMITs
            target = rng.randrange(0, events) if kill else None
            g = _run_generation(spec, target, rng.uniform(0, 0.012))
            gens.append(g)
            if g.returncode == -9:
                thread_kills += 1
                STATS.add("kills", kind=f"kills {backend.kind}")
                g.head_after, g.saved_after = asyncio.run(_inspect(backend, thread))
                if backend.kind == "sqlite":  # the file right after the kill, before any resume
                    result.problems += [
                        f"{thread} after kill {thread_kills}: {p}"
                        for p in backend.integrity_problems()
                    ]
                continue
            if kill:
                result.missed += 1
                STATS.add("missed_kills")
            STATS.add("resumes", len(gens) - 1)
            break
        result.kills += thread_kills
        result.problems += _check_thread(backend, workflow, durability, thread, gens, folder, ref)
    return result


@pytest.mark.timeout(900 if LONG else 120)
@pytest.mark.parametrize("workflow", flows.WORKFLOWS)
@pytest.mark.parametrize("kind", backend_params())
async def test_sigkill_and_resume_equals_a_crash_free_run(
    kind: str, workflow: str, tmp_path: Path
) -> None:
    ref = await reference(workflow, tmp_path)
    async with make_backend(kind, tmp_path / "store") as backend:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {
                d: pool.submit(run_case, backend, workflow, d, tmp_path / d, ref)
                for d in flows.DURABILITIES
            }
            results = {d: await asyncio.wrap_future(f) for d, f in futures.items()}
    problems = [p for r in results.values() for p in r.problems]
    if problems:
        STATS.add("lost", len(problems))
    assert not problems, f"seed {SEED}:\n" + "\n".join(problems)
    # The checks above only mean something if the kills really interrupted runs.
    for d, r in results.items():
        assert r.kills >= KILLS_PER_CASE, f"{d}: only {r.kills} kills landed (seed {SEED})"


async def test_memory_writes_of_a_lost_step_are_not_repeated(tmp_path: Path) -> None:
    from memory import SqliteMemory

    ref_values, ref_contents, _ = await reference("memory", tmp_path)
    async with make_backend("sqlite", tmp_path / "store") as backend:
        spec = {
            "store": backend.spec,
            "workflow": "memory",
            "durability": "exit",
            "folder": str(tmp_path),
            "thread": "t",
        }
        first = await asyncio.to_thread(_run_generation, spec, 4, 0.0)  # after m0..m2 ended
        assert first.returncode == -9 and "END m2" in first.lines
        second = await asyncio.to_thread(_run_generation, spec, None, 0.0)
        assert second.returncode == 0, second.stderr
        async with backend.open() as cp:
            state = await flows.build("memory", cp, None, tmp_path).aget_state("t")
        assert state is not None and dict(state.values) == ref_values  # the state is right ...
        async with SqliteMemory.open(tmp_path / "memory.db") as mem:
            contents = await flows.memory_contents(mem)
        assert contents == ref_contents  # ... and m0..m2, run twice, wrote once
