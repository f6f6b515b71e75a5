"""What ``ctx.effect`` guarantees across a real SIGKILL, as its docstring and the README say.

A worker process runs a one-node graph on SQLite whose node calls ``ctx.effect("charge", fn)``;
``fn`` appends the task's idempotency key to a ledger file. The worker kills itself with SIGKILL
either inside ``fn`` (after the charge, before its result is recorded) or in the node after
``effect`` returned; a fresh process then resumes the thread.

- killed inside the effect: the effect runs again, with the same idempotency key (at least once);
- killed after it: the recorded result is reused and the ledger holds one charge (exactly once).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    from typing import TypedDict

    from checkpointers import SqliteCheckpointer
    from graphexec import END, START, NodeContext, StateGraph

    db, ledger, kill = sys.argv[1], sys.argv[2], sys.argv[3]


    class S(TypedDict, total=False):
        receipt: str


    def pay(state: S, ctx: NodeContext) -> dict:
        def charge() -> str:
            with open(ledger, "a") as f:
                f.write(ctx.idempotency_key + "\\n")
            if kill == "inside":
                os.kill(os.getpid(), signal.SIGKILL)
            return "receipt-1"

        receipt = ctx.effect("charge", charge)
        if kill == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"receipt": receipt}


    b = StateGraph(S)
    b.add_node("pay", pay)
    b.add_edge(START, "pay")
    b.add_edge("pay", END)
    graph = b.compile(checkpointer=SqliteCheckpointer(db))
    graph.lease_ttl = 0.5  # the killed run's lease lapses soon; the resume waits it out
    first = kill != "no"
    out = graph.invoke({} if first else None, thread_id="t", on_busy="wait")
    print(out["receipt"])
    """
)


def _run(tmp_path: Path, kill: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "runs.db"), str(tmp_path / "ledger"), kill],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("kill", "charges"), [("inside", 2), ("after", 1)])
def test_effect_across_a_sigkill(tmp_path: Path, kill: str, charges: int) -> None:
    crashed = _run(tmp_path, kill)
    assert crashed.returncode == -9, crashed.stderr
    resumed = _run(tmp_path, "no")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == "receipt-1"
    keys = (tmp_path / "ledger").read_text().splitlines()
    assert len(keys) == charges
    assert len(set(keys)) == 1  # a repeat carries the same key, so the other system can drop it
