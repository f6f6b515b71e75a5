"""Concurrency: racing resumers, a paused owner waking after a takeover, double answers, memory.

- 2..16 processes resume one interrupted thread at the same instant (a gate directory releases
  them together): exactly one runs it, the others get ``ThreadBusyError``; one answer, one
  publish, one tip.
- A worker is frozen with SIGSTOP mid-run until its lease expires; another process takes the
  thread over and finishes it; the first is then woken (SIGCONT): its writes are rejected
  (``LeaseLostError``/``CheckpointConflictError``), history does not fork and the final state
  equals a crash-free run.
- An interrupt answered by two callers at once (separate connections): one wins, the other gets
  a clear error; the approved node ran once.
- Memory stores under concurrent writers (separate connections on one database): no lost write,
  versions strictly ordered, and optimistic block edits fail loudly instead of losing updates.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import rel_workflows as flows
import sqlite_worker
from rel_backends import MEMORY_FACTORIES, backend_params, make_backend, memory_params
from rel_support import LONG, STATS

from graphexec import (
    Command,
    InMemoryCheckpointer,
    InvalidResumeError,
    MemoryStoreError,
    ThreadBusyError,
)

HERE = Path(__file__).resolve().parent
REL_WORKER = HERE / "rel_worker.py"
SQLITE_WORKER = Path(sqlite_worker.__file__)
PG_WORKER = SQLITE_WORKER.parent / "pg_worker.py"


def run_at_gate(gate: Path, commands: Sequence[list[str]], *, timeout: float = 90) -> list[Any]:
    """Start the workers, open the gate once all are ready, return each one's JSON line."""
    gate.mkdir()
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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


RACERS = [2, 4, 8, 16] if LONG else [2, 16]


@pytest.mark.parametrize("racers", RACERS)
@pytest.mark.parametrize("kind", backend_params())
async def test_many_processes_race_to_resume_one_thread(
    kind: str, racers: int, tmp_path: Path
) -> None:
    if kind == "postgres" and not LONG and racers > 8:
        racers = 8  # 16 connecting processes cost ~10 s of this 2-core machine's CI budget
    async with make_backend(kind, tmp_path) as backend:
        async with backend.open() as cp:
            graph = sqlite_worker.build_review_graph(cp)
            first = await graph.arun(
                {"draft": "notes", "approvals": [], "published": []}, thread_id="review"
            )
            assert first.status == "interrupted"
        gate = tmp_path / "gate"
        if kind == "sqlite":
            base = [sys.executable, str(SQLITE_WORKER), "race", backend.spec["db"], str(gate)]
        else:
            spec = backend.spec
            base = [sys.executable, str(PG_WORKER), "race", spec["dsn"], spec["schema"], str(gate)]
        results = await asyncio.to_thread(
            run_at_gate, gate, [[*base, str(i)] for i in range(racers)]
        )
        outcomes = sorted(r["outcome"] for r in results)
        assert outcomes == ["busy"] * (racers - 1) + ["ran"], results
        STATS.add("hostile", racers - 1, kind="concurrent resumers refused")
        async with backend.open() as cp:
            graph = sqlite_worker.build_review_graph(cp)
            state = await graph.aget_state("review")
            assert state is not None
            assert len(state.values["approvals"]) == 1 and len(state.values["published"]) == 1
            assert len(await cp.list_tips("review")) == 1, "history forked"
        assert backend.integrity_problems() == []


async def _reference_linear(folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    graph = flows.build("linear", InMemoryCheckpointer(), None, folder)
    return await flows.drive(graph, "ref", fresh=True)


@pytest.mark.parametrize("kind", backend_params())
async def test_a_paused_owner_waking_after_a_takeover_is_rejected(
    kind: str, tmp_path: Path
) -> None:
    reference = await _reference_linear(tmp_path / "ref")
    async with make_backend(kind, tmp_path / "store") as backend:
        spec = {
            "store": backend.spec,
            "workflow": "linear",
            "durability": "sync",
            "folder": str(tmp_path),
            "thread": "t",
            "nap_scale": 25.0,
        }
        # stderr goes to a file and stdout is read through one file object only: reading it
        # by line iteration and then by communicate() (which reads the raw descriptor) can
        # lose lines the iteration had buffered.
        stderr_file = (tmp_path / "sleeper.stderr").open("w")
        sleeper = subprocess.Popen(
            [sys.executable, str(REL_WORKER), json.dumps(spec)],
            stdout=subprocess.PIPE,
            stderr=stderr_file,
            text=True,
        )
        assert sleeper.stdout is not None
        seen: list[str] = []
        for line in sleeper.stdout:
            seen.append(line.strip())
            if line.strip() == "COMMIT 3":
                break
        os.kill(sleeper.pid, signal.SIGSTOP)  # frozen mid-run: no heartbeat, lease expires
        try:
            spec["nap_scale"] = 1.0
            rescuer = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, str(REL_WORKER), json.dumps(spec)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert rescuer.returncode == 0 and "DONE" in rescuer.stdout, rescuer.stderr
        finally:
            os.kill(sleeper.pid, signal.SIGCONT)
        rest = await asyncio.to_thread(sleeper.stdout.read)
        await asyncio.to_thread(sleeper.wait, 60)
        sleeper.stdout.close()
        stderr_file.close()
        lines = seen + rest.strip().splitlines()
        err = (tmp_path / "sleeper.stderr").read_text()
        assert sleeper.returncode == 3, (sleeper.returncode, lines, err)
        assert lines[-1].split()[:2] in (
            ["ERROR", "LeaseLostError"],
            ["ERROR", "CheckpointConflictError"],
        ), (lines, err)
        STATS.add("hostile", kind="stale owners rejected")
        async with backend.open() as cp:
            graph = flows.build("linear", cp, None, tmp_path)
            state = await graph.aget_state("t")
            assert state is not None and dict(state.values) == reference
            assert len(await cp.list_tips("t")) == 1, "history forked"
            steps = [s.step for s in await graph.aget_state_history("t")]
            assert steps == sorted(set(steps), reverse=True)
        assert backend.integrity_problems() == []


@pytest.mark.parametrize("how", ["command", "run-state"])
@pytest.mark.parametrize("kind", backend_params())
async def test_an_interrupt_answered_twice_at_once_has_one_winner(
    kind: str, how: str, tmp_path: Path
) -> None:
    async with make_backend(kind, tmp_path) as backend:
        async with backend.open() as cp1, backend.open() as cp2:
            g1 = sqlite_worker.build_review_graph(cp1)
            g2 = sqlite_worker.build_review_graph(cp2)
            first = await g1.arun(
                {"draft": "notes", "approvals": [], "published": []}, thread_id="review"
            )
            assert first.status == "interrupted"
            if how == "command":
                answers: list[Any] = [Command(resume="yes from 1"), Command(resume="yes from 2")]
                calls = [
                    g.arun(a, thread_id="review") for g, a in zip((g1, g2), answers, strict=True)
                ]
            else:
                s1 = first.to_state().resume(0, "yes from 1")
                s2 = first.to_state().resume(0, "yes from 2")
                calls = [g1.arun(s1), g2.arun(s2)]
            results = await asyncio.gather(*calls, return_exceptions=True)
            won = [r for r in results if not isinstance(r, BaseException)]
            lost = [r for r in results if isinstance(r, BaseException)]
            assert len(won) == 1 and won[0].status == "done", results
            assert len(lost) == 1 and isinstance(lost[0], (ThreadBusyError, InvalidResumeError))
            assert "review" in str(lost[0])
            STATS.add("hostile", kind="double answers refused")
            state = await g1.aget_state("review")
            assert state is not None
            assert len(state.values["approvals"]) == 1 and len(state.values["published"]) == 1
            assert len(await cp1.list_tips("review")) == 1
            with pytest.raises(InvalidResumeError):  # and it cannot be answered again later
                await g2.arun(Command(resume="late"), thread_id="review")


WRITERS = 8
PER_WRITER = 25 if LONG else 12


@pytest.mark.parametrize("factory", memory_params())
async def test_memory_stores_under_concurrent_writers(factory: str, tmp_path: Path) -> None:
    from memory import Block

    async def writer(i: int) -> tuple[int, int]:
        async with MEMORY_FACTORIES[factory](tmp_path) as mem:
            appended = conflicts = 0
            for j in range(PER_WRITER):
                await mem.facts.put(("shared",), "counter", {"w": i, "j": j}, source=f"w{i}")
                await mem.facts.put(("w", str(i)), f"k{j}", j)
                await mem.session("shared").add_items([{"role": "user", "content": f"{i}:{j}"}])
                block = await mem.blocks.get("log")
                assert block is not None
                try:
                    await mem.blocks.append("log", f"{i}:{j}", expected_version=block.version)
                    appended += 1
                except MemoryStoreError as e:
                    assert "another writer changed it" in str(e)
                    conflicts += 1
            return appended, conflicts

    async with MEMORY_FACTORIES[factory](tmp_path) as mem:
        await mem.blocks.create(Block("log", "", limit=100_000))
    results = await asyncio.gather(*(writer(i) for i in range(WRITERS)))
    appended = sum(a for a, _ in results)
    async with MEMORY_FACTORIES[factory](tmp_path) as mem:
        history = await mem.facts.history(("shared",), "counter")
        assert [v.version for v in history] == list(range(1, WRITERS * PER_WRITER + 1))
        for i in range(WRITERS):
            facts = await mem.facts.list(("w", str(i)))
            assert sorted(f.value for f in facts) == list(range(PER_WRITER))
        items = await mem.session("shared").get_items()
        assert len(items) == WRITERS * PER_WRITER
        for i in range(WRITERS):  # each writer's items in its own order
            mine = [
                int(x["content"].split(":")[1]) for x in items if x["content"].startswith(f"{i}:")
            ]
            assert mine == list(range(PER_WRITER))
        block = await mem.blocks.get("log")
        assert block is not None
        assert block.version == 1 + appended  # every accepted append landed, none was lost
        assert len([x for x in block.value.split("\n") if x]) == appended
    STATS.add("hostile", sum(c for _, c in results), kind="memory write conflicts refused")
