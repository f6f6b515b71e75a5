"""``ctx``: what a node that takes a second parameter can see about its execution."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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
        idempotency_key: Stable across retries and resumes of this task -- also when the
            checkpoint of its step was lost in a crash (``async``/``exit`` durability) and the
            run is started again with the same input -- and different for every other task,
            thread, fork, replay and ``update_state`` branch. Pass it to external systems that
            deduplicate (memory writes of the ready nodes use it as their ``op_key``).
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
    _effect_async: Callable[[str, Callable[[], Any]], Awaitable[Any]] = field(repr=False)
    _effect_sync: Callable[[str, Callable[[], Any]], Any] = field(repr=False)

    def stream_writer(self, payload: Any) -> None:
        """Emit ``payload`` to ``stream(..., mode="custom")`` consumers (no-op otherwise)."""
        self._writer(payload)

    def effect(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run a side effect for this task, record its result, and return it (re-runs reuse it).

        The first time, ``fn()`` runs and its result is stored durably with the task before
        ``effect`` returns. When the node runs again — after an interrupt is answered, a crash,
        or a retry — the stored result is returned and ``fn`` is not called.

        What that guarantees: exactly once, unless the process dies (or the store fails)
        after ``fn`` started and before its result was recorded. Then nothing says whether the
        effect happened, and the re-run task calls ``fn`` again: at least once across such a
        crash. A ``fn`` that raises records nothing either, so a retry calls it again. The
        repeat is safe when ``fn`` passes :attr:`idempotency_key` to the external system
        (an idempotency key, a unique request id, an upsert key): the key is the same for
        every run of the task, so the system can recognise and drop the second request.

        In an async node, await it: ``await ctx.effect("charge", charge_card)`` (``fn`` may be
        sync or async). In a sync node, call it: ``ctx.effect("charge", charge_card)``.

        Args:
            name: Unique within the node; identifies the effect across re-runs.
            fn: Zero-argument callable performing the effect. Its result must be serializable.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("ctx.effect(name, fn): name must be a non-empty string")
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._effect_sync(name, fn)
        return self._effect_async(name, fn)
