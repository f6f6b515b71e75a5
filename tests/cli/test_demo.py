"""``graphexec demo`` in a fresh directory: what it claims is what the files and database show."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from checkpointers.sqlite import SqliteCheckpointer
from graphexec.demo import THREAD, DemoFiles

SCRIPT = Path(sys.executable).with_name("graphexec")


def graphexec(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [str(SCRIPT), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert proc.returncode == 0, (argv, proc.stdout, proc.stderr)
    return proc.stdout


async def _decisions(db: Path) -> list[tuple[str, str]]:
    """(decision, by) of every decision on every branch tip of the demo thread."""
    async with SqliteCheckpointer.open(db) as store:
        tips = await store.list_tips(THREAD)
    return sorted((d["decision"], d["by"]) for cp in tips for d in cp.metadata["decisions"])


def test_demo_does_what_it_says(tmp_path: Path) -> None:
    out = graphexec(tmp_path, "demo")
    files = DemoFiles(tmp_path / "graphexec-demo")

    # a real SIGKILL right after draft, then a resume that did not re-draft
    assert "the worker died (exit status -9) after checkpoint" in out
    assert "draft has run 1 time" in out
    assert "draft has still run 1 time" in out
    # the approval, in another process, and one CRM update
    assert "run done; CRM updates: 1" in out
    assert "approve of 'crm' by dana@support" in out
    assert len(files.crm_updates()) == 1
    # replay: a second branch, the CRM untouched; fork: a new thread waiting for approval
    assert "replay rejected; ticket-42 now has 2 branches; CRM updates still 1" in out
    assert "ticket-42-casual: interrupted, waiting for approval of 'crm'" in out
    # the tone fact was injected (formal reply on the original, casual on the fork)
    assert files.crm_updates()[0]["reply"].startswith("Dear customer,")

    assert asyncio.run(_decisions(files.checkpoints)) == [
        ("approve", "dana@support"),
        ("reject", "demo"),
    ]
    threads = json.loads(graphexec(tmp_path, "threads", "--db", str(files.checkpoints), "--json"))
    assert {t["thread_id"] for t in threads} == {THREAD, "ticket-42-casual"}

    # every command it prints works as printed; approving the fork is the second CRM update
    commands = [
        line.strip() for line in out.split("how to look at it:")[1].splitlines() if line.strip()
    ]
    assert len(commands) == 7
    for line in commands:
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-"))
        argv = [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]
        assert argv[0] == "graphexec"
        graphexec(tmp_path, *argv[1:], env=env)
    assert len(files.crm_updates()) == 2
    assert files.crm_updates()[1]["reply"].startswith("Hi there!")
    assert (files.root / "support.svg").read_text().startswith("<svg")


def test_demo_refuses_a_used_directory(tmp_path: Path) -> None:
    (tmp_path / "graphexec-demo").mkdir()
    (tmp_path / "graphexec-demo" / "keep.txt").write_text("mine")
    proc = subprocess.run(
        [str(SCRIPT), "demo"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    assert "not an empty directory" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "graphexec-demo").iterdir()) == ["keep.txt"]
