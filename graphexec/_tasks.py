"""Small records the executor passes around, stream emission, and the durability committer."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from graphexec._hitl import Answer
from graphexec._types import Durability, Interruption, Send
from graphexec.errors import LeaseLostError

if TYPE_CHECKING:
    from graphexec._checkpoint import BaseCheckpointer, Lease

__all__ = [
    "AFTER",
    "ATTEMPT",
    "EFFECT",
    "INTERRUPT",
    "RESUME",
    "ROUTE",
    "UPDATES",
    "Committer",
    "Emitter",
    "Frontier",
    "Heartbeat",
    "Outcome",
    "Task",
    "TaskRecord",
    "anchor_for",
    "idempotency_key_for",
    "random_anchor",
    "relaxed_commit",
    "task_id_for",
]

# Engine channels of pending writes. State keys may not start with "__", so these never clash.
UPDATES = "__updates__"
"""A finished task's state writes: ``[[channel, blob], ...]``."""
ROUTE = "__route__"
"""A finished task's routing decision; its presence marks the task as finished."""
ATTEMPT = "__attempt__"
"""Failed attempts so far (retry policy), so backoff continues after a crash."""
INTERRUPT = "__interrupt__"
"""The interrupts a task is waiting on."""
RESUME = "__resume__"
"""Answers recorded for a task's interrupts."""
EFFECT = "__effect__:"
"""Prefix of ``ctx.effect`` results, followed by the effect's name."""
AFTER = "__after__"
"""Pseudo task id holding an ``interrupt_after`` breakpoint of a committed step."""


@dataclass(frozen=True, slots=True)
class Task:
    """One node execution in a superstep."""

    node: str
    push: bool
    index: int
    arg: Any
    task_id: str


@dataclass(slots=True)
class Outcome:
    """What a task produced: state writes (in order), where to go next, or why it stopped."""

    task: Task
    writes: list[tuple[str, Any, bytes | None]]
    routes: list[str | Send]
    error: BaseException | None = None
    saved: bool = False
    interrupts: list[Interruption] = field(default_factory=list)
    follow_edges: bool = True
    rejected: bool = False


@dataclass(slots=True)
class TaskRecord:
    """What storage holds for a task of the current step (after a crash or an interrupt)."""

    done: Outcome | None = None
    interrupts: list[Interruption] = field(default_factory=list)
    answers: dict[str, Answer] = field(default_factory=dict)
    answer_info: dict[str, tuple[str, str]] = field(default_factory=dict)
    effects: dict[str, bytes] = field(default_factory=dict)
    attempts: int = 0

    def unanswered(self) -> list[Interruption]:
        """Interrupts of this task still waiting for an answer."""
        return [i for i in self.interrupts if i.id not in self.answers]


@dataclass(slots=True)
class Frontier:
    """The tasks of the next superstep and the state of join barriers."""

    tasks: list[Task] = field(default_factory=list)
    barriers: dict[int, list[str]] = field(default_factory=dict)
    anchor: str | None = None
    """What the tasks' idempotency keys derive from (see :func:`idempotency_key_for`);
    ``None`` in checkpoints written before anchors existed."""


def task_id_for(ns: str, checkpoint_id: str, node: str, push: bool, index: int) -> str:
    """Deterministic task id: the same task of the same checkpoint always gets the same id."""
    raw = f"{ns}\x00{checkpoint_id}\x00{node}\x00{int(push)}\x00{index}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


def anchor_for(*parts: str | bytes) -> str:
    """A deterministic anchor: the hash of ``parts``, each length-prefixed (no ambiguity)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()[:32]


def random_anchor() -> str:
    """An anchor no other run shares (replays, ``update_state`` branches, unsaved runs)."""
    return uuid.uuid4().hex


def idempotency_key_for(
    thread_id: str | None, ns: str, anchor: str, step: int, node: str, push: bool, index: int
) -> str:
    """``ctx.idempotency_key`` of a task: stable across crashes, distinct for every task.

    Task ids come from checkpoint ids, which a run creates as it goes; in ``async`` and
    ``exit`` durability a crash can lose them, and a key built on them would change when the
    lost steps run again. The key is built instead on the run's *anchor*, which is derived
    only from durable facts -- the checkpoint the run started from and the input it applied
    (or, for a subgraph, its parent task's key) -- and is carried in every checkpoint's
    frontier, plus the task's step and its place in the step.
    """
    raw = f"{thread_id or ''}\x00{ns}\x00{anchor}\x00{step}\x00{node}\x00{int(push)}\x00{index}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class Emitter:
    """Routes stream parts to a queue, for the modes a consumer asked for."""

    def __init__(self, modes: frozenset[str], queue: asyncio.Queue[Any] | None) -> None:
        self.modes = modes
        self.queue = queue
        self.loop = asyncio.get_running_loop() if queue is not None else None

    def wants(self, mode: str) -> bool:
        """Whether a consumer receives ``mode`` parts (skip building payloads nobody reads)."""
        return self.queue is not None and mode in self.modes

    def emit(self, mode: str, payload: Any) -> None:
        """Queue a part (from the event loop's thread)."""
        if self.queue is not None and mode in self.modes:
            self.queue.put_nowait((mode, payload))

    def emit_threadsafe(self, mode: str, payload: Any) -> None:
        """Queue a part from any thread (sync nodes run in worker threads)."""
        if self.queue is None or self.loop is None or mode not in self.modes:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.queue.put_nowait((mode, payload))
        else:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (mode, payload))


@dataclass(slots=True)
class _Queued:
    call: Callable[[], Any]
    task_id: str | None
    """Set for a task's pending writes: independent of other tasks' writes queued next to it."""
    holds_room: bool = False
    """Whether this call holds one of :data:`ASYNC_AHEAD` slots (released once it is stored)."""


ASYNC_AHEAD = 2
"""In ``async`` durability, how many checkpoints (and other calls that are not a task's pending
writes) may be queued or in flight at once. A run that computes steps faster than the store
commits them then waits for room: it stays at most this many steps ahead of the store, which
bounds the memory queued commits hold and what a crash can lose, and keeps the step time steady
(an unbounded queue let the first steps run at compute speed and the later ones slow down as
the backlog's commits competed with them). Pending writes of a step's tasks are not counted: a
step has a bounded number of tasks, and they are stored together when queued together."""


relaxed_commit: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "graphexec_relaxed_commit", default=False
)
"""True while the ``async`` committer stores a call. A store may then acknowledge a ``put`` or
``put_writes`` before its commit is flushed to disk (PostgreSQL: ``synchronous_commit = off``
for that transaction), as long as it keeps flushing ``put_final``, ``put_writes_final`` and
``release_lease``: a run's last store is one of those, and flushing it flushes every earlier
commit of the run, before ``invoke`` returns. A crash of the database server in between can
lose the unflushed commits (a prefix of the run's history survives, never a gap) -- what
``async`` durability allows: "a crash can also lose the last committed-in-flight steps". Never
set in ``sync`` or ``exit`` durability."""


class Committer:
    """Applies the durability mode to storage calls.

    ``sync`` awaits each call; ``async`` runs calls in order in one background task so the next
    step overlaps the commit, and re-raises a failed commit at the next submit, drain or flush.
    A submit waits while :data:`ASYNC_AHEAD` checkpoints are already queued or in flight.
    Pending writes of different tasks queued back to back are independent of one another, so
    the background task runs such a run of them concurrently (a backend may then store them in
    one statement); checkpoints, and a task's second save, still wait for everything before.
    """

    def __init__(self, durability: Durability) -> None:
        self.durability = durability
        self._queue: asyncio.Queue[_Queued | None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._room: asyncio.Semaphore | None = None

    async def submit(self, call: Callable[[], Any], *, writes_of: str | None = None) -> None:
        """Run ``call`` now (sync/exit) or queue it behind earlier ones (async).

        ``writes_of``: the call saves pending writes of this task (see the class docstring).
        """
        if self.durability != "async":
            await call()
            return
        self._raise_pending()
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._room = asyncio.Semaphore(ASYNC_AHEAD)
            self._worker = asyncio.create_task(self._work())
        holds_room = writes_of is None
        if holds_room:
            assert self._room is not None
            await self._room.acquire()
            if self._error is not None:  # a commit failed while this one waited for room
                self._room.release()
                self._raise_pending()
        self._queue.put_nowait(_Queued(call, writes_of, holds_room))

    async def _work(self) -> None:
        queue = self._queue
        assert queue is not None
        relaxed_commit.set(True)  # this task's own context (and the tasks it gathers)
        held: list[_Queued | None] = []  # taken off the queue, not part of the batch: next
        while True:
            item = held.pop() if held else await queue.get()
            if item is None:  # flush()'s stop marker
                queue.task_done()
                return
            batch = [item]
            if item.task_id is not None:
                tasks = {item.task_id}
                while not queue.empty():
                    nxt = queue.get_nowait()
                    if nxt is None or nxt.task_id is None or nxt.task_id in tasks:
                        held.append(nxt)
                        break
                    tasks.add(nxt.task_id)
                    batch.append(nxt)
            try:
                if self._error is not None:
                    pass  # a commit failed: skip the rest; the error surfaces at the next call
                elif len(batch) == 1:
                    await item.call()
                else:
                    results = await asyncio.gather(
                        *(q.call() for q in batch), return_exceptions=True
                    )
                    for r in results:
                        if isinstance(r, BaseException):
                            raise r
            except Exception as e:
                self._error = e
            finally:
                for q in batch:
                    if q.holds_room:
                        assert self._room is not None
                        self._room.release()
                    queue.task_done()

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    async def drain(self) -> None:
        """Wait until everything queued so far is stored."""
        if self._queue is not None:
            await asyncio.shield(self._queue.join())
        self._raise_pending()

    async def flush(self) -> None:
        """Store everything queued and stop the background task."""
        if self._queue is not None and self._worker is not None:
            self._queue.put_nowait(None)
            await asyncio.shield(self._worker)
            self._queue = None
            self._worker = None
        self._raise_pending()

    def abandon(self) -> None:
        """Stop without storing what is still queued (the run was cancelled)."""
        if self._worker is not None:
            self._worker.cancel()


class Heartbeat:
    """Renews a run's lease every ``ttl / 3`` seconds until :meth:`stop`.

    A timer, not a task: most runs end long before their first renewal, and creating,
    cancelling and awaiting a task per run cost more than a short run's whole lease handling.
    A renewal that fails ends the heartbeat; :meth:`stop` re-raises its error unless the lease
    was lost (the run's next commit reports that).
    """

    def __init__(self, store: BaseCheckpointer, lease: Lease, ttl: float) -> None:
        self.lease = lease
        """The latest renewal of the lease (release this one)."""
        self._store = store
        self._ttl = ttl
        self._loop = asyncio.get_running_loop()
        self._renewal: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(ttl / 3, self._start_renewal)

    def _start_renewal(self) -> None:
        self._renewal = self._loop.create_task(self._renew())

    async def _renew(self) -> None:
        self.lease = await self._store.renew_lease(self.lease, ttl=self._ttl)
        self._timer = self._loop.call_later(self._ttl / 3, self._start_renewal)

    async def stop(self) -> None:
        """Stop renewing; wait for a renewal in flight to unwind."""
        self._timer.cancel()
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError, LeaseLostError):
                await self._renewal
