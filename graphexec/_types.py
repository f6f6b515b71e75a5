"""Public value types: control-flow commands, retry policy, snapshots and run results."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from graphexec._hitl import RunState

__all__ = [
    "END",
    "START",
    "Command",
    "Durability",
    "Interruption",
    "RetryPolicy",
    "RunResult",
    "RunStatus",
    "Send",
    "StateSnapshot",
    "StreamMode",
    "TaskInfo",
]

START = "__start__"
"""The virtual entry node: ``add_edge(START, "first")``."""

END = "__end__"
"""The virtual exit node: ``add_edge("last", END)``."""

Durability = Literal["sync", "async", "exit"]
StreamMode = Literal["values", "updates", "events", "custom"]
RunStatus = Literal["done", "interrupted", "failed", "rejected"]


@dataclass(frozen=True, slots=True)
class Send:
    """Run ``node`` once with ``arg`` as its input, in the next superstep (map-reduce fan-out).

    Returned from a node or a conditional-edge function, usually as a list. Sends run
    concurrently; their updates are applied in the order the ``Send`` objects were produced,
    whatever order they finish in, so reducer results are deterministic.

    Attributes:
        node: The target node.
        arg: The input the target receives instead of the graph state.
    """

    node: str
    arg: Any


@dataclass(frozen=True, slots=True)
class Command:
    """Update state and choose where to go next, from inside a node; or resume a run.

    Attributes:
        update: A partial state update, applied like a node's returned dict.
        goto: Node name(s) or :class:`Send` objects to run next, replacing the node's static
            edges.
        resume: The answer for a pending interrupt (``Command(resume=value)``) or answers by
            interruption id (``Command(resume={id: value})``). An id is ``"intr-"`` and 24
            lowercase hex digits (``Interruption.id``); a mapping with any key starting
            ``"intr-"`` is read as answers by id, and every key must then be pending.
    """

    update: Mapping[str, Any] | None = None
    goto: str | Send | Sequence[str | Send] = ()
    resume: Any = None

    def goto_targets(self) -> builtins.list[str | Send]:
        """``goto`` normalised to a list."""
        if isinstance(self.goto, str | Send):
            return [self.goto]
        return list(self.goto)


def _default_retry_on(exc: BaseException) -> bool:
    """Retry transient failures, not programming errors, interrupts or cancellation."""
    from graphexec.errors import GraphExecError, NodeTimeoutError

    if not isinstance(exc, Exception):
        return False
    if isinstance(exc, NodeTimeoutError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, GraphExecError):
        return False
    return not isinstance(
        exc,
        ValueError
        | TypeError
        | ArithmeticError
        | ImportError
        | LookupError
        | NameError
        | SyntaxError
        | RuntimeError
        | ReferenceError
        | StopIteration
        | StopAsyncIteration
        | OSError
        | AssertionError
        | AttributeError,
    )


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a node is retried when it raises (built on tenacity).

    Attempts are recorded in the checkpoint's pending writes, so a crash between attempts does
    not reset the count and backoff continues where it stopped. Interrupts and cancellation are
    never retried.

    Attributes:
        max_attempts: Total attempts, including the first.
        initial_interval: Seconds before the first retry.
        backoff_factor: Multiplier applied to the interval after each retry.
        max_interval: Upper bound on the interval.
        jitter: Add up to 1 s of random jitter to each interval.
        retry_on: Exception types, or a predicate, selecting what is retried. The default
            retries network-ish failures and not programming errors (``ValueError``,
            ``TypeError``, ``KeyError`` ...).
    """

    max_attempts: int = 3
    initial_interval: float = 0.5
    backoff_factor: float = 2.0
    max_interval: float = 128.0
    jitter: bool = True
    retry_on: (
        type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]
    ) = field(default=_default_retry_on)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy(max_attempts={self.max_attempts}): must be >= 1")
        if self.initial_interval < 0 or self.max_interval < 0 or self.backoff_factor < 1:
            raise ValueError(
                "RetryPolicy: intervals must be >= 0 and backoff_factor >= 1 "
                f"(got initial_interval={self.initial_interval}, "
                f"max_interval={self.max_interval}, backoff_factor={self.backoff_factor})"
            )

    def should_retry(self, exc: BaseException) -> bool:
        """Whether ``exc`` is retryable under this policy."""
        if not isinstance(exc, Exception):
            return False
        rule = self.retry_on
        if isinstance(rule, type):
            return isinstance(exc, rule)
        if isinstance(rule, tuple):
            return isinstance(exc, rule)
        return bool(rule(exc))

    def interval(self, retry_number: int) -> float:
        """Seconds to wait before retry number ``retry_number`` (1-based), without jitter."""
        value = self.initial_interval * self.backoff_factor ** max(retry_number - 1, 0)
        return float(min(value, self.max_interval))


@dataclass(frozen=True, slots=True)
class Interruption:
    """A pending request for human input.

    Attributes:
        id: Stable, unique id of this pending interrupt.
        node: The node that is waiting.
        kind: ``"input"`` for :func:`~graphexec.interrupt`, ``"approval"`` for approvals,
            ``"breakpoint"`` for static breakpoints.
        value: What the node asked (for ``input``) or the preview (for ``approval``).
        created_at: When the interrupt was raised.
    """

    id: str
    node: str
    kind: Literal["input", "approval", "breakpoint"]
    value: Any
    created_at: datetime


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task of the step that follows a checkpoint, as storage knows it.

    Attributes:
        task_id: The deterministic task id.
        node: The node it runs.
        finished: Whether its writes are already saved (it will not run again).
        interruptions: Interrupts it waits on.
    """

    task_id: str
    node: str
    finished: bool
    interruptions: tuple[Interruption, ...]


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """The state of a thread at one checkpoint.

    Attributes:
        values: Channel values.
        next: Nodes that run next (empty when the thread finished).
        checkpoint_id: The checkpoint.
        parent_id: Its parent.
        step: The superstep number.
        created_at: When it was written.
        metadata: Engine and user metadata (``source``, ``writes``, ``run_id`` ...).
        interruptions: Interrupts waiting for an answer at this checkpoint.
        thread_id: The thread.
        tasks: The tasks of the next step, with what has already finished.
    """

    values: dict[str, Any]
    next: tuple[str, ...]
    checkpoint_id: str
    parent_id: str | None
    step: int
    created_at: datetime
    metadata: dict[str, Any]
    interruptions: tuple[Interruption, ...]
    thread_id: str
    tasks: tuple[TaskInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class RunResult:
    """What ``graph.run()`` returns.

    Attributes:
        values: The state values when the run stopped.
        status: ``done``, ``interrupted``, ``failed`` or ``rejected``.
        interruptions: Pending interrupts (when ``status == "interrupted"``).
        thread_id: The thread (``None`` for a run without a checkpointer and thread).
        run_id: This run's id.
        checkpoint_id: The last committed checkpoint.
        error: The exception when ``status == "failed"``.
        graph_name: The graph that ran.
        graph_version: Its version fingerprint.
    """

    values: dict[str, Any]
    status: RunStatus
    interruptions: tuple[Interruption, ...]
    thread_id: str | None
    run_id: str
    checkpoint_id: str | None
    error: BaseException | None = None
    graph_name: str = ""
    graph_version: str = ""
    _graph: Any = field(default=None, repr=False, compare=False)

    def to_state(self) -> RunState:
        """The paused run as a :class:`~graphexec.RunState`, to decide on and continue.

        Raises:
            GraphExecError: when the run is not waiting for a human.
        """
        from graphexec._hitl import RunState
        from graphexec.errors import GraphExecError

        if self.status != "interrupted" or self.thread_id is None or self.checkpoint_id is None:
            raise GraphExecError(
                f"run {self.run_id} ended with status {self.status!r}; only an interrupted run "
                "of a thread has a state to decide on"
            )
        return RunState(
            thread_id=self.thread_id,
            checkpoint_id=self.checkpoint_id,
            graph_name=self.graph_name,
            graph_version=self.graph_version,
            interruptions=self.interruptions,
            _graph=self._graph,
        )
