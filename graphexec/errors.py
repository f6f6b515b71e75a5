"""The graphexec error hierarchy.

Every error the library raises derives from :class:`GraphExecError`. Errors carry typed,
keyword-only attributes (the node, key, thread or checkpoint involved) and their messages say
how to fix the problem.

Interrupts are *not* errors: the signal :func:`graphexec.interrupt` uses internally derives from
:class:`BaseException` (see :class:`GraphInterrupt`) so that a node's ``except Exception`` cannot
swallow it, and ``run()`` reports pending interrupts as data instead of raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "CheckpointConflictError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "DeserializationError",
    "GraphBuildError",
    "GraphExecError",
    "GraphInterrupt",
    "GraphVersionError",
    "InvalidResumeError",
    "InvalidTTLError",
    "InvalidUpdateError",
    "LeaseLostError",
    "MemoryConflictError",
    "MemoryStoreError",
    "NodeExecutionError",
    "NodeTimeoutError",
    "NotSupportedError",
    "RecursionLimitError",
    "SerializationError",
    "StorageError",
    "TaskLimitError",
    "ThreadBusyError",
    "ThreadInterruptedError",
    "ThreadNotFoundError",
]


class GraphExecError(Exception):
    """Root of every error raised by graphexec."""


class GraphBuildError(GraphExecError):
    """The graph definition is invalid; raised by the builder and by ``compile()`` only.

    Attributes:
        node: The offending node, when one is involved.
        edge: The offending edge as ``(source, target)``, when one is involved.
    """

    def __init__(
        self, message: str, *, node: str | None = None, edge: tuple[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.node = node
        self.edge = edge


class InvalidUpdateError(GraphExecError):
    """A node (or ``update_state``) produced an update the state schema does not accept.

    Attributes:
        node: The node whose update was refused.
        key: The state key at fault.
    """

    def __init__(self, message: str, *, node: str, key: str | None) -> None:
        super().__init__(message)
        self.node = node
        self.key = key


class NodeExecutionError(GraphExecError):
    """A node raised; the original exception is chained as ``__cause__``.

    Attributes:
        node: The node that failed.
        attempt: The attempt number (1-based) that failed last.
        thread_id: The thread the run belongs to, when checkpointed.
    """

    def __init__(
        self, message: str, *, node: str, attempt: int, thread_id: str | None = None
    ) -> None:
        super().__init__(message)
        self.node = node
        self.attempt = attempt
        self.thread_id = thread_id


class NodeTimeoutError(GraphExecError, TimeoutError):
    """A node ran longer than its ``timeout=``.

    Attributes:
        node: The node that timed out.
        timeout: The limit, in seconds.
    """

    def __init__(self, message: str, *, node: str, timeout: float) -> None:
        super().__init__(message)
        self.node = node
        self.timeout = timeout


class RecursionLimitError(GraphExecError):
    """The run took more supersteps than ``recursion_limit`` allows.

    The last committed checkpoint stays resumable: fix the cycle's exit condition (or raise the
    limit) and resume with ``invoke(None, thread_id=...)``.

    Attributes:
        limit: The limit that was exceeded.
        steps: How many steps this run executed.
        cycle: The nodes of the cycle the run was going round, in order.
    """

    def __init__(self, message: str, *, limit: int, steps: int, cycle: Sequence[str]) -> None:
        super().__init__(message)
        self.limit = limit
        self.steps = steps
        self.cycle = tuple(cycle)


class TaskLimitError(GraphExecError):
    """A step would start more tasks than ``max_tasks_per_step`` allows (a runaway fan-out).

    The step whose nodes produced the tasks (by ``Send``, ``Command(goto=...)`` or edges) is
    not checkpointed: the thread stays at its last checkpoint, resumable with
    ``invoke(None, thread_id=...)`` once the node sends fewer, larger tasks or the graph is
    compiled with a higher ``compile(max_tasks_per_step=...)``.

    Attributes:
        limit: The limit that was exceeded.
        count: How many tasks the next step would have had.
        step: The step whose checkpoint was refused (the one that produced the tasks).
        nodes: The nodes that produced them, most tasks first (``"__input__"`` for a
            ``Command`` given as input, ``"__start__"`` for a conditional edge from START).
        thread_id: The thread, when the run is checkpointed.
    """

    def __init__(
        self,
        message: str,
        *,
        limit: int,
        count: int,
        step: int,
        nodes: Sequence[str],
        thread_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.count = count
        self.step = step
        self.nodes = tuple(nodes)
        self.thread_id = thread_id


class CheckpointError(GraphExecError):
    """A checkpoint cannot be read, written or used as asked."""


class CheckpointNotFoundError(CheckpointError):
    """The thread or checkpoint id does not exist.

    Attributes:
        thread_id: The thread looked up.
        checkpoint_id: The checkpoint looked up, if one was named.
    """

    def __init__(self, message: str, *, thread_id: str, checkpoint_id: str | None = None) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id


class ThreadNotFoundError(CheckpointNotFoundError):
    """The thread has no checkpoints."""


class CheckpointConflictError(CheckpointError):
    """A commit's expected head is no longer the thread's head: someone else wrote first.

    The commit was rejected and nothing was written; history never forks silently.

    Attributes:
        thread_id: The thread.
        expected_head: The head the writer based its commit on.
        actual_head: The head found in storage.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str,
        expected_head: str | None,
        actual_head: str | None,
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.expected_head = expected_head
        self.actual_head = actual_head


class ThreadBusyError(CheckpointError):
    """Another run holds the thread's lease.

    Attributes:
        thread_id: The busy thread.
        owner: The current lease owner's id.
    """

    def __init__(self, message: str, *, thread_id: str, owner: str | None) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.owner = owner


class LeaseLostError(CheckpointError):
    """This run's lease on the thread expired and was taken over (its epoch is stale).

    The write was rejected; the new owner continues the thread.

    Attributes:
        thread_id: The thread.
        epoch: The stale epoch this writer held.
    """

    def __init__(self, message: str, *, thread_id: str, epoch: int) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.epoch = epoch


class GraphVersionError(CheckpointError):
    """A thread was checkpointed by a different graph whose pending nodes no longer exist.

    Attributes:
        thread_id: The thread.
        missing_nodes: Pending nodes the current graph does not define.
    """

    def __init__(self, message: str, *, thread_id: str, missing_nodes: Sequence[str]) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.missing_nodes = tuple(missing_nodes)


class InvalidResumeError(GraphExecError):
    """A resume does not match the thread's pending interrupts.

    Raised for unknown, stale or already-answered interruption ids, for an ambiguous
    ``Command(resume=value)`` while several interrupts are pending, for a resume of a thread with
    nothing pending (finished or never interrupted), and for a ``RunState`` that belongs to another
    graph, another thread, or a checkpoint that is no longer the head.

    Attributes:
        thread_id: The thread.
        pending: Ids of the interrupts that are pending (what a correct resume would answer).
    """

    def __init__(self, message: str, *, thread_id: str | None, pending: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.pending = tuple(pending)


class ThreadInterruptedError(GraphExecError):
    """New input was sent to a thread that is waiting on an interrupt.

    Answer the pending interrupts with ``Command(resume=...)`` (or ``RunState``) first.

    Attributes:
        thread_id: The thread.
        pending: Ids of the pending interrupts.
    """

    def __init__(self, message: str, *, thread_id: str, pending: Sequence[str]) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.pending = tuple(pending)


class SerializationError(GraphExecError, TypeError):
    """A value cannot be encoded by the closed type registry.

    Attributes:
        channel: The state key (channel) or write the value belonged to, when known.
        type_name: The qualified name of the unsupported type.
    """

    def __init__(self, message: str, *, channel: str | None, type_name: str) -> None:
        super().__init__(message)
        self.channel = channel
        self.type_name = type_name


class DeserializationError(GraphExecError):
    """Stored bytes are corrupt or name a type this process has not registered.

    Attributes:
        channel: The channel or write being decoded, when known.
    """

    def __init__(self, message: str, *, channel: str | None = None) -> None:
        super().__init__(message)
        self.channel = channel


class StorageError(GraphExecError):
    """A storage driver failed; the driver's exception is chained as ``__cause__``."""


class MemoryStoreError(GraphExecError):
    """A memory store operation was refused or failed."""


class InvalidTTLError(CheckpointError, ValueError):
    """A thread TTL that is not a finite number of seconds in ``[0, MAX_TTL_SECONDS]``.

    Also a :class:`ValueError`, which is what TTL checks raised before this class existed.
    """


class NotSupportedError(GraphExecError):
    """The backend does not implement this optional operation."""


class GraphInterrupt(BaseException):
    """Internal signal that pauses a node for a human.

    It derives from :class:`BaseException` on purpose, so ``except Exception`` in user code cannot
    swallow it. Users never catch it: ``run()`` returns the pending interrupts as data.
    """

    def __init__(self, interruptions: Sequence[Any]) -> None:
        super().__init__(interruptions)
        self.interruptions = tuple(interruptions)


class MemoryConflictError(MemoryStoreError):
    """A memory write lost a race: the record changed since the caller read it.

    Raised when a block's ``expected_version`` no longer matches. Nothing was written; read
    the record again, reapply the change and retry.

    Attributes:
        key: What conflicted (e.g. ``"block 'human'"``, with its namespace).
        expected: The version the caller expected.
        actual: The version found.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.actual = actual
