"""The in-memory checkpointer: the reference implementation of the contract."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from graphexec._checkpoint import (
    BaseCheckpointer,
    Checkpoint,
    CheckpointTuple,
    Lease,
    PendingWrite,
    SnapshotPolicy,
    ThreadInfo,
    validate_ttl,
)
from graphexec._serde import default_serializer
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    LeaseLostError,
    ThreadBusyError,
)

__all__ = ["InMemoryCheckpointer"]

_Key = tuple[str, str]


_metadata_serde = default_serializer()


def _copy(cp: Checkpoint) -> Checkpoint:
    """A copy sharing nothing mutable with ``cp`` (blobs are immutable bytes).

    Metadata is copied through the serializer, which is faster than ``deepcopy`` and refuses
    values a durable backend could not store either. The copy is built with the constructor:
    ``dataclasses.replace`` would cost as much again.
    """
    return Checkpoint(
        thread_id=cp.thread_id,
        checkpoint_ns=cp.checkpoint_ns,
        checkpoint_id=cp.checkpoint_id,
        parent_id=cp.parent_id,
        step=cp.step,
        source=cp.source,
        created_at=cp.created_at,
        graph_version=cp.graph_version,
        deltas=dict(cp.deltas),
        snapshot=None if cp.snapshot is None else dict(cp.snapshot),
        frontier=cp.frontier,
        next_nodes=cp.next_nodes,
        metadata=_metadata_serde.loads(
            _metadata_serde.dumps(dict(cp.metadata), channel="__metadata__")
        ),
        delta_depth=cp.delta_depth,
        delta_bytes=cp.delta_bytes,
        snapshot_bytes=cp.snapshot_bytes,
    )


def _after(cp: Checkpoint, known: str | None) -> bool:
    """Whether a chain walk for a reader holding ``known``'s values can stop at ``cp``."""
    return known is not None and known in (cp.checkpoint_id, cp.parent_id)


class InMemoryCheckpointer(BaseCheckpointer):
    """Keeps checkpoints in process memory; lost when the process exits.

    It implements the whole contract, leases included, and is what every durable backend is
    compared against. Stored values are bytes and frozen records, so nothing a caller holds
    aliases stored state. Safe to share between threads and event loops.

    Args:
        snapshot_policy: Override when full snapshots are stored (mostly for tests).
    """

    def __init__(self, *, snapshot_policy: SnapshotPolicy | None = None) -> None:
        if snapshot_policy is not None:
            self.snapshot_policy = snapshot_policy
        self._lock = threading.Lock()
        self._checkpoints: dict[_Key, dict[str, Checkpoint]] = {}
        self._heads: dict[_Key, str] = {}
        self._writes: dict[tuple[str, str, str], dict[tuple[str, str], bytes]] = {}
        self._leases: dict[str, Lease] = {}
        self._epochs: dict[str, int] = {}
        self._ttls: dict[str, float] = {}
        self._touched: dict[str, float] = {}

    # -- writes ---------------------------------------------------------------------------

    def _check_lease(self, thread_id: str, lease: Lease | None) -> None:
        current = self._leases.get(thread_id)
        if lease is not None:
            if lease.thread_id != thread_id:
                raise CheckpointError(
                    f"lease for thread {lease.thread_id!r} used to write thread {thread_id!r}"
                )
            if current is None or current.epoch != lease.epoch:
                raise LeaseLostError(
                    f"thread {thread_id!r}: this run's lease (epoch {lease.epoch}) was lost to "
                    "another owner; its write was rejected",
                    thread_id=thread_id,
                    epoch=lease.epoch,
                )
        elif current is not None and current.expires_at > time.time():
            raise ThreadBusyError(
                f"thread {thread_id!r} is owned by run {current.owner!r}; wait for it to finish "
                "or for its lease to expire",
                thread_id=thread_id,
                owner=current.owner,
            )

    async def put(
        self,
        checkpoint: Checkpoint,
        *,
        expected_head: str | None,
        lease: Lease | None = None,
    ) -> None:
        """See :meth:`BaseCheckpointer.put`."""
        key = (checkpoint.thread_id, checkpoint.checkpoint_ns)
        if checkpoint.parent_id is None and checkpoint.snapshot is None:
            raise CheckpointError(
                f"thread {checkpoint.thread_id!r}: checkpoint {checkpoint.checkpoint_id!r} has "
                "no parent, so it must carry a snapshot"
            )
        stored = _copy(checkpoint)
        with self._lock:
            self._check_lease(checkpoint.thread_id, lease)
            head = self._heads.get(key)
            if head != expected_head:
                raise CheckpointConflictError(
                    f"thread {checkpoint.thread_id!r}: expected head {expected_head!r} but the "
                    f"head is {head!r}; another run committed first. Reload the thread and retry.",
                    thread_id=checkpoint.thread_id,
                    expected_head=expected_head,
                    actual_head=head,
                )
            by_id = self._checkpoints.setdefault(key, {})
            if checkpoint.checkpoint_id in by_id:
                raise CheckpointError(
                    f"thread {checkpoint.thread_id!r}: checkpoint "
                    f"{checkpoint.checkpoint_id!r} already exists"
                )
            if checkpoint.parent_id is not None and checkpoint.parent_id not in by_id:
                raise CheckpointError(
                    f"thread {checkpoint.thread_id!r}: parent checkpoint "
                    f"{checkpoint.parent_id!r} does not exist"
                )
            by_id[checkpoint.checkpoint_id] = stored
            self._heads[key] = checkpoint.checkpoint_id
            self._touched[checkpoint.thread_id] = time.time()
            if checkpoint.parent_id is not None:
                self._writes.pop((*key, checkpoint.parent_id), None)

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
        """See :meth:`BaseCheckpointer.put_writes`."""
        with self._lock:
            self._check_lease(thread_id, lease)
            if checkpoint_id not in self._checkpoints.get((thread_id, checkpoint_ns), {}):
                raise CheckpointError(
                    f"thread {thread_id!r}: cannot save writes for unknown checkpoint "
                    f"{checkpoint_id!r}"
                )
            bucket = self._writes.setdefault((thread_id, checkpoint_ns, checkpoint_id), {})
            for channel, data in writes:
                bucket[(task_id, channel)] = bytes(data)

    # -- reads ----------------------------------------------------------------------------

    async def get(
        self, thread_id: str, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointTuple | None:
        """See :meth:`BaseCheckpointer.get`."""
        return self._get(thread_id, checkpoint_ns, checkpoint_id, None)

    async def get_since(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, *, known: str
    ) -> CheckpointTuple | None:
        """See :meth:`BaseCheckpointer.get_since`."""
        return self._get(thread_id, checkpoint_ns, checkpoint_id, known)

    def _get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, known: str | None
    ) -> CheckpointTuple | None:
        key = (thread_id, checkpoint_ns)
        with self._lock:
            by_id = self._checkpoints.get(key)
            if not by_id:
                return None
            head = self._heads[key]
            cid = head if checkpoint_id is None else checkpoint_id
            cp = by_id.get(cid)
            if cp is None:
                return None
            chain: list[Checkpoint] = []
            cursor = cp
            while cursor.snapshot is None and not _after(cursor, known):
                if cursor.parent_id is None:
                    raise CheckpointError(
                        f"thread {thread_id!r}: checkpoint {cid!r} has no snapshot in its "
                        "ancestry; storage is corrupt"
                    )
                parent = by_id.get(cursor.parent_id)
                if parent is None:
                    raise CheckpointError(
                        f"thread {thread_id!r}: checkpoint {cursor.parent_id!r}, needed to "
                        f"read {cid!r}, is missing"
                    )
                chain.append(parent)
                cursor = parent
            chain.reverse()
            writes = tuple(
                PendingWrite(task_id, channel, data)
                for (task_id, channel), data in self._writes.get((*key, cid), {}).items()
            )
            return CheckpointTuple(
                _copy(cp), tuple(_copy(c) for c in chain), writes, is_head=cid == head
            )

    async def list(
        self,
        thread_id: str,
        checkpoint_ns: str = "",
        *,
        limit: int | None = None,
        before: str | None = None,
    ) -> Sequence[Checkpoint]:
        """See :meth:`BaseCheckpointer.list`."""
        key = (thread_id, checkpoint_ns)
        out: list[Checkpoint] = []
        with self._lock:
            by_id = self._checkpoints.get(key, {})
            cid: str | None = self._heads.get(key)
            if before is not None:
                start = by_id.get(before)
                cid = None if start is None else start.parent_id
            while cid is not None and (limit is None or len(out) < limit):
                cp = by_id.get(cid)
                if cp is None:
                    break
                out.append(_copy(cp))
                cid = cp.parent_id
        return out

    async def list_tips(self, thread_id: str, checkpoint_ns: str = "") -> Sequence[Checkpoint]:
        """See :meth:`BaseCheckpointer.list_tips`."""
        with self._lock:
            by_id = self._checkpoints.get((thread_id, checkpoint_ns), {})
            parents = {cp.parent_id for cp in by_id.values()}
            tips = [_copy(cp) for cid, cp in by_id.items() if cid not in parents]
        return sorted(tips, key=lambda c: (c.created_at, c.checkpoint_id), reverse=True)

    async def list_threads(self) -> Sequence[ThreadInfo]:
        """See :meth:`BaseCheckpointer.list_threads`."""
        with self._lock:
            infos = []
            for (thread_id, ns), head in self._heads.items():
                if ns:
                    continue
                by_id = self._checkpoints[(thread_id, ns)]
                cp = by_id[head]
                infos.append(
                    ThreadInfo(thread_id, head, cp.step, cp.created_at, cp.next_nodes, len(by_id))
                )
        return sorted(infos, key=lambda t: (t.updated_at, t.thread_id), reverse=True)

    # -- retention ------------------------------------------------------------------------

    async def delete_thread(self, thread_id: str) -> None:
        """See :meth:`BaseCheckpointer.delete_thread`."""
        with self._lock:
            self._forget(thread_id)

    def _forget(self, thread_id: str) -> None:
        for key in [k for k in self._checkpoints if k[0] == thread_id]:
            del self._checkpoints[key]
            self._heads.pop(key, None)
        for wkey in [k for k in self._writes if k[0] == thread_id]:
            del self._writes[wkey]
        current = self._leases.pop(thread_id, None)
        if current is not None:  # the epoch survives, so a stale owner stays fenced off
            self._epochs[thread_id] = max(self._epochs.get(thread_id, 0), current.epoch)
        self._ttls.pop(thread_id, None)
        self._touched.pop(thread_id, None)

    async def set_ttl(self, thread_id: str, ttl: float | None) -> None:
        """See :meth:`BaseCheckpointer.set_ttl`."""
        ttl = validate_ttl(ttl, thread_id=thread_id)
        with self._lock:
            if ttl is None:
                self._ttls.pop(thread_id, None)
            else:
                self._ttls[thread_id] = ttl
                self._touched.setdefault(thread_id, time.time())

    async def expire(self) -> int:
        """See :meth:`BaseCheckpointer.expire` (a thread with a live lease is kept)."""
        now = time.time()
        with self._lock:
            doomed = [
                t
                for t, ttl in self._ttls.items()
                if self._touched.get(t, now) + ttl <= now
                and not (t in self._leases and self._leases[t].expires_at > now)
            ]
            for t in doomed:
                self._forget(t)
        return len(doomed)

    async def prune(
        self,
        thread_id: str,
        *,
        keep_last: int,
        rebase: tuple[str, Mapping[str, bytes]] | None = None,
    ) -> int:
        """See :meth:`BaseCheckpointer.prune`."""
        if keep_last < 1:
            raise ValueError(f"prune(keep_last={keep_last}): keep at least 1 checkpoint")
        deleted = 0
        with self._lock:
            if rebase is not None:
                root = self._checkpoints.get((thread_id, ""), {})
                target = root.get(rebase[0])
                if target is not None and target.snapshot is None:
                    snapshot = dict(rebase[1])
                    root[rebase[0]] = replace(
                        target,
                        snapshot=snapshot,
                        delta_depth=0,
                        delta_bytes=0,
                        snapshot_bytes=sum(len(b) for b in snapshot.values()),
                    )
            for key in [k for k in self._checkpoints if k[0] == thread_id]:
                by_id = self._checkpoints[key]
                keep: set[str] = set()
                cid: str | None = self._heads[key]
                # the last `keep_last` of the current branch ...
                while cid is not None and cid in by_id and len(keep) < keep_last:
                    keep.add(cid)
                    cid = by_id[cid].parent_id
                # ... and whatever their delta chains need, back to a snapshot. (A parent id
                # may already be gone: an earlier prune cut the history there.)
                for kept in list(keep):
                    cursor = by_id[kept]
                    while cursor.snapshot is None and cursor.parent_id in by_id:
                        assert cursor.parent_id is not None
                        keep.add(cursor.parent_id)
                        cursor = by_id[cursor.parent_id]
                for doomed in [c for c in by_id if c not in keep]:
                    del by_id[doomed]
                    self._writes.pop((*key, doomed), None)
                    deleted += 1
        return deleted

    # -- leases ---------------------------------------------------------------------------

    async def acquire_lease(self, thread_id: str, *, owner: str, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.acquire_lease`."""
        now = time.time()
        with self._lock:
            current = self._leases.get(thread_id)
            if current is not None and current.expires_at > now and current.owner != owner:
                raise ThreadBusyError(
                    f"thread {thread_id!r} is owned by run {current.owner!r} until its lease "
                    "expires; retry later or pass on_busy='wait'",
                    thread_id=thread_id,
                    owner=current.owner,
                )
            epoch = self._epochs.get(thread_id, 0) + 1
            self._epochs[thread_id] = epoch
            lease = Lease(thread_id, owner, epoch, now + ttl)
            self._leases[thread_id] = lease
            return lease

    async def renew_lease(self, lease: Lease, *, ttl: float) -> Lease:
        """See :meth:`BaseCheckpointer.renew_lease`."""
        with self._lock:
            current = self._leases.get(lease.thread_id)
            if current is None or current.epoch != lease.epoch:
                raise LeaseLostError(
                    f"thread {lease.thread_id!r}: lease epoch {lease.epoch} was taken over",
                    thread_id=lease.thread_id,
                    epoch=lease.epoch,
                )
            renewed = replace(current, expires_at=time.time() + ttl)
            self._leases[lease.thread_id] = renewed
            return renewed

    async def release_lease(self, lease: Lease) -> None:
        """See :meth:`BaseCheckpointer.release_lease`."""
        with self._lock:
            current = self._leases.get(lease.thread_id)
            if current is not None and current.epoch == lease.epoch:
                del self._leases[lease.thread_id]
