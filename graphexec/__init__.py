"""graphexec: durable agent workflows.

A workflow is a graph of nodes over a typed state, checkpointed after every superstep per
``thread_id``: a crashed thread resumes from its last committed step, and any checkpoint can be
inspected, replayed or forked.
"""

from __future__ import annotations

from graphexec._builder import StateGraph
from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    CheckpointTuple,
    Lease,
    PendingWrite,
    SnapshotPolicy,
    ThreadInfo,
    new_checkpoint_id,
)
from graphexec._context import NodeContext
from graphexec._graph import BranchInfo, CompiledGraph
from graphexec._hitl import RunState, interrupt
from graphexec._inmemory import InMemoryCheckpointer
from graphexec._serde import Serializer
from graphexec._state import REMOVE_ALL_MESSAGES, RemoveMessage, add_messages
from graphexec._streamed import StreamedRun
from graphexec._types import (
    END,
    START,
    Command,
    Durability,
    Interruption,
    RetryPolicy,
    RunResult,
    RunStatus,
    Send,
    StateSnapshot,
    StreamMode,
    TaskInfo,
)
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointNotFoundError,
    DeserializationError,
    GraphBuildError,
    GraphExecError,
    GraphVersionError,
    InvalidResumeError,
    InvalidUpdateError,
    LeaseLostError,
    MemoryConflictError,
    MemoryStoreError,
    NodeExecutionError,
    NodeTimeoutError,
    NotSupportedError,
    RecursionLimitError,
    SerializationError,
    StorageError,
    TaskLimitError,
    ThreadBusyError,
    ThreadInterruptedError,
    ThreadNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    # building
    "END",
    "START",
    "StateGraph",
    "CompiledGraph",
    "add_messages",
    "RemoveMessage",
    "REMOVE_ALL_MESSAGES",
    # control flow and running
    "Command",
    "Send",
    "RetryPolicy",
    "NodeContext",
    "Durability",
    "StreamMode",
    "RunResult",
    "RunStatus",
    "StreamedRun",
    # human in the loop
    "interrupt",
    "Interruption",
    "RunState",
    # state and time travel
    "StateSnapshot",
    "BranchInfo",
    "ThreadInfo",
    "TaskInfo",
    # checkpointer contract
    "BaseCheckpointer",
    "InMemoryCheckpointer",
    "Checkpoint",
    "CheckpointTuple",
    "ChannelDelta",
    "PendingWrite",
    "Lease",
    "SnapshotPolicy",
    "new_checkpoint_id",
    "Serializer",
    # errors
    "GraphExecError",
    "GraphBuildError",
    "InvalidUpdateError",
    "InvalidResumeError",
    "ThreadInterruptedError",
    "NodeExecutionError",
    "NodeTimeoutError",
    "RecursionLimitError",
    "TaskLimitError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "ThreadNotFoundError",
    "CheckpointConflictError",
    "ThreadBusyError",
    "LeaseLostError",
    "GraphVersionError",
    "SerializationError",
    "DeserializationError",
    "StorageError",
    "MemoryStoreError",
    "MemoryConflictError",
    "NotSupportedError",
]
