"""Reading threads: checkpoints folded into state values, snapshots and history.

:class:`ThreadReader` is the read side of :class:`~graphexec.CompiledGraph` (its base class):
it turns stored checkpoints -- a snapshot plus deltas -- back into channel values with the
graph's reducers, encodes and decodes frontiers, and answers ``get_state`` and
``get_state_history``. Running, time travel and thread administration live in ``_graph.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphexec._builder import GraphSpec
from graphexec._checkpoint import (
    BaseCheckpointer,
    Checkpoint,
    CheckpointTuple,
    ValuesCache,
    detach,
)
from graphexec._records import decode_records
from graphexec._serde import Serializer
from graphexec._state import _MISSING, RemoveMessage
from graphexec._sync import run_sync
from graphexec._tasks import Frontier, Task, task_id_for
from graphexec._types import Interruption, StateSnapshot, TaskInfo
from graphexec.errors import CheckpointError, GraphExecError

__all__ = ["Prefetched", "ThreadReader"]

Prefetched = tuple[CheckpointTuple | None, tuple[str, dict[str, Any]] | None]
"""A run's starting checkpoint read with its lease, and the cached values the read assumed."""


class ThreadReader:
    """The read side of a compiled graph: stored checkpoints back into state.

    Args:
        spec: The validated graph.
        checkpointer: Where the graph's threads are stored, if anywhere.
    """

    def __init__(self, spec: GraphSpec, checkpointer: BaseCheckpointer | None) -> None:
        self.spec = spec
        self.checkpointer = checkpointer
        self.values_cache = ValuesCache()
        """Values of each recently used thread's head (see :class:`ValuesCache`)."""
        self.serde = Serializer()
        self.serde.register(RemoveMessage, name="graphexec.RemoveMessage")
        self.serde.register_schema(spec.schema.schema)

    # -- encoding ---------------------------------------------------------------------------

    def encode_frontier(self, frontier: Frontier) -> bytes:
        """Serialize next tasks and join barriers for a checkpoint."""
        tasks = [[t.node, t.push, t.index, t.arg] for t in frontier.tasks]
        barriers = [[i, seen] for i, seen in sorted(frontier.barriers.items())]
        data: dict[str, Any] = {"t": tasks, "b": barriers}
        if frontier.anchor is not None and tasks:
            # 16 raw bytes, not 32 hex characters: it is stored with every checkpoint. A
            # frontier without tasks needs none: nothing resumes from it.
            data["k"] = bytes.fromhex(frontier.anchor)
        return self.serde.dumps(data, channel="__frontier__")

    def decode_frontier(self, checkpoint: Checkpoint) -> Frontier:
        """The frontier stored in ``checkpoint``, with task ids derived from its id."""
        data = self.serde.loads(checkpoint.frontier, channel="__frontier__")
        ns, cid = checkpoint.checkpoint_ns, checkpoint.checkpoint_id
        tasks = [
            Task(node, push, index, arg, task_id_for(ns, cid, node, push, index))
            for node, push, index, arg in data["t"]
        ]
        anchor = data.get("k")
        return Frontier(
            tasks,
            {int(i): list(seen) for i, seen in data["b"]},
            anchor.hex() if isinstance(anchor, bytes) else None,
        )

    def materialize(
        self, tup: CheckpointTuple, known: tuple[str, Mapping[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Channel values at ``tup.checkpoint``: its nearest snapshot plus the deltas since.

        Updates of concatenating reducers (``operator.add`` on lists, ``add_messages``) are
        gathered across the whole chain and folded with one reducer call, so a read costs
        O(state) rather than O(deltas x state).

        ``known`` is ``(checkpoint_id, values)`` the caller already holds (``tup`` then comes
        from :meth:`~graphexec.BaseCheckpointer.get_since`): when the chain reaches that
        checkpoint before a snapshot, only the deltas after it are folded, onto a detached copy
        of its values.
        """
        chain = [*tup.chain, tup.checkpoint]
        if known is not None:
            known_id, known_values = known
            for i in range(len(chain) - 1, -1, -1):
                link = chain[i]
                if link.checkpoint_id == known_id or link.parent_id == known_id:
                    start = i + 1 if link.checkpoint_id == known_id else i
                    values = detach(known_values)
                    folds: dict[str, list[Any]] = {}
                    for cp in chain[start:]:
                        self._fold_deltas(values, cp, folds)
                    self._flush_folds(values, folds)
                    return values
                if link.snapshot is not None:
                    break
        base = chain[0]
        if base.snapshot is None:
            raise CheckpointError(
                f"thread {base.thread_id!r}: checkpoint {base.checkpoint_id!r} should carry a "
                "snapshot but does not; the stored history is incomplete"
            )
        values = {ch: self.serde.loads(b, channel=ch) for ch, b in base.snapshot.items()}
        pending: dict[str, list[Any]] = {}
        for cp in chain[1:]:
            self._fold_deltas(values, cp, pending)
        self._flush_folds(values, pending)
        return values

    def apply_deltas(self, values: dict[str, Any], cp: Checkpoint) -> None:
        """Fold one checkpoint's deltas into ``values`` (in place)."""
        pending: dict[str, list[Any]] = {}
        self._fold_deltas(values, cp, pending)
        self._flush_folds(values, pending)

    def _fold_deltas(
        self, values: dict[str, Any], cp: Checkpoint, pending: dict[str, list[Any]]
    ) -> None:
        if cp.snapshot is not None:
            pending.clear()
            values.clear()
            values.update({ch: self.serde.loads(b, channel=ch) for ch, b in cp.snapshot.items()})
            return
        channels = self.spec.schema.channels
        for ch, delta in cp.deltas.items():
            if delta.op == "set":
                pending.pop(ch, None)
                values[ch] = self.serde.loads(delta.blobs[0], channel=ch)
                continue
            spec = channels.get(ch)
            if spec is None or spec.reducer is None:
                raise CheckpointError(
                    f"thread {cp.thread_id!r}, checkpoint {cp.checkpoint_id!r}: state key "
                    f"{ch!r} was stored as reducer updates, but the current schema has no "
                    "reducer for it; restore the reducer or migrate the thread"
                )
            updates = [self.serde.loads(blob, channel=ch) for blob in delta.blobs]
            if spec.batchable:
                pending.setdefault(ch, []).extend(updates)
                continue
            for update in updates:
                values[ch] = spec.reduce("__read__", values.get(ch, _MISSING), update)

    def _flush_folds(self, values: dict[str, Any], pending: dict[str, list[Any]]) -> None:
        channels = self.spec.schema.channels
        for ch, updates in pending.items():
            spec = channels[ch]
            values[ch] = spec.reduce("__read__", values.get(ch, _MISSING), spec.concat(updates))
        pending.clear()

    # -- argument handling ------------------------------------------------------------------

    def _thread(
        self,
        thread_id: str | None,
        checkpoint_id: str | None,
        config: Mapping[str, Any] | None,
        *,
        required: bool,
    ) -> tuple[str | None, str | None]:
        if config is not None:
            conf = config.get("configurable", {})
            if not isinstance(conf, Mapping):
                raise GraphExecError("config['configurable'] must be a dict")
            for key, given in (("thread_id", thread_id), ("checkpoint_id", checkpoint_id)):
                other = conf.get(key)
                if other is not None and given is not None and other != given:
                    raise GraphExecError(
                        f"{key} given twice with different values ({given!r} and "
                        f"config {other!r}); pass it once"
                    )
            thread_id = thread_id if thread_id is not None else conf.get("thread_id")
            checkpoint_id = (
                checkpoint_id if checkpoint_id is not None else conf.get("checkpoint_id")
            )
        if thread_id is not None:
            if not isinstance(thread_id, str) or not thread_id:
                raise GraphExecError(f"thread_id must be a non-empty string, got {thread_id!r}")
            if self.checkpointer is None:
                raise GraphExecError(
                    f"thread_id={thread_id!r} needs a checkpointer: "
                    "compile(checkpointer=InMemoryCheckpointer()) or a durable one"
                )
        elif required or (self.checkpointer is not None and checkpoint_id is not None):
            raise GraphExecError("pass thread_id= (or config={'configurable': {'thread_id': ...}})")
        elif self.checkpointer is not None:
            raise GraphExecError(
                "this graph has a checkpointer, so every run belongs to a thread: pass thread_id="
            )
        return thread_id, checkpoint_id

    def _store(self) -> BaseCheckpointer:
        if self.checkpointer is None:
            raise GraphExecError("this graph was compiled without a checkpointer")
        return self.checkpointer

    # -- reading state ----------------------------------------------------------------------

    def _snapshot(
        self, cp: Checkpoint, values: dict[str, Any], tup: CheckpointTuple | None = None
    ) -> StateSnapshot:
        interruptions: list[Interruption] = []
        tasks: list[TaskInfo] = []
        if tup is not None:
            frontier = self.decode_frontier(cp)
            records = decode_records(self.serde, tup, frontier)
            for t in frontier.tasks:
                rec = records.get(t.task_id)
                waiting = tuple(rec.unanswered()) if rec is not None else ()
                finished = rec is not None and rec.done is not None
                tasks.append(TaskInfo(t.task_id, t.node, finished, waiting))
                interruptions += waiting
            after = records.get("__after__")
            if after is not None:
                interruptions += after.unanswered()
        return StateSnapshot(
            values=values,
            next=cp.next_nodes,
            checkpoint_id=cp.checkpoint_id,
            parent_id=cp.parent_id,
            step=cp.step,
            created_at=cp.created_at,
            metadata=dict(cp.metadata),
            interruptions=tuple(interruptions),
            thread_id=cp.thread_id,
            tasks=tuple(tasks),
        )

    async def aget_state(
        self,
        thread_id: str | None = None,
        *,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> StateSnapshot | None:
        """The thread's latest state (or the state at ``checkpoint_id``); ``None`` if unknown."""
        thread, cid = self._thread(thread_id, checkpoint_id, config, required=True)
        assert thread is not None
        tup, values = await self.load_values(self._store(), thread, "", cid)
        if tup is None:
            return None
        return self._snapshot(tup.checkpoint, values, tup)

    async def load_values(
        self,
        store: BaseCheckpointer,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str | None,
        prefetched: Prefetched | None = None,
    ) -> tuple[CheckpointTuple | None, dict[str, Any]]:
        """A checkpoint (the head by default) and its values, folding from cached values.

        ``prefetched`` is that checkpoint already read, with the cached values its read was
        given as ``known``. The values are the caller's own (detached from the cache). A head
        read refreshes the cache.
        """
        if prefetched is not None:
            tup, known = prefetched
        else:
            known = self.values_cache.get(thread_id, checkpoint_ns)
            if known is None:
                tup = await store.get(thread_id, checkpoint_ns, checkpoint_id)
            else:
                tup = await store.get_since(thread_id, checkpoint_ns, checkpoint_id, known=known[0])
        if tup is None:
            return None, {}
        values = self.materialize(tup, known)
        if tup.is_head:
            cp = tup.checkpoint
            settled = cp if not cp.next_nodes and not tup.pending_writes else None
            self.values_cache.put(
                thread_id, checkpoint_ns, cp.checkpoint_id, values, settled=settled
            )
        return tup, values

    def get_state(
        self,
        thread_id: str | None = None,
        *,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> StateSnapshot | None:
        """Sync twin of :meth:`aget_state`."""
        return run_sync(
            self.aget_state(thread_id, checkpoint_id=checkpoint_id, config=config),
            what="get_state",
        )

    async def aget_state_history(
        self,
        thread_id: str | None = None,
        *,
        limit: int | None = None,
        before: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> list[StateSnapshot]:
        """States along the thread's current branch, newest first.

        Args:
            thread_id: The thread.
            limit: At most this many.
            before: Start below this checkpoint id (for paging).
            config: LangGraph-style thread selection.
        """
        thread, _ = self._thread(thread_id, None, config, required=True)
        assert thread is not None
        if limit is not None and limit < 1:
            raise GraphExecError(f"limit must be >= 1, got {limit}")
        store = self._store()
        cps = list(await store.list(thread, "", limit=limit, before=before))
        if not cps:
            return []
        oldest = cps[-1]
        tup = await store.get(thread, "", oldest.checkpoint_id)
        if tup is None:
            raise CheckpointError(
                f"thread {thread!r}: checkpoint {oldest.checkpoint_id!r} vanished while reading"
            )
        values = self.materialize(tup)
        out = [self._snapshot(oldest, dict(values), tup)]
        for cp in reversed(cps[:-1]):
            self.apply_deltas(values, cp)
            out.append(self._snapshot(cp, dict(values)))
        out.reverse()
        return out

    def get_state_history(
        self,
        thread_id: str | None = None,
        *,
        limit: int | None = None,
        before: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> list[StateSnapshot]:
        """Sync twin of :meth:`aget_state_history`."""
        return run_sync(
            self.aget_state_history(thread_id, limit=limit, before=before, config=config),
            what="get_state_history",
        )
