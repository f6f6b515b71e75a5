"""Pin graphexec's public names (TM ``tests/test_client_exports.py``)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import graphexec

EXPECTED = {
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
    "Interruption",
    # state and time travel
    "StateSnapshot",
    "BranchInfo",
    "ThreadInfo",
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
    "interrupt",
    "RunState",
    "TaskInfo",
    "InvalidResumeError",
    "ThreadInterruptedError",
}


def test_all_is_pinned() -> None:
    assert set(graphexec.__all__) == EXPECTED


def test_all_has_no_duplicates() -> None:
    assert len(graphexec.__all__) == len(set(graphexec.__all__))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from graphexec import {name}", namespace)
    assert namespace[name] is getattr(graphexec, name)


DOCUMENTED = sorted(
    name
    for name in EXPECTED
    if inspect.isclass(getattr(graphexec, name))
    or inspect.isfunction(getattr(graphexec, name))
    or name == "add_messages"
)


@pytest.mark.parametrize("name", DOCUMENTED)
def test_public_callable_has_a_docstring(name: str) -> None:
    obj = getattr(graphexec, name)
    doc = inspect.getdoc(obj) or ""
    assert doc.strip()
    # dataclasses invent a "Name(field: type, ...)" docstring when there is none
    assert not doc.startswith(f"{getattr(obj, '__name__', name)}(")


def test_errors_share_one_root() -> None:
    errors = [getattr(graphexec, n) for n in EXPECTED if n.endswith("Error")]
    assert errors
    for cls in errors:
        assert issubclass(cls, graphexec.GraphExecError)


def test_import_does_not_pull_in_backends_or_memory() -> None:
    root = Path(graphexec.__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    code = (
        "import graphexec, sys; "
        "bad = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('checkpointers', 'memory')); "
        "assert not bad, bad"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
