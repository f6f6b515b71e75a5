"""Human approval across two OS processes, on a durable SQLite file.

What it shows:

- Process 1 runs a support-ticket workflow until its ``crm`` node, which ``needs_approval``:
  the run pauses with an approval ``Interruption`` whose preview is the slice of state the node
  will act on. It prints ``result.to_state().to_json(key=...)``: a signed, portable RunState.
- Process 2 (a fresh interpreter) loads that text with ``RunState.from_json(text, graph,
  key=...)``, approves with an edit (``priority="high"``) on behalf of "alice", and continues the
  run with ``graph.run(state)``. The edit is applied before ``crm`` runs.
- ``crm`` opens a CRM case inside ``ctx.effect``, then asks (``interrupt``) for a note to attach.
  Answering re-runs the node from its top, but the case is opened exactly once (a counter file
  kept by the fake CRM proves it). That last run is streamed with ``graph.run_streamed``: its
  updates as they happen, then its ``RunResult``.
- ``get_state_history`` shows the decision (who, what, when) in the checkpoint metadata, and a
  tampered RunState is refused.

Run it (offline; uses a temporary directory)::

    python examples/05_human_approval.py
"""

from __future__ import annotations

import asyncio
import json
import operator
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, TypedDict

from checkpointers import SqliteCheckpointer
from graphexec import (
    END,
    START,
    Command,
    CompiledGraph,
    InvalidResumeError,
    NodeContext,
    RunState,
    StateGraph,
    interrupt,
)

KEY = "demo-signing-key"  # in real use: a secret from your configuration


class Ticket(TypedDict):
    ticket_id: str
    message: str
    priority: str
    reply: str
    log: Annotated[list[str], operator.add]


def classify(state: Ticket) -> dict[str, Any]:
    urgent = "refund" in state["message"].lower()
    return {"priority": "medium" if urgent else "low", "log": ["classified"]}


def draft(state: Ticket) -> dict[str, Any]:
    return {"reply": f"Hello! About ticket {state['ticket_id']}: we are on it.", "log": ["drafted"]}


def build(db: Path) -> tuple[CompiledGraph[Ticket], SqliteCheckpointer]:
    counter = db.parent / "crm_cases.txt"

    def open_case(ticket: str, priority: str, key: str) -> str:
        # The "external system": appends one line per case actually opened.
        with counter.open("a") as f:
            f.write(f"{ticket} {priority} {key}\n")
        return f"CASE-{sum(1 for _ in counter.open())}"

    def crm(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
        case = ctx.effect(
            "open_case",
            lambda: open_case(state["ticket_id"], state["priority"], ctx.idempotency_key),
        )
        note = interrupt({"question": f"note to attach to {case}?"})
        return {"log": [f"crm case {case} ({state['priority']}): {note}"]}

    b = StateGraph(Ticket)
    b.add_node("classify", classify)
    b.add_node("draft", draft)
    b.add_node("crm", crm, needs_approval=True, preview=["ticket_id", "priority", "reply"])
    b.add_edge(START, "classify")
    b.add_sequence(["classify", "draft", "crm"])
    b.add_edge("crm", END)
    store = SqliteCheckpointer(db)
    return b.compile(checkpointer=store, name="support"), store


async def part_run(db: Path) -> None:
    """Process 1: run until the approval and print the signed RunState."""
    graph, store = build(db)
    try:
        result = await graph.arun(
            {"ticket_id": "T-7", "message": "Refund please", "log": []}, thread_id="T-7"
        )
        print(result.to_state().to_json(key=KEY))
    finally:
        await store.aclose()


async def part_approve(db: Path, text: str) -> None:
    """Process 2: load the RunState, approve with an edit, continue, report."""
    graph, store = build(db)
    try:
        tampered = text.replace('"priority": "medium"', '"priority": "low"')
        try:
            RunState.from_json(tampered, graph, key=KEY)
        except InvalidResumeError as e:
            print(f"  a tampered state is refused: {str(e).split(':')[0]}")
        state = RunState.from_json(text, graph, key=KEY)
        (pending,) = state.pending
        print(f"  pending: {pending.kind} of {pending.node!r}, preview {pending.value}")
        state.approve(pending, edited={"priority": "high"}, by="alice")
        result = await graph.arun(state)
        (question,) = result.interruptions
        print(f"  approved; crm now asks: {question.value['question']}")
        # The answer's run, streamed: its updates as they happen, then its RunResult.
        run = graph.run_streamed(
            Command(resume="customer called back"), mode="updates", thread_id="T-7"
        )
        async for update in run:
            print(f"  streamed: {', '.join(update)} finished")
        result = run.result
        print(f"  status: {result.status}; log: {result.values['log']}")
        for snap in await graph.aget_state_history("T-7"):
            for d in snap.metadata.get("decisions", []):
                edited = d.get("edited", {})
                print(
                    f"  decision recorded at step {snap.step}: {d['kind']} -> {d['decision']} "
                    f"by {d['by']}" + (f", edited {edited}" if edited else "")
                )
    finally:
        await store.aclose()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "support.db"
        me = [sys.executable, __file__]
        print("process 1: run the ticket until the CRM update needs approval")
        first = subprocess.run([*me, "run", str(db)], capture_output=True, text=True, check=True)
        text = first.stdout
        body = json.loads(text)["body"]
        print(
            f"  paused at {body['interruptions'][0]['node']!r}; RunState is "
            f"{len(text)} bytes of signed JSON"
        )
        print("process 2: a human approves, raising the priority")
        second = subprocess.run(
            [*me, "approve", str(db)], input=text, capture_output=True, text=True, check=True
        )
        print(second.stdout.rstrip())
        cases = (Path(tmp) / "crm_cases.txt").read_text().splitlines()
        print(f"CRM cases opened: {len(cases)} (priority {cases[0].split()[1]})")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "run":
        asyncio.run(part_run(Path(sys.argv[2])))
    elif len(sys.argv) == 3 and sys.argv[1] == "approve":
        asyncio.run(part_approve(Path(sys.argv[2]), sys.stdin.read()))
    else:
        main()
