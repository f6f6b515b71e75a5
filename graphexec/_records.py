"""What a task leaves in its checkpoint's pending writes, encoded and decoded.

Besides its channel updates, a task that finished while others of its step still ran stores
its routes; an interrupted task stores its interrupts, and later the answers to them; a failed
attempt stores its count; an effect stores its result. :func:`decode_records` groups a
checkpoint's pending writes back into one :class:`~graphexec._tasks.TaskRecord` per task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from graphexec._checkpoint import CheckpointTuple
from graphexec._hitl import Answer
from graphexec._serde import Serializer
from graphexec._tasks import (
    AFTER,
    ATTEMPT,
    EFFECT,
    INTERRUPT,
    RESUME,
    ROUTE,
    UPDATES,
    Frontier,
    Outcome,
    TaskRecord,
)
from graphexec._types import Interruption, Send

__all__ = [
    "decode_answers",
    "decode_records",
    "encode_answers",
    "encode_interrupts",
    "encode_route",
    "public_interrupt",
]


def encode_route(serde: Serializer, outcome: Outcome) -> bytes:
    """A finished task's routes and edge flags (its ``__route__`` write)."""
    routes = [["n", r] if isinstance(r, str) else ["s", r.node, r.arg] for r in outcome.routes]
    data = {"r": routes, "e": outcome.follow_edges, "x": outcome.rejected}
    return serde.dumps(data, channel=ROUTE)


def encode_interrupts(serde: Serializer, interruptions: Sequence[Interruption]) -> bytes:
    """A task's interrupts (its ``__interrupt__`` write)."""
    data = [
        {"id": i.id, "node": i.node, "kind": i.kind, "value": i.value, "created_at": i.created_at}
        for i in interruptions
    ]
    return serde.dumps(data, channel=INTERRUPT)


def public_interrupt(i: Interruption) -> dict[str, Any]:
    """An interrupt as the ``events`` stream shows it."""
    return {"id": i.id, "node": i.node, "kind": i.kind, "value": i.value}


def encode_answers(serde: Serializer, rec: TaskRecord) -> bytes:
    """The answers a task's interrupts received so far (its ``__resume__`` write)."""
    data = {
        iid: {**a.to_data(), "node": rec.answer_info[iid][0], "kind": rec.answer_info[iid][1]}
        for iid, a in rec.answers.items()
    }
    return serde.dumps(data, channel=RESUME)


def decode_answers(
    serde: Serializer, blob: bytes
) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """Decode a ``__resume__`` write into answers and their (node, kind)."""
    data: Mapping[str, Any] = serde.loads(blob, channel="__resume__")
    answers = {iid: Answer.from_data(a) for iid, a in data.items()}
    info = {iid: (a["node"], a["kind"]) for iid, a in data.items()}
    return answers, info


def decode_records(
    serde: Serializer, tup: CheckpointTuple, frontier: Frontier
) -> dict[str, TaskRecord]:
    """Group a checkpoint's pending writes into per-task records."""
    by_task: dict[str, dict[str, bytes]] = {}
    for w in tup.pending_writes:
        by_task.setdefault(w.task_id, {})[w.channel] = w.data
    tasks = {t.task_id: t for t in frontier.tasks}
    records: dict[str, TaskRecord] = {}
    for task_id, chans in by_task.items():
        task = tasks.get(task_id)
        if task is None and task_id != AFTER:
            continue  # writes of a task the frontier no longer has (graph changed)
        rec = TaskRecord()
        if task is not None and ROUTE in chans:
            pairs = serde.loads(chans.get(UPDATES, serde.dumps([])), channel=UPDATES)
            writes = [(ch, serde.loads(blob, channel=ch), blob) for ch, blob in pairs]
            route = serde.loads(chans[ROUTE], channel=ROUTE)
            routes: list[str | Send] = [
                r[1] if r[0] == "n" else Send(r[1], r[2]) for r in route["r"]
            ]
            rec.done = Outcome(
                task, writes, routes, saved=True, follow_edges=route["e"], rejected=route["x"]
            )
        if INTERRUPT in chans:
            rec.interrupts = [
                Interruption(d["id"], d["node"], d["kind"], d["value"], d["created_at"])
                for d in serde.loads(chans[INTERRUPT], channel=INTERRUPT)
            ]
        if RESUME in chans:
            rec.answers, rec.answer_info = decode_answers(serde, chans[RESUME])
        if ATTEMPT in chans:
            rec.attempts = int(serde.loads(chans[ATTEMPT], channel=ATTEMPT))
        for ch, blob in chans.items():
            if ch.startswith(EFFECT):
                rec.effects[ch[len(EFFECT) :]] = blob
        records[task_id] = rec
    return records
