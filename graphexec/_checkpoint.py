"""The checkpoint data model and the async checkpointer contract.

A checkpoint is written once per superstep. It records *what the step changed* (``deltas``),
not the whole state: a plain channel stores its new value (``op="set"``), a reducer channel
stores the updates the step folded into it (``op="fold"``). Every so often a checkpoint also
carries a full ``snapshot`` of all channels, which bounds how many deltas a reader must fold.
Folding needs the graph's reducers, so backends never interpret blobs: they store bytes and hand
back, for any checkpoint, the chain of deltas since the nearest snapshot (see
:class:`CheckpointTuple`). The compiled graph materialises values from that chain.

Backends implement :class:`BaseCheckpointer`. Its contract (ordering, isolation, heads and
compare-and-set, leases, pending writes, retention) is pinned by the suite in
:mod:`graphexec.testing.contracts`, which every backend passes unmodified.
"""

from __future__ import annotations

import math
import random
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal

from graphexec.errors import InvalidTTLError, NotSupportedError

__all__ = [
    "BaseCheckpointer",
    "ChannelDelta",
    "Checkpoint",
    "CheckpointTuple",
    "MAX_TTL_SECONDS",
    "Lease",
    "PendingWrite",
    "SnapshotPolicy",
    "ThreadInfo",
    "ValuesCache",
    "new_checkpoint_id",
    "validate_ttl",
]

CheckpointSource = Literal["input", "loop", "update", "fork"]


@dataclass(frozen=True, slots=True)
class ChannelDelta:
    """What one checkpoint changed in one channel.

    Attributes:
        op: ``"set"`` replaces the channel's value with ``blobs[0]``; ``"fold"`` applies the
            channel's reducer to each update in ``blobs``, in order.
        blobs: Serialized value (``set``) or serialized updates (``fold``).
    """

    op: Literal["set", "fold"]
    blobs: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        """Total payload size in bytes."""
        return sum(len(b) for b in self.blobs)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One committed superstep of one thread (and checkpoint namespace).

    Attributes:
        thread_id: The thread this checkpoint belongs to.
        checkpoint_ns: ``""`` for the root graph; the node path of a subgraph otherwise.
        checkpoint_id: Unique and time-sortable within a process.
        parent_id: The checkpoint this one follows, or ``None`` for a thread's first.
        step: Superstep number (the first checkpoint of a new thread has step 0).
        source: ``input`` (new input applied), ``loop`` (a superstep ran), ``update``
            (``update_state``) or ``fork`` (first checkpoint of a forked thread).
        created_at: When the checkpoint was created (UTC).
        graph_version: Fingerprint of the graph that wrote it.
        deltas: The channels this checkpoint changed, relative to its parent.
        snapshot: Full serialized values of every channel, when this checkpoint carries one.
        frontier: Serialized next tasks and join barriers; opaque to storage.
        next_nodes: Names of the nodes the frontier will run next (for listings).
        metadata: msgpack-compatible metadata (user metadata plus what the engine records).
        delta_depth: Number of delta checkpoints since the last snapshot (0 with a snapshot).
        delta_bytes: Delta bytes accumulated since the last snapshot.
        snapshot_bytes: Size of the last snapshot in this checkpoint's chain.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    step: int
    source: CheckpointSource
    created_at: datetime
    graph_version: str
    deltas: Mapping[str, ChannelDelta]
    snapshot: Mapping[str, bytes] | None
    frontier: bytes
    next_nodes: tuple[str, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    delta_depth: int = 0
    delta_bytes: int = 0
    snapshot_bytes: int = 0


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A write saved by a finished (or running) task of the step that follows a checkpoint.

    Attributes:
        task_id: The deterministic id of the task.
        channel: A state channel, or an engine channel whose name starts with ``__``.
        data: Serialized payload.
    """

    task_id: str
    channel: str
    data: bytes


@dataclass(frozen=True, slots=True)
class CheckpointTuple:
    """A checkpoint with everything needed to materialise its values.

    Attributes:
        checkpoint: The requested checkpoint.
        chain: Its ancestors back to (and including) the nearest one with a snapshot, oldest
            first; empty when ``checkpoint`` itself carries a snapshot.
        pending_writes: Writes saved by tasks of the step that follows ``checkpoint``.
        is_head: Whether ``checkpoint`` is its thread's current head.
    """

    checkpoint: Checkpoint
    chain: tuple[Checkpoint, ...]
    pending_writes: tuple[PendingWrite, ...]
    is_head: bool


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of a thread by one run.

    Attributes:
        thread_id: The owned thread.
        owner: The owner's id (a run id).
        epoch: Fencing token: increases every time the lease changes hands. A commit carrying
            an older epoch is rejected.
        expires_at: Unix time after which another owner may take the thread over.
    """

    thread_id: str
    owner: str
    epoch: int
    expires_at: float


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """Summary of one thread.

    Attributes:
        thread_id: The thread id.
        head_id: The current head checkpoint of its root namespace.
        step: The head's step.
        updated_at: When the head was written.
        next_nodes: What the head would run next (empty when the thread finished).
        checkpoints: How many root-namespace checkpoints are stored.
    """

    thread_id: str
    head_id: str
    step: int
    updated_at: datetime
    next_nodes: tuple[str, ...]
    checkpoints: int


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When the engine stores a full snapshot instead of only a delta.

    A snapshot is written when ``max_depth`` deltas have accumulated since the last one, or when
    the delta bytes since the last snapshot reach ``ratio`` times its size (and at least
    ``min_bytes``). The byte rule keeps total storage within a small constant of the bytes
    written, whatever the thread length; the depth rule bounds the work of a read.

    Attributes:
        max_depth: Most deltas a read ever folds.
        ratio: Delta-bytes to snapshot-size ratio that triggers a snapshot.
        min_bytes: Below this many delta bytes the ratio rule never fires.
    """

    max_depth: int = 200
    ratio: float = 1.0
    min_bytes: int = 16384

    def wants_snapshot(self, *, depth: int, delta_bytes: int, snapshot_bytes: int) -> bool:
        """Whether the next checkpoint, with these running totals, should carry a snapshot."""
        if depth >= self.max_depth:
            return True
        return delta_bytes >= self.min_bytes and delta_bytes >= self.ratio * snapshot_bytes


def detach(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of channel values whose containers (list, dict, set) are copies too.

    Reducers and nodes replace values, or (carelessly) append to a list in place; either way a
    detached copy is unaffected. It is O(channels + container lengths), pointer copies only;
    the elements themselves are shared, so state elements must not be mutated in place (which
    durable storage already requires: a mutation is invisible to deltas written before it).
    """
    return {ch: (type(v)(v) if type(v) in (list, dict, set) else v) for ch, v in values.items()}


def check_run_start(checkpoint: Checkpoint) -> None:
    """Refuse a run's first checkpoint outside the root namespace (``acquire_lease_and_put``).

    Runs start at the root; a subgraph's checkpoints go through ``put``.
    """
    if checkpoint.checkpoint_ns != "":
        raise ValueError(
            f"thread {checkpoint.thread_id!r}: acquire_lease_and_put() starts root runs; "
            f"checkpoint {checkpoint.checkpoint_id!r} is in namespace "
            f"{checkpoint.checkpoint_ns!r}"
        )


class ValuesCache:
    """Channel values of the latest checkpoint read or written, per thread and namespace.

    Keyed by checkpoint id: a stored checkpoint never changes, so values held for an id are never
    stale, whoever writes the thread afterwards (another run, another process, ``update_state``,
    a fork, a prune or an expiry). A reader passes the id to
    :meth:`BaseCheckpointer.get_since` and folds only the deltas committed after it, so reading
    the latest state costs one short row fetch instead of a fold of the whole delta chain. Holds
    at most ``size`` threads (least recently used go first); values go in and out detached (see
    :func:`detach`), so callers never alias what the cache holds. Thread-safe.
    """

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], tuple[str, dict[str, Any], Checkpoint | None]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def get(self, thread_id: str, checkpoint_ns: str) -> tuple[str, dict[str, Any]] | None:
        """``(checkpoint_id, values)`` last stored for the thread/namespace (not detached)."""
        key = (thread_id, checkpoint_ns)
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0], item[1]

    def settled(
        self, thread_id: str, checkpoint_ns: str
    ) -> tuple[Checkpoint, dict[str, Any]] | None:
        """The settled checkpoint last stored for the thread/namespace, and its values.

        ``None`` unless the latest :meth:`put` passed ``settled``. The values are not detached.
        """
        key = (thread_id, checkpoint_ns)
        with self._lock:
            item = self._items.get(key)
            if item is None or item[2] is None:
                return None
            self._items.move_to_end(key)
            return item[2], item[1]

    def put(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        values: Mapping[str, Any],
        *,
        settled: Checkpoint | None = None,
    ) -> None:
        """Remember ``values`` (detached) as the values of ``checkpoint_id``.

        ``settled``: that checkpoint, when a run wrote it as its last and it has nothing left
        to run (no next tasks, so no pending writes or interrupts either). Only its fields
        other than ``deltas`` and ``snapshot`` are kept; the engine starts a run with new input
        from it without reading the thread first (the start checks it is still the head).
        """
        key = (thread_id, checkpoint_ns)
        kept = None if settled is None else replace(settled, deltas={}, snapshot=None)
        item = (checkpoint_id, detach(values), kept)
        with self._lock:
            self._items[key] = item
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()


_id_lock = threading.Lock()
_last_ms = 0
_seq = 0


def new_checkpoint_id() -> str:
    """A UUIDv7-style id: sortable by creation time, monotonic within one process."""
    global _last_ms, _seq
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:
                ms += 1
                _seq = 0
        else:
            _seq = 0
        _last_ms = ms
        seq = _seq
    # Unique, not secret: the random module (seeded from os.urandom, reseeded in a forked
    # child) is as good here as os.urandom, and a system call cheaper.
    rand = random.getrandbits(62)
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


MAX_TTL_SECONDS = 100 * 366 * 86_400.0
"""The longest thread TTL accepted: 100 years. Longer ones are surely a mistake (or ``inf``:
pass ``None`` to keep a thread), and larger numbers overflow SQLite's integer arithmetic."""


def validate_ttl(ttl: float | None, *, thread_id: str | None = None) -> float | None:
    """Check a thread TTL; every backend and the CLI call this one function.

    Args:
        ttl: Seconds (0 means: expire on the next sweep), or ``None`` (no TTL).
        thread_id: The thread it is for, named in the error; ``None`` for ``default_ttl=``.

    Returns:
        The TTL as a float, or ``None``.

    Raises:
        InvalidTTLError: ``ttl`` is not a number, is NaN or infinite, negative, or longer than
            :data:`MAX_TTL_SECONDS`.
    """
    if ttl is None:
        return None
    what = "default_ttl" if thread_id is None else f"ttl of thread {thread_id!r}"
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise InvalidTTLError(
            f"{what} must be a number of seconds or None, got {type(ttl).__name__}"
        )
    value = float(ttl) if isinstance(ttl, float) or abs(ttl) <= MAX_TTL_SECONDS else math.inf
    if math.isnan(value) or math.isinf(value) or value < 0 or value > MAX_TTL_SECONDS:
        raise InvalidTTLError(
            f"{what} must be finite seconds in [0, {MAX_TTL_SECONDS:.0f}] (100 years), got "
            f"{ttl!r}; pass None to keep the thread without a TTL"
        )
    return value


class BaseCheckpointer(ABC):
    """The async storage contract every checkpoint backend implements.

    Required: :meth:`put`, :meth:`put_writes`, :meth:`get`, :meth:`list` and
    :meth:`delete_thread`. The rest have defaults that raise
    :class:`~graphexec.errors.NotSupportedError` where a backend cannot provide them.

    Heads: every ``(thread_id, checkpoint_ns)`` has a head, the newest checkpoint of its current
    branch. :meth:`put` is a compare-and-set on it, so two writers can never fork history
    silently. Leases: a run owns a thread through a :class:`Lease`; commits carrying a stale
    epoch are rejected.
    """

    snapshot_policy: SnapshotPolicy = SnapshotPolicy()
    """Consulted by the engine to decide when a checkpoint carries a full snapshot."""

    @abstractmethod
    async def put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        lease: Lease | None = None,
    ) -> None:
        """Commit a checkpoint and make it the head of its thread/namespace.

        Atomically: checks that the current head is ``expected_head`` (``None`` for a new
        thread or namespace) and raises :class:`~graphexec.errors.CheckpointConflictError`
        otherwise; checks ``lease`` (raises :class:`~graphexec.errors.LeaseLostError` when its
        epoch is stale, :class:`~graphexec.errors.ThreadBusyError` when ``lease`` is ``None``
        but another owner holds a live lease); stores the checkpoint; moves the head; and
        deletes the pending writes attached to ``checkpoint.parent_id`` (they are now part of
        this checkpoint). Re-putting an identical checkpoint id is an error.
        """

    async def put_final(
        self, checkpoint: Checkpoint, *, expected_head: str | None, lease: Lease
    ) -> None:
        """:meth:`put` the last checkpoint of a run, then :meth:`release_lease` its lease.

        If the put fails the lease is kept. Backends override this to do both in one
        transaction (one round trip); the default makes the two calls.
        """
        await self.put(checkpoint, expected_head=expected_head, lease=lease)
        await self.release_lease(lease)

    @abstractmethod
    async def put_writes(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        lease: Lease | None = None,
    ) -> None:
        """Save writes of one task of the step that follows ``checkpoint_id``.

        Idempotent: a write is keyed by ``(task_id, channel)``; putting it again replaces it.
        All writes of one call are saved atomically.
        """

    async def put_writes_final(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        lease: Lease,
    ) -> None:
        """:meth:`put_writes` the last writes of a run that pauses, then release its lease.

        For a run whose last store is pending writes rather than a checkpoint (it pauses on an
        interrupt): the writes, then :meth:`release_lease`. If the put fails the lease is kept.
        Backends override this to do both in one transaction (one round trip); the default
        makes the two calls.
        """
        await self.put_writes(thread_id, checkpoint_ns, checkpoint_id, task_id, writes, lease=lease)
        await self.release_lease(lease)

    async def put_with_writes_final(
        self,
        checkpoint: Checkpoint,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
        *,
        expected_head: str | None,
        lease: Lease,
    ) -> None:
        """:meth:`put` a checkpoint and :meth:`put_writes_final` of one of its tasks.

        For a run in ``exit`` durability that pauses: the checkpoint it held back and the
        interruption of the task that paused it are stored together. If the put fails nothing
        is written and the lease is kept. Backends override this to do all three in one
        transaction (one round trip); the default makes the calls one after another, so a
        failure of the second leaves the checkpoint stored without the writes, as the separate
        calls would.
        """
        await self.put(checkpoint, expected_head=expected_head, lease=lease)
        await self.put_writes_final(
            checkpoint.thread_id,
            checkpoint.checkpoint_ns,
            checkpoint.checkpoint_id,
            task_id,
            writes,
            lease=lease,
        )

    @abstractmethod
    async def get(
        self, thread_id: str, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointTuple | None:
        """The head (or the named checkpoint) with its delta chain and pending writes.

        Returns ``None`` when the thread/namespace or checkpoint does not exist.
        """

    async def get_since(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, *, known: str
    ) -> CheckpointTuple | None:
        """Like :meth:`get`, for a reader that already holds the values of checkpoint ``known``.

        The chain may then stop early: walking back from the requested checkpoint, it ends at
        the nearest snapshot as usual, or just after ``known`` if that comes first -- its first
        element (or the checkpoint itself) is then ``known``'s child, without a snapshot -- or
        it is empty when the requested checkpoint is ``known``. Callers fold the chain onto
        their values of ``known`` in those cases (checkpoints never change once stored, so
        values held for an id can never be stale). The default is :meth:`get`, which is
        always a correct answer.
        """
        return await self.get(thread_id, checkpoint_ns, checkpoint_id)

    @abstractmethod
    async def list(
        self,
        thread_id: str,
        checkpoint_ns: str = "",
        *,
        limit: int | None = None,
        before: str | None = None,
    ) -> Sequence[Checkpoint]:
        """Checkpoints along the current branch (head and its ancestors), newest first.

        ``before`` starts the listing at that checkpoint's parent.
        """

    @abstractmethod
    async def delete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, pending write and lease of the thread (all namespaces)."""

    async def list_tips(self, thread_id: str, checkpoint_ns: str = "") -> Sequence[Checkpoint]:
        """Every checkpoint without children (one per branch), newest first."""
        raise NotSupportedError(f"{type(self).__name__} does not support list_tips()")

    async def list_threads(self) -> Sequence[ThreadInfo]:
        """Every thread with a root-namespace head, most recently updated first."""
        raise NotSupportedError(f"{type(self).__name__} does not support list_threads()")

    async def prune(
        self,
        thread_id: str,
        *,
        keep_last: int,
        rebase: tuple[str, Mapping[str, bytes]] | None = None,
    ) -> int:
        """Keep the last ``keep_last`` checkpoints of the current branch; delete the rest.

        Checkpoints older than those are kept only as far back as the retained ones need to be
        read (back to the nearest snapshot), so pruning never leaves a retained checkpoint
        unreadable. Other branches are deleted. Applies to every namespace of the thread.

        Args:
            thread_id: The thread.
            keep_last: How many checkpoints of the current branch to keep (>= 1).
            rebase: ``(checkpoint_id, snapshot)``: a full snapshot for a root-namespace
                checkpoint (normally the oldest one retained), stored on it in the same
                transaction before retention is computed, so that nothing older has to be kept.
                Ignored if that checkpoint does not exist or already has a snapshot.

        Returns:
            How many checkpoints were deleted.
        """
        raise NotSupportedError(f"{type(self).__name__} does not support prune()")

    async def set_ttl(self, thread_id: str, ttl: float | None) -> None:
        """Delete the thread once ``ttl`` seconds pass without a commit (``None``: keep).

        ``ttl`` is checked by :func:`validate_ttl` (finite, 0 to 100 years): an
        :class:`~graphexec.errors.InvalidTTLError` otherwise, and nothing is stored.
        """
        raise NotSupportedError(f"{type(self).__name__} does not support thread TTLs")

    async def expire(self) -> int:
        """Delete every thread whose TTL has passed; returns how many were deleted."""
        raise NotSupportedError(f"{type(self).__name__} does not support thread TTLs")

    async def acquire_lease(self, thread_id: str, *, owner: str, ttl: float) -> Lease:
        """Take ownership of a thread for ``ttl`` seconds.

        Raises :class:`~graphexec.errors.ThreadBusyError` when another owner holds a live lease.
        An expired lease is taken over with a higher epoch.
        """
        raise NotSupportedError(f"{type(self).__name__} does not support leases")

    async def acquire_lease_and_get(
        self,
        thread_id: str,
        *,
        owner: str,
        ttl: float,
        checkpoint_id: str | None = None,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None]:
        """:meth:`acquire_lease`, then read the root namespace as a run starts.

        The read is :meth:`get` (:meth:`get_since` with ``known``) of ``checkpoint_id``, or of
        the head. If this raises, no lease is held. Backends override it to do both in one
        transaction (one round trip); the default makes the two calls.
        """
        lease = await self.acquire_lease(thread_id, owner=owner, ttl=ttl)
        try:
            if known is None:
                tup = await self.get(thread_id, "", checkpoint_id)
            else:
                tup = await self.get_since(thread_id, "", checkpoint_id, known=known)
        except BaseException:
            await self.release_lease(lease)
            raise
        return lease, tup

    async def acquire_lease_and_put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        owner: str,
        ttl: float,
        known: str | None = None,
    ) -> tuple[Lease, CheckpointTuple | None, bool]:
        """Start a run and commit its first checkpoint at once, if the thread is as expected.

        Takes the lease of ``checkpoint.thread_id`` like :meth:`acquire_lease`. Then, if the
        head of the root namespace is ``expected_head`` (``None``: the thread has no checkpoint
        yet), puts ``checkpoint`` under that lease (as :meth:`put` does) and returns
        ``(lease, None, True)``. Otherwise nothing is written but the lease, and the result is
        ``(lease, head, False)`` with the head read as :meth:`acquire_lease_and_get` reads it
        (``known`` as there). The engine uses this to start a run on a thread it believes new
        without a separate round trip for the lease; when the guess is wrong, it carries on
        from the returned head as if it had called :meth:`acquire_lease_and_get`.

        If this raises, no lease is held. A put that fails after the lease was taken may
        leave its outcome unknown (a lost connection), exactly like a failed :meth:`put`.
        Backends override this to do everything in one transaction; the default makes the
        calls one after another.
        """
        thread_id = checkpoint.thread_id
        check_run_start(checkpoint)
        lease, tup = await self.acquire_lease_and_get(thread_id, owner=owner, ttl=ttl, known=known)
        if (None if tup is None else tup.checkpoint.checkpoint_id) != expected_head:
            return lease, tup, False
        try:
            await self.put(checkpoint, expected_head=expected_head, lease=lease)
        except BaseException:
            await self.release_lease(lease)
            raise
        return lease, None, True

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """Extend a held lease; raises :class:`~graphexec.errors.LeaseLostError` if lost."""
        raise NotSupportedError(f"{type(self).__name__} does not support leases")

    async def release_lease(self, lease: Lease) -> None:
        """Give a lease up. Releasing a lease already lost is not an error."""
        raise NotSupportedError(f"{type(self).__name__} does not support leases")

    async def setup(self) -> None:  # noqa: B027 - optional hook; in-memory has nothing to do
        """Create or migrate storage. Idempotent; called by ``open()``."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook; in-memory holds nothing
        """Release connections and files."""
