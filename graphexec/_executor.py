"""The superstep executor: one ``Run`` drives one invocation of a graph on one thread.

A superstep runs every task of the frontier concurrently, then applies their writes in frontier
order (so results never depend on timing), computes the next frontier from edges, routes and
joins, and commits one checkpoint. Tasks that finish while others still run save their writes
at once, so after a crash only unfinished tasks run again. A step with an interrupted task is
not committed: the finished tasks' writes and the interrupts are saved, and the run pauses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import networkx as nx

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    CheckpointTuple,
    Lease,
    detach,
)
from graphexec._commits import CheckpointWriter
from graphexec._hitl import Answer, interrupt_id
from graphexec._records import (
    decode_records,
    encode_answers,
    encode_interrupts,
    encode_route,
    public_interrupt,
)
from graphexec._state import _MISSING
from graphexec._tasks import (
    AFTER,
    ATTEMPT,
    INTERRUPT,
    RESUME,
    ROUTE,
    UPDATES,
    Committer,
    Emitter,
    Frontier,
    Outcome,
    Task,
    TaskRecord,
    anchor_for,
    random_anchor,
)
from graphexec._types import END, START, Command, Durability, Interruption, Send
from graphexec.errors import (
    CheckpointNotFoundError,
    GraphVersionError,
    InvalidUpdateError,
    RecursionLimitError,
    TaskLimitError,
    ThreadNotFoundError,
)

if TYPE_CHECKING:
    from graphexec._builder import NodeSpec
    from graphexec._graph import CompiledGraph
    from graphexec._reader import Prefetched

__all__ = ["Run", "resume_error"]


class Run(CheckpointWriter):
    """One invocation of a graph on one thread and checkpoint namespace."""

    def __init__(
        self,
        graph: CompiledGraph[Any],
        *,
        thread_id: str | None,
        checkpoint_ns: str = "",
        run_id: str,
        durability: Durability,
        recursion_limit: int,
        emitter: Emitter,
        lease: Lease | None,
        parent_task_id: str | None = None,
        parent_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        checkpointer: BaseCheckpointer | None = None,
        memory: Any = None,
        incoming_answers: Mapping[str, Answer] | None = None,
    ) -> None:
        self.graph = graph
        self.spec = graph.spec
        self.schema = graph.spec.schema
        self.serde = graph.serde
        store = checkpointer if checkpointer is not None else graph.checkpointer
        self.cp = store if thread_id is not None else None
        self.memory = memory if memory is not None else graph.memory
        self.thread_id = thread_id
        self.ns = checkpoint_ns
        self.run_id = run_id
        self.durability = durability
        self.recursion_limit = recursion_limit
        self.emitter = emitter
        self.lease = lease
        self.parent_task_id = parent_task_id
        self.parent_key = parent_key
        """A subgraph run's parent task's idempotency key (its anchor derives from it)."""
        self.anchor: str | None = None
        """What this run's idempotency keys derive from (see ``idempotency_key_for``)."""
        self.incoming_answers = dict(incoming_answers or {})
        self.user_metadata = dict(metadata or {})
        self.committer = Committer(durability)
        self.values: dict[str, Any] = {}
        self.frontier = Frontier()
        self.head: str | None = None
        self.last: Checkpoint | None = None
        self.step = -1
        self.records: dict[str, TaskRecord] = {}
        self.interruptions: list[Interruption] = []
        self.rejected = False
        self.changes: dict[str, tuple[str, Any]] = {}
        self._exit_touched: dict[str, list[bytes] | None] = {}
        self._exit_parent: Checkpoint | None = None
        self._exit_expected: str | None = None
        self._exit_pending: tuple[str, str, dict[str, Any]] | None = None
        self._exit_lock: asyncio.Lock | None = None
        self._unsaved_answers: list[str] = []
        """Tasks whose answers ``exit`` durability has not stored yet (see record_answers)."""
        self.lease_released = False
        """Whether the run's last commit also released its lease (see ``put_final``)."""

    # -- loading ----------------------------------------------------------------------------

    async def load(
        self, checkpoint_id: str | None, prefetched: Prefetched | None = None
    ) -> CheckpointTuple | None:
        """Load the head (or the named checkpoint): values, frontier and task records.

        ``prefetched``: the checkpoint as read together with the run's lease.
        """
        if self.cp is None or self.thread_id is None:
            return None
        tup, values = await self.graph.load_values(
            self.cp, self.thread_id, self.ns, checkpoint_id, prefetched
        )
        if tup is None:
            if checkpoint_id is not None:
                raise CheckpointNotFoundError(
                    f"thread {self.thread_id!r} has no checkpoint {checkpoint_id!r}; list them "
                    "with get_state_history()",
                    thread_id=self.thread_id,
                    checkpoint_id=checkpoint_id,
                )
            return None
        self.values = values
        self.frontier = self.graph.decode_frontier(tup.checkpoint)
        self.last = tup.checkpoint
        self.step = tup.checkpoint.step
        if tup.is_head:
            self.head = tup.checkpoint.checkpoint_id
            # Continuing the thread: the tasks are the ones an earlier run began, keys included.
            self.anchor = self.frontier.anchor
        else:
            head = await self.cp.get(self.thread_id, self.ns)
            self.head = None if head is None else head.checkpoint.checkpoint_id
            # A replay from an earlier checkpoint is new work on a new branch: new keys.
            self.anchor = random_anchor()
        self.records = decode_records(self.graph.serde, tup, self.frontier)
        return tup

    def check_version(self) -> None:
        """Refuse to resume tasks of nodes the current graph no longer has."""
        if self.last is None or self.last.graph_version == self.spec.version:
            return
        missing = sorted({t.node for t in self.frontier.tasks if t.node not in self.spec.nodes})
        if missing:
            raise GraphVersionError(
                f"thread {self.thread_id!r} was checkpointed by another version of the graph "
                f"and its next nodes {missing} no longer exist; restore them, or move the "
                "thread on with update_state(..., as_node=...)",
                thread_id=self.thread_id or "",
                missing_nodes=missing,
            )

    def pending_interruptions(self) -> list[Interruption]:
        """Interrupts waiting for an answer at the loaded checkpoint, in task order."""
        order = {t.task_id: i for i, t in enumerate(self.frontier.tasks)}
        items = sorted(self.records.items(), key=lambda kv: order.get(kv[0], len(order)))
        return [i for _, rec in items for i in rec.unanswered()]

    async def record_answers(self, answers: Mapping[str, Answer]) -> None:
        """Store answers with the tasks whose interrupts they answer (durably, first).

        In ``exit`` durability they are held back like everything else the run does: stored
        with the run's pause or failure, or before an effect runs (:meth:`_make_durable`), and
        never once the step they answer has completed -- its checkpoint carries what the
        answers produced, and storing it drops its parent's pending writes anyway. A crash
        before then loses them with the rest of the run: the thread is still waiting for them.
        """
        owners: dict[str, str] = {}
        info: dict[str, tuple[str, str]] = {}
        for task_id, rec in self.records.items():
            for intr in rec.interrupts:
                owners[intr.id] = task_id
                info[intr.id] = (intr.node, intr.kind)
        touched: dict[str, TaskRecord] = {}
        for iid, answer in answers.items():
            task_id = owners[iid]
            rec = self.records[task_id]
            rec.answers[iid] = answer
            rec.answer_info[iid] = info[iid]
            touched[task_id] = rec
        for task_id, rec in touched.items():
            if self.durability != "exit":
                await self._persist_now(task_id, [(RESUME, encode_answers(self.serde, rec))])
            elif task_id not in self._unsaved_answers:
                self._unsaved_answers.append(task_id)

    # -- the loop ---------------------------------------------------------------------------

    async def start(self, input: Any, tup: CheckpointTuple | None) -> None:
        """Apply new input (or a ``Command``) as this thread's next checkpoint."""
        on = None if tup is None else tup.checkpoint.checkpoint_id
        deltas, frontier, metadata = await self._input_step(input, on)
        self.emitter.emit("values", dict(self.values))
        await self._commit("input", deltas, frontier, metadata)

    async def prepare_start(
        self, input: Any, settled: tuple[Checkpoint, Mapping[str, Any]] | None
    ) -> Checkpoint:
        """Apply ``input`` to a thread as the values cache knows it; return the checkpoint.

        ``settled`` is the thread's settled head and its values (see
        :meth:`~graphexec._checkpoint.ValuesCache.settled`), or ``None`` for a thread believed
        new. Writes nothing and emits nothing: :meth:`commit_start` stores the checkpoint, if
        that head is still the thread's head. If not, this ``Run`` must be dropped: its values
        were computed for a state the thread no longer has.
        """
        assert self.cp is not None and self.thread_id is not None
        assert self.durability != "exit" and self.lease is None and not self.ns
        on = None
        if settled is not None:
            head, values = settled
            on = self.head = head.checkpoint_id
            self.last = head
            self.step = head.step
            self.values = detach(values)
        deltas, frontier, metadata = await self._input_step(input, on)
        cp = self._stage("input", deltas, frontier, metadata)
        assert cp is not None
        return cp

    async def commit_start(
        self, cp: Checkpoint, *, ttl: float
    ) -> tuple[Lease, CheckpointTuple | None, bool]:
        """Take the run's lease and store ``cp`` (from :meth:`prepare_start`) at once.

        One storage call (:meth:`~graphexec.BaseCheckpointer.acquire_lease_and_put`) instead
        of a lease call, a read and a put. Returns its answer; when the head was not the one
        expected, nothing but the lease was written and the caller carries on from the
        returned head with a new ``Run``.
        """
        assert self.cp is not None
        expected = self.head
        lease, tup, committed = await self.cp.acquire_lease_and_put(
            cp, expected_head=expected, owner=self.run_id, ttl=ttl, known=expected
        )
        if committed:
            self.lease = lease
            self.emitter.emit("values", dict(self.values))
            self._adopt(cp)
            self._emit_checkpoint(cp)
        return lease, tup, committed

    async def _input_step(
        self, input: Any, on: str | None
    ) -> tuple[dict[str, ChannelDelta], Frontier, dict[str, Any]]:
        """Apply the input to the values of checkpoint ``on`` (``None``: a new thread).

        Returns what the input's checkpoint stores.
        """
        if on is None:
            self.values = self.schema.initial_values()
        if isinstance(input, Command):
            items = self.schema.coerce_update("__input__", input.update)
            writes = self._encode("__input__", list(items.items()))
            routes = self._check_routes("__input__", input.goto_targets())
            sources = [Outcome(Task("__input__", False, 0, None, ""), writes, routes)]
        else:
            items = self.schema.coerce_update("__input__", input)
            writes = self._encode("__input__", list(items.items()))
            sources = [Outcome(Task(START, False, 0, None, ""), writes, [])]
        deltas = self._apply(sources)
        if sources[0].task.node == START:
            sources[0].routes = await self._branch_routes(START, self.values, None)
        frontier = self._next_frontier(sources, Frontier())
        self.anchor = self._input_anchor(on, writes, sources[0].routes)
        return deltas, frontier, {"writes": {"__input__": _keys(writes)}}

    def _input_anchor(
        self,
        on: str | None,
        writes: Sequence[tuple[str, Any, bytes | None]],
        routes: Sequence[str | Send],
    ) -> str:
        """The anchor of a run that applies new input.

        Derived from durable facts only -- the thread, the checkpoint the input lands on (or,
        for a subgraph, the parent task's key) and the input's bytes -- so a run lost to a crash
        before any of its checkpoints was written (``exit`` durability), then started again
        with the same input, gives its tasks the same idempotency keys. Input on a checkpoint
        other than the head starts a branch: new work, a random anchor. So does a run with no
        checkpointer, which has no durable facts to derive from.
        """
        if self.cp is None or self.thread_id is None:
            return random_anchor()
        base = on or ""
        if on is not None and on != self.head:
            return random_anchor()
        parts: list[str | bytes] = [self.thread_id, self.ns, base, self.parent_key or ""]
        for ch, value, blob in writes:
            parts += [ch, blob if blob is not None else self.serde.dumps(value, channel=ch)]
        targets = [r if isinstance(r, str) else [r.node, r.arg] for r in routes]
        parts.append(self.serde.dumps(targets, channel="__input__"))
        return anchor_for(*parts)

    async def loop(self) -> None:
        """Run supersteps until the frontier is empty, a human is needed, or a task fails."""
        steps = 0
        executed: list[list[str]] = []
        while True:
            after = self.records.get(AFTER)
            if after is not None and after.unanswered():
                await self._pause(after.unanswered())
                return
            if not self.frontier.tasks:
                break
            if steps >= self.recursion_limit:
                await self.committer.flush()
                raise self._recursion_error(steps, executed)
            tasks = self.frontier.tasks
            if await self._breakpoints_before(tasks):
                return
            outcomes = await self._run_step(tasks)
            failed = [o for o in outcomes if o.error is not None]
            if failed:
                # Keep what finished: in exit durability the state so far is written first, so
                # the finished tasks' writes have a checkpoint to attach to.
                await self._flush_exit()
                await self._save_answers()
                await self._save_unsaved(outcomes, force=True)
                await self.committer.flush()
                raise failed[0].error  # type: ignore[misc]
            paused = [i for o in outcomes for i in o.interrupts]
            if paused:
                new = [
                    o
                    for o in outcomes
                    if o.interrupts and self._record(o.task.task_id).interrupts != o.interrupts
                ]
                if await self._pause_in_one_call(outcomes, new):
                    await self._pause(paused)
                    return
                await self._flush_exit()
                await self._save_unsaved(outcomes, force=True)
                for k, o in enumerate(new):
                    rec = self._record(o.task.task_id)
                    rec.interrupts = list(o.interrupts)
                    writes = [(INTERRUPT, encode_interrupts(self.serde, o.interrupts))]
                    if o.task.task_id in self._unsaved_answers:  # exit durability: with them
                        self._unsaved_answers.remove(o.task.task_id)
                        writes.insert(0, (RESUME, encode_answers(self.serde, rec)))
                    if k == len(new) - 1 and self._owns_lease:
                        await self._persist_final(o.task.task_id, writes)
                    else:
                        await self._persist_now(o.task.task_id, writes)
                await self._pause(paused)
                return
            executed.append([t.node for t in tasks])
            rejected = any(o.rejected for o in outcomes)
            try:
                # Before the writes are applied: a refused step leaves the values as the last
                # checkpoint has them, which is what exit durability stores below.
                frontier = Frontier() if rejected else self._next_frontier(outcomes, self.frontier)
            except TaskLimitError:
                await self._flush_exit()
                await self._save_answers()
                await self.committer.flush()
                raise
            deltas = self._apply(outcomes)
            if rejected:
                self.rejected = True
            meta: dict[str, Any] = {"writes": {o.task.node: _keys(o.writes) for o in outcomes}}
            decisions = self._decisions(tasks)
            if decisions:
                meta["decisions"] = decisions
            if self.emitter.wants("values"):
                self.emitter.emit("values", dict(self.values))
            await self._commit("loop", deltas, frontier, meta)
            steps += 1
            if await self._breakpoints_after(tasks):
                return
        await self._flush_exit(final=True)
        await self.committer.flush()

    async def _pause_in_one_call(self, outcomes: Sequence[Outcome], new: Sequence[Outcome]) -> bool:
        """``exit`` durability: a pausing run's last stores in one call, if that is all of them.

        The checkpoint held back, the one new interruption and the lease release go in one
        ``put_with_writes_final`` when nothing else is left to store: one task newly
        interrupted, every other outcome saved or interrupted. Returns whether it stored them;
        if not, nothing is written and the run pauses the usual way (the checkpoint, then each
        task's writes).
        """
        if (
            self.durability != "exit"
            or self._unsaved_answers
            or len(new) != 1
            or not self._owns_lease
            or any(o.error is None and not o.saved and not o.interrupts for o in outcomes)
        ):
            return False
        (o,) = new
        blob = encode_interrupts(self.serde, o.interrupts)
        if not await self._flush_exit(final=True, writes=(o.task.task_id, [(INTERRUPT, blob)])):
            return False
        self._record(o.task.task_id).interrupts = list(o.interrupts)
        return True

    async def _pause(self, interruptions: list[Interruption]) -> None:
        await self.committer.flush()
        self.interruptions = list(interruptions)
        payload = [public_interrupt(i) for i in interruptions]
        self.emitter.emit("updates", {"__interrupt__": tuple(interruptions)})
        self.emitter.emit("events", {"event": "interrupt", "ns": self.ns, "interruptions": payload})

    async def _breakpoints_before(self, tasks: list[Task]) -> bool:
        watched = self.graph.interrupt_before
        if not watched:
            return False
        new: list[tuple[Task, Interruption]] = []
        for t in tasks:
            if t.node not in watched and "*" not in watched:
                continue
            rec = self._record(t.task_id)
            iid = interrupt_id(self.ns, t.task_id, "__before__")
            if iid in rec.answers:
                continue
            new.append((t, Interruption(iid, t.node, "breakpoint", None, datetime.now(UTC))))
        if not new:
            return False
        await self._flush_exit()
        for t, intr in new:
            rec = self._record(t.task_id)
            rec.interrupts = [intr]
            await self._persist_now(t.task_id, [(INTERRUPT, encode_interrupts(self.serde, [intr]))])
        await self._pause([intr for _, intr in new])
        return True

    async def _breakpoints_after(self, tasks: list[Task]) -> bool:
        watched = self.graph.interrupt_after
        if not watched or not self.frontier.tasks:
            return False
        nodes = list(dict.fromkeys(t.node for t in tasks if t.node in watched or "*" in watched))
        if not nodes:
            return False
        await self._flush_exit()
        now = datetime.now(UTC)
        intrs = [
            Interruption(
                interrupt_id(self.ns, self.head or "", f"__after__:{n}"), n, "breakpoint", None, now
            )
            for n in nodes
        ]
        self.records[AFTER] = TaskRecord(interrupts=intrs)
        await self._persist_now(AFTER, [(INTERRUPT, encode_interrupts(self.serde, intrs))])
        await self._pause(intrs)
        return True

    def _decisions(self, tasks: Sequence[Task]) -> list[dict[str, Any]]:
        out = []
        for t in tasks:
            rec = self.records.get(t.task_id)
            if rec is None:
                continue
            for iid, a in rec.answers.items():
                node, kind = rec.answer_info.get(iid, (t.node, "input"))
                entry: dict[str, Any] = {
                    "interruption_id": iid,
                    "node": node,
                    "kind": kind,
                    "decision": a.decision,
                    "by": a.by,
                    "at": a.at,
                }
                if a.reason is not None:
                    entry["reason"] = a.reason
                if a.edited:
                    entry["edited"] = dict(a.edited)
                out.append(entry)
        return out

    # -- one step ---------------------------------------------------------------------------

    async def _run_step(self, tasks: list[Task]) -> list[Outcome]:
        outcomes: dict[str, Outcome] = {}
        todo = []
        for t in tasks:
            rec = self.records.get(t.task_id)
            if rec is not None and rec.done is not None:
                outcomes[t.task_id] = rec.done
            elif (
                rec is not None and rec.interrupts and len(rec.unanswered()) == len(rec.interrupts)
            ):
                # still waiting for a human: do not run it again
                outcomes[t.task_id] = Outcome(t, [], [], interrupts=rec.unanswered(), saved=True)
            else:
                todo.append(t)
        remaining = len(todo)
        step = self.step + 1

        async def one(task: Task) -> None:
            nonlocal remaining
            outcome = await self._run_task(task, step)
            remaining -= 1
            outcomes[task.task_id] = outcome
            # The last task to finish goes straight into the step's checkpoint; earlier ones
            # are saved now, so a crash re-runs only what had not finished.
            if (
                outcome.error is None
                and not outcome.interrupts
                and remaining > 0
                and not self._over_limit(outcome)
            ):
                await self._save(outcome)

        if len(todo) == 1:
            await one(todo[0])
        elif todo:
            results = await asyncio.gather(*(one(t) for t in todo), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    await self._save_unsaved(list(outcomes.values()))
                    raise r
        return [outcomes[t.task_id] for t in tasks]

    async def _save(self, outcome: Outcome, *, force: bool = False) -> None:
        if self.cp is None or outcome.saved or outcome.interrupts:
            return
        if self.durability == "exit" and not force:
            return
        outcome.saved = True
        pairs = [[ch, blob] for ch, _, blob in outcome.writes]
        writes = [
            (UPDATES, self.serde.dumps(pairs, channel=UPDATES)),
            (ROUTE, encode_route(self.serde, outcome)),
        ]
        cp, thread_id, ns, cid, lease = self.cp, self.thread_id, self.ns, self.head, self.lease
        assert thread_id is not None and cid is not None
        task_id = outcome.task.task_id
        await self.committer.submit(
            lambda: cp.put_writes(thread_id, ns, cid, task_id, writes, lease=lease),
            writes_of=task_id,
        )

    async def _save_unsaved(self, outcomes: Sequence[Outcome], *, force: bool = False) -> None:
        for o in outcomes:
            if o.error is None:
                await self._save(o, force=force)

    async def _save_attempt(self, task: Task, attempt: int) -> None:
        if self.cp is None or self.durability == "exit" or self.head is None:
            return
        cp, thread_id, ns, cid, lease = self.cp, self.thread_id, self.ns, self.head, self.lease
        assert thread_id is not None
        data = [(ATTEMPT, self.serde.dumps(attempt, channel=ATTEMPT))]
        await self.committer.submit(
            lambda: cp.put_writes(thread_id, ns, cid, task.task_id, data, lease=lease)
        )

    async def _make_durable(self) -> None:
        """Write the checkpoints ``async``/``exit`` durability has not written yet."""
        if self.cp is None or self.thread_id is None:
            return
        if self.durability == "exit":
            await self._flush_exit()
            await self._save_answers()
        else:
            await self.committer.drain()

    async def _save_answers(self) -> None:
        """Store the answers ``exit`` durability held back (see :meth:`record_answers`)."""
        if self.cp is None or self.thread_id is None:
            return
        while self._unsaved_answers:
            task_id = self._unsaved_answers[0]
            assert self.head is not None
            blob = encode_answers(self.serde, self.records[task_id])
            await self.cp.put_writes(
                self.thread_id, self.ns, self.head, task_id, [(RESUME, blob)], lease=self.lease
            )
            self._unsaved_answers.pop(0)

    async def _persist_now(self, task_id: str, writes: list[tuple[str, bytes]]) -> None:
        """Store writes durably before returning, in every durability mode."""
        if self.cp is None or self.thread_id is None:
            return
        await self._make_durable()
        assert self.head is not None
        await self.cp.put_writes(
            self.thread_id, self.ns, self.head, task_id, writes, lease=self.lease
        )

    async def _persist_final(self, task_id: str, writes: list[tuple[str, bytes]]) -> None:
        """:meth:`_persist_now` as the run's last store: it also releases the lease."""
        assert self.cp is not None and self.thread_id is not None and self.lease is not None
        await self._make_durable()
        assert self.head is not None
        await self.cp.put_writes_final(
            self.thread_id, self.ns, self.head, task_id, writes, lease=self.lease
        )
        self.lease_released = True

    def _apply(self, outcomes: Sequence[Outcome]) -> dict[str, ChannelDelta]:
        """Apply a step's writes to ``values``, in outcome order; return what to store.

        A reducer channel's updates are gathered and folded once per step
        (:meth:`~graphexec._state.ChannelSpec.fold`), not one by one: ``operator.add`` over N
        updates copied the growing list N times, so a 100k-``Send`` step spent minutes in
        it. The result, and the error for a bad update, are the same.
        """
        setters: dict[str, str] = {}
        set_blobs: dict[str, bytes | None] = {}
        fold_blobs: dict[str, list[bytes | None]] = {}
        folds: dict[str, list[tuple[str, Any]]] = {}
        refolds: dict[str, None] = {}
        channels = self.schema.channels
        # Only a subgraph run reports its changes (to its parent task); a root run skips them.
        track = self.parent_task_id is not None
        for o in outcomes:
            node = o.task.node
            for ch, value, blob in o.writes:
                spec = channels[ch]
                if spec.reducer is None:
                    prev = setters.get(ch)
                    if prev is not None and prev != o.task.task_id:
                        # An earlier bad update would have failed first, when folds ran
                        # write by write: keep that order of errors.
                        self._fold(folds)
                        raise InvalidUpdateError(
                            f"state key {ch!r} received values from several tasks in one step "
                            f"(last: node {node!r}); give it a reducer with Annotated[T, "
                            "reducer] or write it from one node per step",
                            node=node,
                            key=ch,
                        )
                    setters[ch] = o.task.task_id
                    self.values[ch] = value
                    set_blobs[ch] = blob
                    if track:
                        self.changes[ch] = ("set", value)
                    continue
                pairs = folds.get(ch)
                if pairs is None:
                    folds[ch] = [(node, value)]
                    fold_blobs[ch] = [blob]
                else:
                    pairs.append((node, value))
                    fold_blobs[ch].append(blob)
                if not track:
                    continue
                kind = self.changes.get(ch)
                if kind is None:
                    self.changes[ch] = ("fold", [value])
                elif kind[0] == "fold":
                    kind[1].append(value)  # the list is ours: appending keeps a fold O(1)
                else:
                    refolds[ch] = None
        self._fold(folds)
        for ch in refolds:  # set earlier in this run: the change is the folded value
            self.changes[ch] = ("set", self.values[ch])
        if self.cp is None:
            return {}
        deltas: dict[str, ChannelDelta] = {}
        for ch, b in set_blobs.items():
            assert b is not None
            deltas[ch] = ChannelDelta("set", (b,))
        for ch, blobs in fold_blobs.items():
            deltas[ch] = ChannelDelta("fold", tuple(b for b in blobs if b is not None))
        return deltas

    def _fold(self, folds: Mapping[str, Sequence[tuple[str, Any]]]) -> None:
        channels = self.schema.channels
        for ch, pairs in folds.items():
            self.values[ch] = channels[ch].fold(self.values.get(ch, _MISSING), pairs)

    def _over_limit(self, outcome: Outcome) -> bool:
        """Whether ``outcome`` alone routes to more tasks than a step may start.

        O(1) for every outcome but one with more routes than the limit.
        """
        limit = self.spec.max_tasks_per_step
        return len(outcome.routes) > limit and (
            sum(isinstance(r, Send) for r in outcome.routes) > limit
        )

    def _next_frontier(self, outcomes: Sequence[Outcome], previous: Frontier) -> Frontier:
        spec = self.spec
        barriers = {k: list(v) for k, v in previous.barriers.items()}
        pulls: set[str] = set()
        pushes: list[Send] = []
        for o in outcomes:
            node = o.task.node
            if o.follow_edges:
                for target in spec.edges.get(node, ()):
                    if target != END:
                        pulls.add(target)
            for route in o.routes:
                if isinstance(route, Send):
                    pushes.append(route)
                elif route != END:
                    pulls.add(route)
            if not o.follow_edges:
                continue
            for i, (sources, target) in enumerate(spec.joins):
                if node in sources:
                    seen = barriers.setdefault(i, [])
                    if node not in seen:
                        seen.append(node)
                    if set(sources) <= set(seen):
                        pulls.add(target)
                        del barriers[i]
        if len(pulls) + len(pushes) > spec.max_tasks_per_step:
            raise self._task_limit_error(outcomes, len(pulls) + len(pushes))
        ordered = sorted(pulls, key=lambda n: spec.order.get(n, 0))
        frontier = Frontier(barriers={k: v for k, v in barriers.items() if v})
        frontier.tasks = [Task(n, False, 0, None, "") for n in ordered] + [
            Task(s.node, True, i, s.arg, "") for i, s in enumerate(pushes)
        ]
        return frontier

    # -- subgraphs ----------------------------------------------------------------------------

    async def _run_subgraph(self, spec: NodeSpec, task: Task, rec: TaskRecord) -> Outcome:
        sub = spec.subgraph
        assert sub is not None
        part = f"{task.node}:{task.index}" if task.push else task.node
        child_ns = f"{self.ns}|{part}" if self.ns else part
        child = Run(
            sub,
            thread_id=self.thread_id,
            checkpoint_ns=child_ns,
            run_id=self.run_id,
            durability=self.durability,
            recursion_limit=self.recursion_limit,
            emitter=self.emitter,
            lease=self.lease,
            parent_task_id=task.task_id,
            parent_key=self._task_key(task, self.step + 1),
            checkpointer=self.cp,
            memory=self.memory,
            incoming_answers=rec.answers,
        )
        source = task.arg if task.push else self.values
        if not isinstance(source, Mapping):
            raise InvalidUpdateError(
                f"subgraph node {task.node!r} was sent {type(source).__name__}; send it a dict "
                "of its state keys",
                node=task.node,
                key=None,
            )
        sub_input = {k: v for k, v in source.items() if k in sub.spec.schema.channels}
        await child.run_child(sub_input)
        if child.interruptions:
            return Outcome(task, [], [], interrupts=list(child.interruptions))
        items: list[tuple[str, Any]] = []
        for ch, (kind, payload) in child.changes.items():
            parent_spec = self.schema.channels.get(ch)
            if parent_spec is None:
                continue
            if kind == "fold" and parent_spec.reducer is not None:
                items += [(ch, u) for u in payload]
            elif kind == "fold":
                items.append((ch, child.values[ch]))
            else:
                items.append((ch, payload))
        checked: list[tuple[str, Any]] = []
        for ch, value in items:
            checked += list(self.schema.coerce_update(task.node, {ch: value}).items())
        return Outcome(task, self._encode(task.node, checked), [])

    async def run_child(self, sub_input: dict[str, Any]) -> None:
        """Run as a subgraph task: resume this namespace if the same parent task began it."""
        tup = await self.load(None)
        resuming = (
            tup is not None and tup.checkpoint.metadata.get("parent_task") == self.parent_task_id
        )
        if resuming:
            pending = {i.id for i in self.pending_interruptions()}
            answers = {k: v for k, v in self.incoming_answers.items() if k in pending}
            if answers:
                await self.record_answers(answers)
            await self._replay_changes()
            await self.loop()
            return
        self.values = self.schema.initial_values()
        self.frontier = Frontier()
        self.records = {}
        base = self.last
        self.last = None
        self.step = -1 if base is None else base.step
        await self.start(sub_input, None)
        self.changes = {}
        await self.loop()

    async def _replay_changes(self) -> None:
        """Rebuild ``changes`` of a resumed subgraph run from its stored checkpoints."""
        assert self.cp is not None and self.thread_id is not None
        history = list(await self.cp.list(self.thread_id, self.ns))
        run_cps: list[Checkpoint] = []
        for cp in history:
            if cp.metadata.get("parent_task") != self.parent_task_id or cp.source == "input":
                break
            run_cps.append(cp)
        self.changes = {}
        for cp in reversed(run_cps):
            for ch, d in cp.deltas.items():
                decoded = [self.serde.loads(b, channel=ch) for b in d.blobs]
                prev = self.changes.get(ch)
                if d.op == "set":
                    self.changes[ch] = ("set", decoded[0])
                elif prev is None or prev[0] == "fold":
                    self.changes[ch] = ("fold", [*(prev[1] if prev else []), *decoded])
                else:
                    self.changes[ch] = ("set", self.values.get(ch))

    # -- helpers ----------------------------------------------------------------------------

    def _task_limit_error(self, outcomes: Sequence[Outcome], count: int) -> TaskLimitError:
        """The error for a step whose outcomes would start ``count`` tasks, over the limit."""
        limit = self.spec.max_tasks_per_step
        step = self.step + 1
        sends: dict[str, int] = {}
        for o in outcomes:
            n = sum(isinstance(r, Send) for r in o.routes)
            if n:
                sends[o.task.node] = sends.get(o.task.node, 0) + n
        if not sends:  # edges alone: every node of the step
            for o in outcomes:
                sends.setdefault(o.task.node, 0)
        nodes = sorted(sends, key=lambda n: -sends[n])
        if sends[nodes[0]]:
            nodes = [n for n in nodes if sends[n]]
            parts = "Send: " + ", ".join(f"{sends[n]} from {n!r}" for n in nodes)
        else:
            parts = "edges from " + ", ".join(map(repr, nodes))
        where = (
            f"; step {step} was not checkpointed: thread {self.thread_id!r} stays at checkpoint "
            f"{self.head!r}, resumable with invoke(None, thread_id=...)"
            if self.thread_id is not None
            else ""
        )
        return TaskLimitError(
            f"step {step} would start {count} tasks in the next step ({parts}), more "
            f"than max_tasks_per_step={limit}{where}. Send fewer, larger tasks (a batch of "
            "items per Send), or raise the limit with compile(max_tasks_per_step=...)",
            limit=limit,
            count=count,
            step=step,
            nodes=nodes,
            thread_id=self.thread_id,
        )

    def _recursion_error(self, steps: int, executed: list[list[str]]) -> RecursionLimitError:
        recent = {n for nodes in executed[-max(2 * len(self.spec.nodes), 2) :] for n in nodes}
        cycle: list[str]
        try:
            edges = nx.find_cycle(self.graph.analysis.subgraph(recent))
            cycle = [str(a) for a, *_ in edges]
        except nx.NetworkXNoCycle:
            cycle = sorted(recent)
        where = (
            f"; the last checkpoint {self.head!r} of thread {self.thread_id!r} is resumable"
            if self.thread_id is not None
            else ""
        )
        return RecursionLimitError(
            f"run exceeded recursion_limit={self.recursion_limit} after {steps} steps, going "
            f"round {' -> '.join(cycle)}{where}; fix the loop's exit condition or pass a higher "
            "recursion_limit",
            limit=self.recursion_limit,
            steps=steps,
            cycle=cycle,
        )


def _keys(writes: Sequence[tuple[str, Any, Any]]) -> list[str]:
    return [ch for ch, _, _ in writes]


def resume_error(thread_id: str) -> ThreadNotFoundError:
    """The error for ``invoke(None)`` on a thread with nothing stored."""
    return ThreadNotFoundError(
        f"thread {thread_id!r} has no checkpoint to resume; start it with an input",
        thread_id=thread_id,
    )
