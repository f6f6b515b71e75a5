"""Writing a run's checkpoints: staging the next one, building it, committing it.

:class:`CheckpointWriter` is the commit half of :class:`graphexec._executor.Run`: it turns a
step's deltas and next frontier into a :class:`~graphexec._checkpoint.Checkpoint` (with a
snapshot when the store's policy asks for one), stores it as the durability mode says (now, in
the background, or at the end for ``exit``), and keeps the run's head, last checkpoint and the
graph's values cache in step. The run's lease goes with its last store.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from graphexec._checkpoint import ChannelDelta, Checkpoint, new_checkpoint_id
from graphexec._taskrun import TaskRunner
from graphexec._tasks import Committer, Frontier, Task, task_id_for
from graphexec._types import Durability

if TYPE_CHECKING:
    from graphexec._graph import CompiledGraph

__all__ = ["CheckpointWriter"]


class CheckpointWriter(TaskRunner):
    """Stages, builds and commits checkpoints for a run. Attributes below come from ``Run``."""

    graph: CompiledGraph[Any]
    durability: Durability
    committer: Committer
    frontier: Frontier
    head: str | None
    last: Checkpoint | None
    user_metadata: dict[str, Any]
    parent_task_id: str | None
    lease_released: bool
    _exit_touched: dict[str, list[bytes] | None]
    _exit_parent: Checkpoint | None
    _exit_expected: str | None
    _exit_pending: tuple[str, str, dict[str, Any]] | None
    _exit_lock: asyncio.Lock | None
    _unsaved_answers: list[str]

    @property
    def _owns_lease(self) -> bool:
        """Whether this run holds the thread's lease itself (a root run, not a subgraph's).

        Then its last store -- the final checkpoint, or the interrupt that pauses it -- also
        releases the lease, in the same transaction.
        """
        return self.lease is not None and self.parent_task_id is None

    async def _commit(
        self,
        source: str,
        deltas: dict[str, ChannelDelta],
        frontier: Frontier,
        metadata: dict[str, Any],
    ) -> None:
        cp = self._stage(source, deltas, frontier, metadata)
        if cp is None:
            return
        expected = self.head
        self._adopt(cp)
        store, lease = self.cp, self.lease
        assert store is not None
        if lease is not None and self._owns_lease and not self.frontier.tasks:
            # The run's last commit: release the lease in the same transaction.
            async def final() -> None:
                await store.put_final(cp, expected_head=expected, lease=lease)
                self.lease_released = True

            await self.committer.submit(final)
        else:
            await self.committer.submit(lambda: store.put(cp, expected_head=expected, lease=lease))
        self._emit_checkpoint(cp)

    def _stage(
        self,
        source: str,
        deltas: dict[str, ChannelDelta],
        frontier: Frontier,
        metadata: dict[str, Any],
    ) -> Checkpoint | None:
        """Advance the run to its next checkpoint; return that checkpoint if it is stored now.

        ``None`` without a checkpointer, and in ``exit`` durability (which stores what it
        staged later, in :meth:`_flush_exit`).
        """
        checkpoint_id = new_checkpoint_id()
        self.step += 1
        frontier.tasks = [
            Task(
                t.node,
                t.push,
                t.index,
                t.arg,
                task_id_for(self.ns, checkpoint_id, t.node, t.push, t.index),
            )
            for t in frontier.tasks
        ]
        frontier.anchor = self.anchor
        self.frontier = frontier
        self.records = {}
        self._unsaved_answers.clear()  # answers held back were for the step this completes
        if self.cp is None:
            self.head = checkpoint_id
            return None
        # A subgraph run's input is stored at once even in exit durability: a resumed subgraph
        # rebuilds what it changed from the checkpoints after its input (_replay_changes), so
        # the input (values the parent passed in) must not be merged into them.
        if self.durability == "exit" and (source != "input" or self.parent_task_id is None):
            if self._exit_pending is None:
                self._exit_parent = self.last
                self._exit_expected = self.head
            for ch, d in deltas.items():
                prev = self._exit_touched.get(ch, [])
                self._exit_touched[ch] = (
                    None if d.op == "set" or prev is None else [*prev, *d.blobs]
                )
            self._exit_pending = (checkpoint_id, source, metadata)
            return None
        return self._build(checkpoint_id, source, deltas, frontier, metadata, self.last)

    def _adopt(self, cp: Checkpoint) -> None:
        """Make ``cp`` (stored, or queued to be) the run's head.

        With nothing left to run, it is also the settled head a next run can start from.
        """
        settled = None if self.frontier.tasks else cp
        self.graph.values_cache.put(
            cp.thread_id, self.ns, cp.checkpoint_id, self.values, settled=settled
        )
        self.head = cp.checkpoint_id
        self.last = cp

    def _emit_checkpoint(self, cp: Checkpoint) -> None:
        self.emitter.emit(
            "events",
            {
                "event": "checkpoint",
                "checkpoint_id": cp.checkpoint_id,
                "step": cp.step,
                "next": list(cp.next_nodes),
                "ns": self.ns,
            },
        )

    async def _flush_exit(
        self,
        *,
        final: bool = False,
        writes: tuple[str, list[tuple[str, bytes]]] | None = None,
    ) -> bool:
        """In ``exit`` durability, write one checkpoint with everything since the last one.

        ``final``: the run is over; a root run releases its lease in the same transaction.
        ``writes``: with ``final``, ``(task id, writes)`` of a task of the new checkpoint, stored
        in that transaction too (a run that pauses). Returns whether a checkpoint was written.
        """
        if self.durability != "exit" or self.cp is None or self._exit_pending is None:
            return False
        if self._exit_lock is None:
            self._exit_lock = asyncio.Lock()
        async with self._exit_lock:
            if self._exit_pending is None:
                return False
            checkpoint_id, source, metadata = self._exit_pending
            deltas: dict[str, ChannelDelta] = {}
            for ch, blobs in self._exit_touched.items():
                if blobs is None:
                    blob = self.serde.dumps(self.values[ch], channel=ch)
                    deltas[ch] = ChannelDelta("set", (blob,))
                else:
                    deltas[ch] = ChannelDelta("fold", tuple(blobs))
            cp = self._build(
                checkpoint_id, source, deltas, self.frontier, metadata, self._exit_parent
            )
            if final and self.lease is not None and self._owns_lease:
                if writes is None:
                    await self.cp.put_final(cp, expected_head=self._exit_expected, lease=self.lease)
                else:
                    await self.cp.put_with_writes_final(
                        cp, *writes, expected_head=self._exit_expected, lease=self.lease
                    )
                self.lease_released = True
            else:
                assert writes is None, "writes go with a final flush"
                await self.cp.put(cp, expected_head=self._exit_expected, lease=self.lease)
            self.graph.values_cache.put(cp.thread_id, self.ns, checkpoint_id, self.values)
            self._exit_touched = {}
            self._exit_parent = None
            self._exit_pending = None
            self.head = checkpoint_id
            self.last = cp
            return True

    def _build(
        self,
        checkpoint_id: str,
        source: str,
        deltas: dict[str, ChannelDelta],
        frontier: Frontier,
        metadata: dict[str, Any],
        parent: Checkpoint | None,
    ) -> Checkpoint:
        assert self.cp is not None and self.thread_id is not None
        policy = self.cp.snapshot_policy
        added = sum(d.nbytes for d in deltas.values())
        if parent is None:
            depth, delta_bytes, snapshot_bytes = 0, 0, 0
            want = True
        else:
            depth = parent.delta_depth + 1
            delta_bytes = parent.delta_bytes + added
            snapshot_bytes = parent.snapshot_bytes
            want = policy.wants_snapshot(
                depth=depth, delta_bytes=delta_bytes, snapshot_bytes=snapshot_bytes
            )
        snapshot: dict[str, bytes] | None = None
        if want:
            snapshot = {}
            for ch, value in self.values.items():
                d = deltas.get(ch)
                snapshot[ch] = (
                    d.blobs[0]
                    if d is not None and d.op == "set"
                    else self.serde.dumps(value, channel=ch)
                )
            depth, delta_bytes = 0, 0
            snapshot_bytes = sum(len(b) for b in snapshot.values())
            if self.parent_task_id is None:
                # Reads start from the snapshot, so the reducer updates it already contains would
                # only be stored twice (in exit durability: a whole run's worth). Subgraph runs
                # keep them: the parent rebuilds a resumed subgraph's changes from its deltas.
                deltas = {ch: d for ch, d in deltas.items() if d.op == "set"}
        meta: dict[str, Any] = {
            **self.user_metadata,
            **metadata,
            "source": source,
            "step": self.step,
            "run_id": self.run_id,
        }
        if self.parent_task_id is not None:
            meta["parent_task"] = self.parent_task_id
        return Checkpoint(
            thread_id=self.thread_id,
            checkpoint_ns=self.ns,
            checkpoint_id=checkpoint_id,
            parent_id=None if parent is None else parent.checkpoint_id,
            step=self.step,
            source=source,  # type: ignore[arg-type]
            created_at=datetime.now(UTC),
            graph_version=self.spec.version,
            deltas=deltas,
            snapshot=snapshot,
            frontier=self.graph.encode_frontier(frontier),
            next_nodes=tuple(t.node for t in frontier.tasks),
            metadata=meta,
            delta_depth=depth,
            delta_bytes=delta_bytes,
            snapshot_bytes=snapshot_bytes,
        )
