"""An approval round trip across two OS processes on one SQLite file (issue 3's must-show)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from checkpointers import SqliteCheckpointer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "05_human_approval.py"


def _run(*args: str, stdin: str | None = None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_approval_with_edit_across_two_processes(tmp_path: Path) -> None:
    db = tmp_path / "support.db"
    text = _run("run", str(db))  # process 1: stops at the approval, prints the RunState
    body = json.loads(text)["body"]
    assert [i["kind"] for i in body["interruptions"]] == ["approval"]
    assert body["thread_id"] == "T-7" and "signature" in json.loads(text)

    _run("approve", str(db), stdin=text)  # process 2: approve with an edit, finish

    import importlib.util

    spec = importlib.util.spec_from_file_location("approval_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # so the schema's annotations resolve
    spec.loader.exec_module(module)
    graph, store = module.build(db)
    try:
        state = await graph.aget_state("T-7")
        assert state is not None and state.next == ()
        assert state.values["priority"] == "high"  # the edit was applied before crm ran
        assert state.values["log"][-1] == "crm case CASE-1 (high): customer called back"
        decisions = [
            d
            for snap in await graph.aget_state_history("T-7")
            for d in snap.metadata.get("decisions", [])
        ]
        approval = next(d for d in decisions if d["kind"] == "approval")
        assert approval["decision"] == "approve" and approval["by"] == "alice"
        assert approval["edited"] == {"priority": "high"}
    finally:
        await store.aclose()
    assert isinstance(store, SqliteCheckpointer)
    cases = (tmp_path / "crm_cases.txt").read_text().splitlines()
    assert len(cases) == 1  # the CRM side effect happened exactly once
