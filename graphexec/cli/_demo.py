"""``graphexec demo``: the support-ticket scenario end to end, narrated, crash included.

The stages that matter run in separate OS processes (``python -m graphexec.demo STAGE DIR``):
the worker that is killed, the process that resumes, and the one that approves. Time travel
(replay, fork) runs in this process. See :mod:`graphexec.demo` for the graph.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from graphexec.cli._common import EXIT_OK, CliError

__all__ = ["cmd_demo"]

FORK = "ticket-42-casual"


def _say(text: str) -> None:
    print(textwrap.fill(" ".join(text.split()), width=96, subsequent_indent="   "), flush=True)


def _stage(stage: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "graphexec.demo", stage, str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _fail(stage: str, proc: subprocess.CompletedProcess[str]) -> CliError:
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return CliError(f"demo stage {stage!r} ended with status {proc.returncode}: {tail}")


async def cmd_demo(args: argparse.Namespace) -> int:
    """Run the scenario in ``--dir`` and print what happened and how to inspect it."""
    from checkpointers.sqlite import SqliteCheckpointer
    from graphexec.demo import CUSTOMER, THREAD, DemoFiles, build_graph
    from memory.sqlite import SqliteMemory

    root = Path(args.dir)
    files = DemoFiles(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise CliError(
            f"{root} already exists and is not an empty directory; remove it or pass "
            "--dir NEW_DIRECTORY"
        )
    root.mkdir(parents=True, exist_ok=True)
    facts: dict[str, Any] = {}

    print(f"graphexec demo: a support ticket on embedded SQLite, in {root}/\n")
    _say(
        "1. Long-term memory. Last month the customer asked for formal replies; that preference "
        "is a fact in the memory store, which the `policy` node injects into the state as a "
        "summary."
    )
    async with SqliteMemory.open(files.memory) as mem:
        await mem.facts.put(
            ("customers", CUSTOMER),
            "tone",
            "formal, no exclamation marks",
            source="phone call 2026-10-30",
        )
        await mem.facts.put(("customers", CUSTOMER), "language", "English")
        summary = await mem.facts.summary(("customers", CUSTOMER), max_chars=300)
    print(textwrap.indent(summary, "     "))

    _say(
        f"2. A worker process starts thread {THREAD}: classify -> policy -> draft -> crm. It is "
        "killed with SIGKILL right after the `draft` step reaches the disk."
    )
    work = _stage("work", root)
    if work.returncode != -signal.SIGKILL:
        raise _fail("work", work)
    draft_checkpoint = work.stdout.strip().splitlines()[-1]
    drafts = len(files.drafts())
    print(
        f"     the worker died (exit status {work.returncode}) after checkpoint "
        f"{draft_checkpoint}; draft has run {drafts} time"
    )
    facts["killed_after_draft"] = work.returncode == -signal.SIGKILL

    _say(
        "3. A new process resumes the thread. The dead worker's lease expires (1 s in this demo) "
        "and the run continues at `crm`, without re-drafting. `crm` needs a human's approval: "
        "the run pauses and writes a signed RunState for whoever approves."
    )
    resumed = _stage("resume", root)
    if resumed.returncode != 0:
        raise _fail("resume", resumed)
    paused = json.loads(resumed.stdout.strip().splitlines()[-1])
    drafts = len(files.drafts())
    print(
        f"     paused: {paused['kind']} of {paused['node']!r}; draft has still run {drafts} "
        f"time; RunState in {files.run_state.name} ({files.run_state.stat().st_size} bytes)"
    )
    print(f"     the approver sees: {json.dumps(paused['preview'])[:150]}...")
    facts["drafts_after_resume"] = drafts

    _say(
        "4. A second process loads the RunState with to_state()/from_json, approves as "
        "dana@support and continues: `crm` updates the CRM inside ctx.effect, keyed by the "
        "task's idempotency key."
    )
    approved = _stage("approve", root)
    if approved.returncode != 0:
        raise _fail("approve", approved)
    outcome = json.loads(approved.stdout.strip().splitlines()[-1])
    updates = files.crm_updates()
    print(
        f"     run {outcome['status']}; CRM updates: {len(updates)} ({outcome['crm_record']}, "
        f"idempotency key {updates[0]['idempotency_key'][:16]}...)"
    )
    facts["crm_updates"] = len(updates)

    async with SqliteCheckpointer.open(files.checkpoints) as store:
        graph = build_graph(root).with_checkpointer(store)
        try:
            history = await graph.aget_state_history(THREAD)
            decisions = [d for s in history for d in s.metadata.get("decisions", [])]
            original_tip = history[0].checkpoint_id
            policy = next(s for s in history if "policy" in s.metadata.get("writes", {}))
            print(
                f"     approval recorded in the history: {decisions[0]['decision']} of "
                f"{decisions[0]['node']!r} by {decisions[0]['by']}"
            )
            facts["approvals_recorded"] = len(decisions)

            _say(
                f"5. Time travel: replay {THREAD} from the checkpoint after `policy` "
                f"({policy.checkpoint_id}). The replay is a new branch: `draft` runs again "
                "there and `crm` asks for approval again, so the CRM is not touched. We reject "
                "it; the original branch keeps its approved run."
            )
            replay = await graph.arun(None, thread_id=THREAD, checkpoint_id=policy.checkpoint_id)
            state = replay.to_state().reject(0, reason="replay only: already handled", by="demo")
            replay = await graph.arun(state)
            branches = await graph.alist_branches(THREAD)
            print(
                f"     replay {replay.status}; {THREAD} now has {len(branches)} branches; CRM "
                f"updates still {len(files.crm_updates())}; draft calls {len(files.drafts())} "
                "(one per branch)"
            )
            facts["branches"] = len(branches)

            _say(
                f"6. Fork: copy {THREAD} at the same checkpoint into a new thread {FORK}, "
                "change the tone preference there with update_state, and run it. The fork "
                "drafts a casual reply and waits for approval; the original is untouched."
            )
            await graph.afork(THREAD, policy.checkpoint_id, FORK)
            await graph.aupdate_state(FORK, {"preferences": "- tone: casual"})
            forked = await graph.arun(None, thread_id=FORK)
            print(
                f"     {FORK}: {forked.status}, waiting for approval of "
                f"{forked.interruptions[0].node!r}; its draft: {forked.values['reply']!r}"
            )
            facts["fork"] = FORK
            facts["fork_status"] = forked.status
        finally:
            await graph.memory.aclose()

    db = shlex.quote(str(files.checkpoints))
    env = (
        ""
        if root.resolve() == Path("graphexec-demo").resolve()
        else (f"GRAPHEXEC_DEMO_DIR={shlex.quote(str(root))} ")
    )
    g = "--graph graphexec.demo:graph"
    print("\nWhat it left behind, and how to look at it:")
    for line in (
        f"graphexec threads --db {db}",
        f"graphexec history {THREAD} --db {db}",
        f"graphexec history {THREAD} --branches --db {db}",
        f"graphexec history {THREAD} --checkpoint {original_tip} --db {db}",
        f"{env}graphexec show {THREAD} --checkpoint {draft_checkpoint} --diff {g} --db {db}",
        f"{env}graphexec approve {FORK} --by you {g} --db {db}",
        f"graphexec draw graphexec.demo:graph -o {shlex.quote(str(root / 'support.svg'))}",
    ):
        print(f"  {line}")
    return EXIT_OK
