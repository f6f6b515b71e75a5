"""The reference scenario of the README and of ``graphexec demo``: a support-ticket workflow.

``classify -> policy -> draft -> crm`` over one thread per ticket, on embedded SQLite:

- ``policy`` reads the customer's long-term facts (a tone preference) from memory and injects
  them into the state as a summary;
- ``draft`` writes the reply (a deterministic stand-in for an LLM call) and counts its calls in
  ``draft_calls.log``, so a re-draft after a crash would show;
- ``crm`` needs a human's approval, then updates the (fake, file-based) CRM inside
  ``ctx.effect`` with the task's idempotency key, so a re-run of the node reuses the recorded
  update (only a crash inside the update itself could repeat it, with the same key in the
  record, for a real CRM to drop).

Everything lives in one directory (:class:`DemoFiles`): ``graphexec.db`` (checkpoints),
``memory.db`` (facts), ``crm.jsonl`` (the CRM's records) and ``draft_calls.log``.

The ``graph`` attribute is a factory the command line can load after the demo, for example
``graphexec show ticket-42 --graph graphexec.demo:graph --db graphexec-demo/graphexec.db``; it
finds the directory through ``GRAPHEXEC_DEMO_DIR`` (default ``./graphexec-demo``).

``python -m graphexec.demo STAGE DIR`` runs one stage of the demo in its own process (the demo
command starts these); the stages are ``work``, ``resume`` and ``approve``.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

from checkpointers.sqlite import SqliteCheckpointer
from graphexec._builder import StateGraph
from graphexec._checkpoint import Checkpoint, Lease
from graphexec._context import NodeContext
from graphexec._graph import CompiledGraph
from graphexec._hitl import RunState
from graphexec._types import END, START

__all__ = [
    "CUSTOMER",
    "SIGNING_KEY",
    "THREAD",
    "DemoFiles",
    "Ticket",
    "build_graph",
    "graph",
]

THREAD = "ticket-42"
"""The demo's ticket thread."""

CUSTOMER = "cust-7"
"""The customer who wrote the ticket; their facts live in namespace ``("customers", CUSTOMER)``."""

SIGNING_KEY = "graphexec-demo-key"
"""HMAC key of the RunState passed between the demo's processes (use a real secret in real use)."""

DIR_VARIABLE = "GRAPHEXEC_DEMO_DIR"

POLICIES = {
    "refund": "Refunds within 30 days of delivery; offer a prepaid return label.",
    "delivery": "Late parcels: give the tracking link and a delivery estimate.",
    "other": "Answer the question; escalate anything about safety.",
}


class Ticket(TypedDict, total=False):
    """The workflow's state."""

    ticket_id: str
    customer: str
    message: str
    category: str
    policy: str
    preferences: str
    reply: str
    crm_record: str
    log: Annotated[list[str], operator.add]


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """Where one demo directory keeps its files."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        """The checkpoint database (what ``--db`` points at)."""
        return self.root / "graphexec.db"

    @property
    def memory(self) -> Path:
        """The memory database (long-term facts)."""
        return self.root / "memory.db"

    @property
    def crm(self) -> Path:
        """The fake CRM: one JSON line per update it received."""
        return self.root / "crm.jsonl"

    @property
    def draft_calls(self) -> Path:
        """One line per call of the ``draft`` node's function."""
        return self.root / "draft_calls.log"

    @property
    def run_state(self) -> Path:
        """The signed RunState handed from the resuming process to the approving one."""
        return self.root / "approval.json"

    def crm_updates(self) -> list[dict[str, Any]]:
        """Every update the fake CRM received, oldest first."""
        if not self.crm.exists():
            return []
        return [json.loads(line) for line in self.crm.read_text().splitlines() if line]

    def drafts(self) -> list[str]:
        """Every recorded ``draft`` call (``thread step`` per line)."""
        if not self.draft_calls.exists():
            return []
        return self.draft_calls.read_text().splitlines()


def _classify(state: Ticket) -> dict[str, Any]:
    text = state["message"].lower()
    category = next((c for c in ("refund", "delivery") if c in text), "other")
    return {"category": category, "log": [f"classified as {category}"]}


async def _policy(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
    summary = ""
    if ctx.memory is not None:
        summary = await ctx.memory.facts.summary(("customers", state["customer"]), max_chars=300)
    return {
        "policy": POLICIES[state["category"]],
        "preferences": summary,
        "log": ["policy and customer preferences loaded"],
    }


def _compose(state: Ticket) -> str:
    formal = "formal" in state.get("preferences", "")
    greeting = "Dear customer," if formal else "Hi there!"
    closing = "Kind regards, Support" if formal else "Cheers, the support team"
    return f"{greeting} {state['policy']} {closing}"


def build_graph(root: str | os.PathLike[str], *, memory: Any = None) -> CompiledGraph[Ticket]:
    """The support-ticket graph whose side files live in ``root``.

    Args:
        root: The demo directory (see :class:`DemoFiles`).
        memory: The memory object nodes read facts from (``ctx.memory``); ``None`` opens
            ``root/memory.db`` lazily.

    Returns:
        The compiled graph, named ``support``, without a checkpointer (the caller attaches one
        with ``with_checkpointer``, as the command line does).
    """
    files = DemoFiles(Path(root))
    if memory is None:
        from memory.sqlite import SqliteMemory

        memory = SqliteMemory(files.memory)

    def draft(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
        with files.draft_calls.open("a") as f:
            f.write(f"{ctx.thread_id} step {ctx.step}\n")
        return {"reply": _compose(state), "log": ["reply drafted"]}

    def update_crm(state: Ticket, key: str) -> str:
        record = {"ticket": state["ticket_id"], "reply": state["reply"], "idempotency_key": key}
        with files.crm.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return f"CRM-{len(files.crm_updates())}"

    def crm(state: Ticket, ctx: NodeContext) -> dict[str, Any]:
        record = ctx.effect("crm_update", lambda: update_crm(state, ctx.idempotency_key))
        return {"crm_record": record, "log": [f"CRM updated ({record})"]}

    b = StateGraph(Ticket)
    b.add_node("classify", _classify)
    b.add_node("policy", _policy)
    b.add_node("draft", draft)
    b.add_node("crm", crm, needs_approval=True, preview=["ticket_id", "category", "reply"])
    b.add_edge(START, "classify")
    b.add_sequence(["classify", "policy", "draft", "crm"])
    b.add_edge("crm", END)
    return b.compile(memory=memory, name="support", lease_ttl=1.0)


def graph() -> CompiledGraph[Ticket]:
    """The demo graph for the command line: its directory is ``$GRAPHEXEC_DEMO_DIR``."""
    return build_graph(os.environ.get(DIR_VARIABLE, "graphexec-demo"))


def first_input(ticket_id: str = THREAD) -> dict[str, Any]:
    """The ticket the demo starts with."""
    return {
        "ticket_id": ticket_id,
        "customer": CUSTOMER,
        "message": "My parcel arrived broken, I would like a refund.",
        "log": [],
    }


class _CrashAfter(SqliteCheckpointer):
    """A checkpointer that kills its own process (SIGKILL) once ``node``'s step is on disk.

    A real crash at a chosen point: nothing in the process runs after the kill, no ``finally``,
    no lease release, no connection close.
    """

    def __init__(self, path: Path, node: str) -> None:
        super().__init__(path)
        self._node = node

    async def put(
        self, checkpoint: Checkpoint, *, expected_head: str | None, lease: Lease | None = None
    ) -> None:
        await super().put(checkpoint, expected_head=expected_head, lease=lease)
        writes: Mapping[str, Any] = checkpoint.metadata.get("writes", {})
        if self._node in writes:
            sys.stdout.write(f"{checkpoint.checkpoint_id}\n")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)


async def _stage_work(files: DemoFiles) -> None:
    store = _CrashAfter(files.checkpoints, "draft")
    g = build_graph(files.root).with_checkpointer(store)
    await g.arun(first_input(), thread_id=THREAD, metadata={"graph": "graphexec.demo:graph"})
    raise SystemExit("the work stage should have been killed after draft")  # pragma: no cover


async def _stage_resume(files: DemoFiles) -> None:
    async with SqliteCheckpointer.open(files.checkpoints) as store:
        g = build_graph(files.root).with_checkpointer(store)
        try:
            result = await g.arun(None, thread_id=THREAD, on_busy="wait")
        finally:
            await g.memory.aclose()
        if result.status != "interrupted":
            raise SystemExit(f"expected a pause for approval, the run ended {result.status}")
        files.run_state.write_text(result.to_state().to_json(key=SIGNING_KEY))
        (pending,) = result.interruptions
        print(json.dumps({"node": pending.node, "kind": pending.kind, "preview": pending.value}))


async def _stage_approve(files: DemoFiles) -> None:
    async with SqliteCheckpointer.open(files.checkpoints) as store:
        g = build_graph(files.root).with_checkpointer(store)
        try:
            state = RunState.from_json(files.run_state.read_text(), g, key=SIGNING_KEY)
            state.approve(0, by="dana@support")
            result = await g.arun(state)
        finally:
            await g.memory.aclose()
        print(json.dumps({"status": result.status, "crm_record": result.values["crm_record"]}))


_STAGES = {"work": _stage_work, "resume": _stage_resume, "approve": _stage_approve}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in _STAGES:
        sys.exit(f"usage: python -m graphexec.demo {{{'|'.join(_STAGES)}}} DIR")
    asyncio.run(_STAGES[sys.argv[1]](DemoFiles(Path(sys.argv[2]))))
