"""Helpers of the checkpointer contract suite: sample checkpoints, chains and assertions."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    MutableMapping,
    MutableSequence,
)
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    CheckpointSource,
    CheckpointTuple,
    Lease,
    new_checkpoint_id,
)

__all__ = ["assert_eventually", "make_checkpoint", "put_chain"]

_T = TypeVar("_T")

_GRAPH_VERSION = "sha256:5f1d0c3be4a79a2c"
_clock_lock = threading.Lock()
_last_created_at = datetime(1970, 1, 1, tzinfo=UTC)


def _next_created_at() -> datetime:
    """Now (UTC), strictly later than any earlier call, so creation order is unambiguous."""
    global _last_created_at
    with _clock_lock:
        now = datetime.now(UTC)
        if now <= _last_created_at:
            now = _last_created_at + timedelta(microseconds=1)
        _last_created_at = now
        return now


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode()


def sample_deltas(step: int) -> dict[str, ChannelDelta]:
    message = {"role": "assistant" if step % 2 else "user", "content": f"message {step} ✓"}
    return {
        "messages": ChannelDelta("fold", (_encode([message]),)),
        "counter": ChannelDelta("set", (_encode(step),)),
    }


def _sample_snapshot(step: int) -> dict[str, bytes]:
    messages = [{"role": "user", "content": f"message {i} ✓"} for i in range(step + 1)]
    return {"messages": _encode(messages), "counter": _encode(step), "notes": b""}


def make_checkpoint(
    thread_id: str,
    *,
    parent: Checkpoint | None = None,
    ns: str = "",
    step: int | None = None,
    source: CheckpointSource | None = None,
    deltas: Mapping[str, ChannelDelta] | None = None,
    snapshot: Mapping[str, bytes] | bool | None = None,
    metadata: Mapping[str, Any] | None = None,
    next_nodes: tuple[str, ...] = ("agent",),
    checkpoint_id: str | None = None,
    created_at: datetime | None = None,
    graph_version: str = _GRAPH_VERSION,
) -> Checkpoint:
    """Build a valid, realistic :class:`Checkpoint` (it is not stored).

    Args:
        thread_id: The thread the checkpoint belongs to.
        parent: The checkpoint it follows; ``None`` for the first checkpoint of a thread.
        ns: The checkpoint namespace.
        step: Defaults to 0 for a first checkpoint, else the parent's step plus one.
        source: Defaults to ``"input"`` for a first checkpoint, else ``"loop"``.
        deltas: What the step changed; defaults to a realistic fold and set.
        snapshot: A full snapshot, ``True`` to generate one, ``False`` for none. ``None`` (the
            default) means a snapshot for a first checkpoint only.
        metadata: Defaults to what the engine records (source, step, run id).
        next_nodes: The nodes the frontier will run next.
        checkpoint_id: Defaults to :func:`new_checkpoint_id`.
        created_at: Defaults to now (UTC), strictly increasing across calls.
        graph_version: The graph fingerprint.

    Returns:
        The checkpoint, with ``delta_depth``, ``delta_bytes`` and ``snapshot_bytes``
        consistent with ``parent``.

    """
    if step is None:
        step = 0 if parent is None else parent.step + 1
    if source is None:
        source = "input" if parent is None else "loop"
    if deltas is None:
        deltas = sample_deltas(step)
    if snapshot is None:
        snapshot = parent is None
    if snapshot is True:
        snapshot = _sample_snapshot(step)
    elif snapshot is False:
        snapshot = None
    if snapshot is not None:
        depth, delta_bytes, snapshot_bytes = 0, 0, sum(len(b) for b in snapshot.values())
    elif parent is not None:
        depth = parent.delta_depth + 1
        delta_bytes = parent.delta_bytes + sum(d.nbytes for d in deltas.values())
        snapshot_bytes = parent.snapshot_bytes
    else:
        depth, delta_bytes, snapshot_bytes = 0, 0, 0
    if metadata is None:
        metadata = {"source": source, "step": step, "run_id": "run-1", "tags": ["contract"]}
    frontier = _encode([{"node": node, "task_id": f"{node}:{step + 1}"} for node in next_nodes])
    return Checkpoint(
        thread_id=thread_id,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id or new_checkpoint_id(),
        parent_id=None if parent is None else parent.checkpoint_id,
        step=step,
        source=source,
        created_at=created_at or _next_created_at(),
        graph_version=graph_version,
        deltas=deltas,
        snapshot=snapshot,
        frontier=frontier,
        next_nodes=next_nodes,
        metadata=metadata,
        delta_depth=depth,
        delta_bytes=delta_bytes,
        snapshot_bytes=snapshot_bytes,
    )


async def put_chain(
    checkpointer: BaseCheckpointer,
    thread_id: str,
    length: int,
    *,
    ns: str = "",
    after: Checkpoint | None = None,
    snapshot_steps: Collection[int] = (),
    lease: Lease | None = None,
) -> list[Checkpoint]:
    """Commit ``length`` checkpoints in a row and return them, oldest first.

    Args:
        checkpointer: Where to commit.
        thread_id: The thread.
        length: How many checkpoints to commit.
        ns: The checkpoint namespace.
        after: The current head to continue from; ``None`` starts a new thread (its first
            checkpoint carries a snapshot).
        snapshot_steps: Steps whose checkpoint also carries a snapshot.
        lease: Passed to every :meth:`~BaseCheckpointer.put`.

    """
    out: list[Checkpoint] = []
    head = after
    for _ in range(length):
        step = 0 if head is None else head.step + 1
        cp = make_checkpoint(
            thread_id, parent=head, ns=ns, snapshot=head is None or step in snapshot_steps
        )
        await checkpointer.put(
            cp, expected_head=None if head is None else head.checkpoint_id, lease=lease
        )
        out.append(cp)
        head = cp
    return out


async def assert_eventually(
    probe: Callable[[], Awaitable[_T]],
    *,
    timeout: float = 5.0,
    interval: float = 0.01,
    retry_on: tuple[type[BaseException], ...] = (AssertionError,),
) -> _T:
    """Await ``probe`` until it stops raising ``retry_on``; return its result.

    Args:
        probe: The check to retry.
        timeout: Give up (re-raising the last error) after this many seconds.
        interval: Pause between attempts, in seconds.
        retry_on: The exceptions that mean "not yet".

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await probe()
        except retry_on:
            if loop.time() >= deadline:
                raise
        await asyncio.sleep(interval)


def ids_of(checkpoints: Iterable[Checkpoint]) -> list[str]:
    return [cp.checkpoint_id for cp in checkpoints]


def assert_same(got: Checkpoint, want: Checkpoint) -> None:
    """Field-by-field equality, plus the types a backend must hand back."""
    for name in (
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "parent_id",
        "step",
        "source",
        "created_at",
        "graph_version",
        "frontier",
        "next_nodes",
        "delta_depth",
        "delta_bytes",
        "snapshot_bytes",
    ):
        assert getattr(got, name) == getattr(want, name), name
    assert got.created_at.utcoffset() == timedelta(0)
    assert dict(got.deltas) == dict(want.deltas)
    assert all(isinstance(b, bytes) for d in got.deltas.values() for b in d.blobs)
    assert (None if got.snapshot is None else dict(got.snapshot)) == want.snapshot
    assert got.snapshot is None or all(isinstance(b, bytes) for b in got.snapshot.values())
    assert isinstance(got.frontier, bytes)
    assert dict(got.metadata) == dict(want.metadata)


async def get_tuple(
    checkpointer: BaseCheckpointer, thread_id: str, ns: str = "", cid: str = ""
) -> CheckpointTuple:
    """``get`` that must find something (``cid=""`` means the head)."""
    got = await checkpointer.get(thread_id, ns, cid or None)
    assert got is not None, (thread_id, ns, cid)
    return got


async def assert_readable(checkpointer: BaseCheckpointer, cp: Checkpoint) -> None:
    """``cp`` is stored, and its chain is complete back to a snapshot."""
    got = await get_tuple(checkpointer, cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id)
    assert_same(got.checkpoint, cp)
    links = [*got.chain, got.checkpoint]
    assert links[0].snapshot is not None
    assert all(c.snapshot is None for c in links[1:])
    for older, newer in itertools.pairwise(links):
        assert newer.parent_id == older.checkpoint_id


def try_mutate(value: Any) -> None:
    """Mutate every mutable container reachable from ``value``; read-only ones are fine."""
    try:
        if isinstance(value, MutableMapping):
            for item in list(value.values()):
                try_mutate(item)
            value["__mutated__"] = True
            value.pop(next(iter(value)), None)
        elif isinstance(value, MutableSequence):
            for item in list(value):
                try_mutate(item)
            value.append("__mutated__")
    except (TypeError, AttributeError):
        pass


SIMILAR_THREAD_IDS = (
    "t",
    "t1",
    "t%",
    "t_",
    "T",
    "t ",
    " t",
    "t'",
    't"',
    "t\\",
    "t/sub",
    "t|sub",
    "t:sub",
    "tü",
    "t.*",
)
NAMESPACES = ("", "sub", "sub|x", "sub:x", "Sub")
