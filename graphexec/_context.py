"""``ctx``: what a node that takes a second parameter can see about its execution."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NodeContext"]


@dataclass(slots=True)
class NodeContext:
    """Execution context passed as a node's optional second parameter.

    Attributes:
        thread_id: The thread being run (``None`` without a checkpointer).
        run_id: Id of the current run (changes on every ``invoke``).
        step: The superstep number this task belongs to.
        node: The node's name.
        task_id: Deterministic id of this task: the same when the task re-runs after a crash.
        attempt: 1 on the first attempt, 2 on the first retry, and so on. Counts attempts made
            before a crash too.
        checkpoint_ns: ``""`` in the root graph, the node path inside subgraphs.
        idempotency_key: Stable across retries and resumes of this task, different for every
            other task, thread and fork. Pass it to external systems that deduplicate.
        memory: The memory object given to ``compile(memory=...)``, or ``None``.
    """

    thread_id: str | None
    run_id: str
    step: int
    node: str
    task_id: str
    attempt: int
    checkpoint_ns: str
    idempotency_key: str
    memory: Any
    _writer: Callable[[Any], None] = field(repr=False)

    def stream_writer(self, payload: Any) -> None:
        """Emit ``payload`` to ``stream(..., mode="custom")`` consumers (no-op otherwise)."""
        self._writer(payload)
