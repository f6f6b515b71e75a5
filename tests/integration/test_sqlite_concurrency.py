"""Several processes on one SQLite file: no "database is locked", and no forked history."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlite_worker as worker

from checkpointers import SqliteCheckpointer

WORKER = Path(worker.__file__)


def run_at_gate(gate: Path, commands: Sequence[list[str]], *, timeout: float = 90) -> list[Any]:
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


async def test_four_processes_times_fifty_runs_on_one_file(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    results = run_at_gate(
        tmp_path / "gate",
        [["runs", str(db), str(tmp_path / "gate"), str(i), "50"] for i in range(4)],
    )
    errors = [e for r in results for e in r["errors"]]
    assert errors == []
    assert sum(r["done"] for r in results) == 200
    async with SqliteCheckpointer.open(db) as cp:
        threads = await cp.list_threads()
        assert len(threads) == 200
        assert {t.thread_id for t in threads} == {f"p{i}-t{j}" for i in range(4) for j in range(50)}
        assert all(t.next_nodes == () and t.checkpoints == 4 for t in threads)
        graph = worker.build_count_graph(cp)
        state = await graph.aget_state("p3-t49")
        assert state is not None and state.values == {"n": 3, "log": ["c0", "c1", "c2"]}


async def test_racing_resumes_of_an_interrupted_thread_have_one_winner(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    async with SqliteCheckpointer.open(db) as cp:
        graph = worker.build_review_graph(cp)
        first = await graph.arun(
            {"draft": "release notes", "approvals": [], "published": []}, thread_id="review"
        )
        assert first.status == "interrupted"
        before = await cp.get("review")
        assert before is not None

    results = run_at_gate(
        tmp_path / "gate", [["race", str(db), str(tmp_path / "gate"), str(i)] for i in range(4)]
    )

    outcomes = sorted(r["outcome"] for r in results)
    assert outcomes == ["busy", "busy", "busy", "ran"], results
    [winner] = [r for r in results if r["outcome"] == "ran"]
    assert winner["status"] == "done"
    async with SqliteCheckpointer.open(db) as cp:
        graph = worker.build_review_graph(cp)
        state = await graph.aget_state("review")
        assert state is not None
        assert len(state.values["approvals"]) == 1
        assert len(state.values["published"]) == 1
        tips = await cp.list_tips("review")
        assert len(tips) == 1, "history forked"
        history = await graph.aget_state_history("review")
        steps = [s.step for s in history]
        assert steps == sorted(steps, reverse=True) and len(set(steps)) == len(steps)
        assert before.checkpoint.checkpoint_id in {s.checkpoint_id for s in history}
