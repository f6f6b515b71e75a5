"""``CompiledGraph``: running a graph, reading its threads, and time travel."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

import networkx as nx

from graphexec._builder import GraphSpec
from graphexec._checkpoint import (
    BaseCheckpointer,
    Checkpoint,
    CheckpointTuple,
    Lease,
    ThreadInfo,
    ValuesCache,
    detach,
)
from graphexec._draw import draw_mermaid, draw_svg
from graphexec._executor import Run, decode_records, resume_error
from graphexec._hitl import INTERRUPT_PREFIX, Answer, RunState, to_answer
from graphexec._serde import Serializer
from graphexec._state import _MISSING, RemoveMessage
from graphexec._sync import iterate_sync, run_sync
from graphexec._tasks import (
    Emitter,
    Frontier,
    Heartbeat,
    Outcome,
    Task,
    random_anchor,
    task_id_for,
)
from graphexec._types import (
    END,
    START,
    Command,
    Durability,
    Interruption,
    RunResult,
    RunStatus,
    StateSnapshot,
    StreamMode,
    TaskInfo,
)
from graphexec.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    GraphExecError,
    InvalidResumeError,
    InvalidUpdateError,
    NodeExecutionError,
    NodeTimeoutError,
    NotSupportedError,
    RecursionLimitError,
    SerializationError,
    ThreadBusyError,
    ThreadInterruptedError,
    ThreadNotFoundError,
)

__all__ = ["BranchInfo", "CompiledGraph"]

_DURABILITIES = ("sync", "async", "exit")
_MODES = ("values", "updates", "events", "custom")
_RUN_FAILURES = (NodeExecutionError, NodeTimeoutError, InvalidUpdateError, RecursionLimitError)
_DONE = object()
StateT = TypeVar("StateT")
Prefetched = tuple[CheckpointTuple | None, tuple[str, dict[str, Any]] | None]
"""A run's starting checkpoint read with its lease, and the cached values the read assumed."""


@dataclass(frozen=True, slots=True)
class BranchInfo:
    """One branch of a thread's history.

    Attributes:
        checkpoint_id: The branch's newest checkpoint.
        step: Its step.
        created_at: When it was written.
        next: What it would run next.
        is_head: Whether this is the thread's current branch.
    """

    checkpoint_id: str
    step: int
    created_at: datetime
    next: tuple[str, ...]
    is_head: bool


class CompiledGraph(Generic[StateT]):
    """A validated graph, ready to run. Create it with :meth:`StateGraph.compile`.

    Every operation is async (``ainvoke``, ``aget_state`` ...) with a sync twin of the same name
    without the ``a`` (``invoke``, ``get_state`` ...) for scripts and notebooks.

    Thread selection: pass ``thread_id=`` (and ``checkpoint_id=``) as keywords, or the LangGraph
    form ``config={"configurable": {"thread_id": ..., "checkpoint_id": ...}}``.
    """

    def __init__(
        self,
        spec: GraphSpec,
        *,
        checkpointer: BaseCheckpointer | None,
        memory: Any,
        name: str,
        recursion_limit: int,
        analysis: nx.DiGraph[str],
        interrupt_before: frozenset[str] = frozenset(),
        interrupt_after: frozenset[str] = frozenset(),
        lease_ttl: float = 30.0,
    ) -> None:
        if lease_ttl <= 0:
            raise GraphExecError(f"lease_ttl must be > 0 seconds, got {lease_ttl}")
        self.spec = spec
        self.checkpointer = checkpointer
        self.memory = memory
        self.name = name
        self.recursion_limit = recursion_limit
        self.analysis = analysis
        self.lease_ttl = lease_ttl
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after
        self.values_cache = ValuesCache()
        """Values of each recently used thread's head (see :class:`ValuesCache`)."""
        self.serde = Serializer()
        self.serde.register(RemoveMessage, name="graphexec.RemoveMessage")
        self.serde.register_schema(spec.schema.schema)

    def with_checkpointer(self, checkpointer: BaseCheckpointer | None) -> CompiledGraph[StateT]:
        """The same graph (same version) storing its checkpoints in ``checkpointer``."""
        return CompiledGraph(
            self.spec,
            checkpointer=checkpointer,
            memory=self.memory,
            name=self.name,
            recursion_limit=self.recursion_limit,
            analysis=self.analysis,
            interrupt_before=self.interrupt_before,
            interrupt_after=self.interrupt_after,
            lease_ttl=self.lease_ttl,
        )

    @property
    def version(self) -> str:
        """Fingerprint of nodes, edges and the state schema, recorded in every checkpoint."""
        return self.spec.version

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

    # -- leases -----------------------------------------------------------------------------

    async def _acquire(
        self, thread_id: str | None, owner: str, on_busy: str, checkpoint_id: str | None
    ) -> tuple[Lease | None, Prefetched | None]:
        """The run's lease and, read with it in one go, the checkpoint the run starts from."""
        if thread_id is None or self.checkpointer is None:
            return None, None
        delay = 0.01
        while True:
            known = self.values_cache.get(thread_id, "")
            try:
                lease, tup = await self.checkpointer.acquire_lease_and_get(
                    thread_id,
                    owner=owner,
                    ttl=self.lease_ttl,
                    checkpoint_id=checkpoint_id,
                    known=None if known is None else known[0],
                )
                return lease, (tup, known)
            except NotSupportedError:
                return None, None
            except ThreadBusyError:
                if on_busy != "wait":
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # -- running ----------------------------------------------------------------------------

    async def _execute(
        self,
        input: Any,
        *,
        thread_id: str | None,
        checkpoint_id: str | None,
        durability: Durability,
        recursion_limit: int | None,
        on_busy: Literal["raise", "wait"],
        metadata: Mapping[str, Any] | None,
        emitter: Emitter,
    ) -> RunResult:
        if durability not in _DURABILITIES:
            raise GraphExecError(f"durability must be one of {_DURABILITIES}, got {durability!r}")
        if on_busy not in ("raise", "wait"):
            raise GraphExecError(f"on_busy must be 'raise' or 'wait', got {on_busy!r}")
        limit = self.recursion_limit if recursion_limit is None else recursion_limit
        if limit < 1:
            raise GraphExecError(f"recursion_limit must be >= 1, got {limit}")
        run_id = uuid.uuid4().hex
        lease, prefetched = await self._acquire(thread_id, run_id, on_busy, checkpoint_id)
        beat = None if lease is None else Heartbeat(self._store(), lease, self.lease_ttl)
        run = Run(
            self,
            thread_id=thread_id,
            run_id=run_id,
            durability=durability,
            recursion_limit=limit,
            emitter=emitter,
            lease=lease,
            metadata=metadata,
        )
        try:
            tup = await run.load(checkpoint_id, prefetched)
            pending = run.pending_interruptions()
            if isinstance(input, RunState):
                input = self._check_run_state(input, thread_id, tup)
            if isinstance(input, Command) and input.resume is not None:
                if input.update is not None or input.goto:
                    raise InvalidResumeError(
                        "Command(resume=...) cannot be combined with update= or goto=; "
                        "resume first, then update_state() if needed",
                        thread_id=thread_id,
                    )
                answers = self._match_answers(thread_id, pending, input.resume)
                self._check_edits(thread_id, pending, answers)
                run.check_version()
                await run.record_answers(answers)
                await run.loop()
            elif input is None:
                if tup is None:
                    if thread_id is None:
                        raise GraphExecError("input=None resumes a thread; pass an input")
                    raise resume_error(thread_id)
                run.check_version()
                breakpoints = {i.id: Answer("continue") for i in pending if i.kind == "breakpoint"}
                if breakpoints:
                    await run.record_answers(breakpoints)
                await run.loop()
            else:
                waiting = [i for i in pending if i.kind != "breakpoint"]
                if waiting:
                    assert thread_id is not None
                    raise ThreadInterruptedError(
                        f"thread {thread_id!r} is waiting on {len(waiting)} interrupt(s) "
                        f"({', '.join(f'{i.node}:{i.id}' for i in waiting)}); answer with "
                        "Command(resume=...) before sending new input",
                        thread_id=thread_id,
                        pending=[i.id for i in waiting],
                    )
                await run.start(input, tup)
                await run.loop()
            status: RunStatus = "done"
            if run.interruptions:
                status = "interrupted"
            elif run.rejected:
                status = "rejected"
            error: BaseException | None = None
        except _RUN_FAILURES as e:
            status, error = "failed", e
        finally:
            run.committer.abandon()
            if beat is not None:
                await beat.stop()
                if self.checkpointer is not None and not run.lease_released:
                    await asyncio.shield(self.checkpointer.release_lease(beat.lease))
        return RunResult(
            values=dict(run.values),
            status=status,
            interruptions=tuple(run.interruptions),
            thread_id=thread_id,
            run_id=run_id,
            checkpoint_id=run.head if thread_id is not None else None,
            error=error,
            graph_name=self.name,
            graph_version=self.version,
            _graph=self,
        )

    def _match_answers(
        self, thread_id: str | None, pending: Sequence[Interruption], resume: Any
    ) -> dict[str, Answer]:
        """Match a ``Command(resume=...)`` to pending interrupts, by id."""
        ids = [i.id for i in pending]
        by_id = {i.id: i for i in pending}
        if not pending:
            raise InvalidResumeError(
                f"thread {thread_id!r} has no pending interrupt to resume (it finished or was "
                "never interrupted); start a new run with an input instead",
                thread_id=thread_id,
            )
        if (
            isinstance(resume, Mapping)
            and resume
            and all(isinstance(k, str) and k.startswith(INTERRUPT_PREFIX) for k in resume)
        ):
            unknown = [k for k in resume if k not in by_id]
            if unknown:
                raise InvalidResumeError(
                    f"thread {thread_id!r}: interruption id(s) {unknown} are not pending "
                    f"(unknown, stale or already answered); pending: {ids}",
                    thread_id=thread_id,
                    pending=ids,
                )
            return {k: to_answer(by_id[k].kind, v) for k, v in resume.items()}
        if len(pending) > 1:
            raise InvalidResumeError(
                f"thread {thread_id!r} has {len(pending)} pending interrupts; answer by id with "
                f"Command(resume={{id: value, ...}}); pending: {ids}",
                thread_id=thread_id,
                pending=ids,
            )
        return {pending[0].id: to_answer(pending[0].kind, resume)}

    def check_update(self, writer: str, update: Any) -> None:
        """Refuse, without writing anything, an update the schema or the serializer would refuse.

        ``writer`` is the node (or ``"__input__"``) named in the error.

        Raises:
            InvalidUpdateError: The update does not fit the state schema.
            SerializationError: A value cannot be stored.
        """
        for ch, value in self.spec.schema.coerce_update(writer, update).items():
            self.serde.dumps(value, channel=ch)

    def _check_edits(
        self, thread_id: str | None, pending: Sequence[Interruption], answers: Mapping[str, Answer]
    ) -> None:
        """Refuse approval edits the schema would refuse, before anything is recorded."""
        nodes = {i.id: i.node for i in pending}
        for iid, answer in answers.items():
            if not answer.edited:
                continue
            node = nodes[iid]
            try:
                self.check_update(node, answer.edited)
            except (InvalidUpdateError, SerializationError) as e:
                raise InvalidResumeError(
                    f"the edits approved for node {node!r} are refused: {e}; nothing was "
                    "recorded, approve again with valid values",
                    thread_id=thread_id,
                    pending=[i.id for i in pending],
                ) from e

    def _check_run_state(
        self, state: RunState, thread_id: str | None, tup: CheckpointTuple | None
    ) -> Command:
        """Validate a RunState against this graph and the thread; return it as a resume."""
        if state.graph_version != self.version or state.graph_name != self.name:
            raise InvalidResumeError(
                f"this RunState belongs to graph {state.graph_name!r} version "
                f"{state.graph_version}, not to {self.name!r} version {self.version}",
                thread_id=state.thread_id,
            )
        if thread_id != state.thread_id:
            raise InvalidResumeError(
                f"this RunState belongs to thread {state.thread_id!r}, not {thread_id!r}",
                thread_id=state.thread_id,
            )
        head = None if tup is None else tup.checkpoint.checkpoint_id
        if head != state.checkpoint_id:
            raise InvalidResumeError(
                f"thread {state.thread_id!r} moved on since this RunState was taken (its head "
                f"is {head!r}, the state was taken at {state.checkpoint_id!r}); take a fresh "
                "state with get_state()",
                thread_id=state.thread_id,
            )
        if not state.answers:
            raise InvalidResumeError(
                "this RunState has no decisions; call approve(), reject() or resume() first",
                thread_id=state.thread_id,
                pending=[i.id for i in state.pending],
            )
        return Command(resume=dict(state.answers))

    async def arun(
        self,
        input: Any,
        *,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Run the graph and report how it ended, without raising for node failures.

        Args:
            input: A dict (or schema instance) of state keys for a new run; ``None`` to resume
                the thread from its last checkpoint (or, with ``checkpoint_id``, to replay
                from that checkpoint on a new branch); or a :class:`~graphexec.Command`.
            thread_id: The thread; required when the graph has a checkpointer.
            checkpoint_id: Start from this checkpoint instead of the thread's head.
            config: LangGraph-style ``{"configurable": {"thread_id": ...}}``.
            durability: ``"sync"`` commits each step before the next starts (a crash loses
                at most the running step's unfinished tasks); ``"async"`` overlaps each commit
                with the next step (a crash can also lose the last committed-in-flight steps);
                ``"exit"`` writes once when the run ends, is interrupted or fails (a crash
                loses the whole run).
            recursion_limit: Maximum supersteps for this run.
            on_busy: When another run owns the thread: ``"raise"`` ThreadBusyError, or
                ``"wait"`` until it is free.
            metadata: Recorded in every checkpoint this run writes.

        Returns:
            A :class:`~graphexec.RunResult`; ``status="failed"`` carries the error.
        """
        if isinstance(input, RunState) and thread_id is None and config is None:
            thread_id = input.thread_id
        thread_id, checkpoint_id = self._thread(thread_id, checkpoint_id, config, required=False)
        return await self._execute(
            input,
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            durability=durability,
            recursion_limit=recursion_limit,
            on_busy=on_busy,
            metadata=metadata,
            emitter=Emitter(frozenset(), None),
        )

    def run(
        self,
        input: Any,
        *,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> RunResult:
        """Sync twin of :meth:`arun`."""
        return run_sync(
            self.arun(
                input,
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                config=config,
                durability=durability,
                recursion_limit=recursion_limit,
                on_busy=on_busy,
                metadata=metadata,
            ),
            what="run",
        )

    async def ainvoke(
        self,
        input: Any,
        *,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run the graph and return the final state values; raise if a node fails.

        Same arguments as :meth:`arun`.

        Raises:
            NodeExecutionError: a node failed (after its retries); the thread stays resumable
                from its last checkpoint.
            InvalidUpdateError: a node returned something the schema refuses.
            RecursionLimitError: the run took too many steps.
        """
        result = await self.arun(
            input,
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            config=config,
            durability=durability,
            recursion_limit=recursion_limit,
            on_busy=on_busy,
            metadata=metadata,
        )
        if result.error is not None:
            raise result.error
        return result.values

    def invoke(
        self,
        input: Any,
        *,
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Sync twin of :meth:`ainvoke`."""
        return run_sync(
            self.ainvoke(
                input,
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                config=config,
                durability=durability,
                recursion_limit=recursion_limit,
                on_busy=on_busy,
                metadata=metadata,
            ),
            what="invoke",
        )

    async def astream(
        self,
        input: Any,
        *,
        mode: StreamMode | Sequence[StreamMode] = "values",
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[Any]:
        """Run the graph, yielding parts as they happen.

        Modes: ``"values"`` (the whole state after the input and after every step),
        ``"updates"`` (``{node: update}`` as each task finishes), ``"events"`` (task start,
        end and error, and checkpoint commits, as dicts with an ``"event"`` key) and
        ``"custom"`` (whatever nodes pass to ``ctx.stream_writer``). With one mode, parts are
        yielded as they are; with a list of modes, as ``(mode, part)`` tuples. Raises like
        :meth:`ainvoke` when the run fails.
        """
        modes = [mode] if isinstance(mode, str) else list(mode)
        for m in modes:
            if m not in _MODES:
                raise GraphExecError(f"unknown stream mode {m!r}; choose from {_MODES}")
        if not modes:
            raise GraphExecError("pass at least one stream mode")
        thread_id, checkpoint_id = self._thread(thread_id, checkpoint_id, config, required=False)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        emitter = Emitter(frozenset(modes), queue)
        task = asyncio.create_task(
            self._execute(
                input,
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                durability=durability,
                recursion_limit=recursion_limit,
                on_busy=on_busy,
                metadata=metadata,
                emitter=emitter,
            )
        )
        task.add_done_callback(lambda _: queue.put_nowait(_DONE))
        single = isinstance(mode, str)
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                yield item[1] if single else item
            result = await task
            if result.error is not None:
                raise result.error
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def stream(
        self,
        input: Any,
        *,
        mode: StreamMode | Sequence[StreamMode] = "values",
        thread_id: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        durability: Durability = "sync",
        recursion_limit: int | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        metadata: Mapping[str, Any] | None = None,
    ) -> Iterator[Any]:
        """Sync twin of :meth:`astream`."""
        return iterate_sync(
            self.astream(
                input,
                mode=mode,
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                config=config,
                durability=durability,
                recursion_limit=recursion_limit,
                on_busy=on_busy,
                metadata=metadata,
            ),
            what="stream",
        )

    # -- reading state ----------------------------------------------------------------------

    def _snapshot(
        self, cp: Checkpoint, values: dict[str, Any], tup: CheckpointTuple | None = None
    ) -> StateSnapshot:
        interruptions: list[Interruption] = []
        tasks: list[TaskInfo] = []
        if tup is not None:
            frontier = self.decode_frontier(cp)
            records = decode_records(self, tup, frontier)
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
            self.values_cache.put(thread_id, checkpoint_ns, tup.checkpoint.checkpoint_id, values)
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

    # -- time travel ------------------------------------------------------------------------

    async def aupdate_state(
        self,
        thread_id: str | None,
        values: Any,
        *,
        as_node: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> str:
        """Apply ``values`` as if ``as_node`` had returned them, as a new checkpoint.

        Values go through the reducers. With ``as_node``, what runs next is computed from that
        node's edges (``as_node=END`` finishes the thread); without it, the thread keeps its
        pending next nodes. With a ``checkpoint_id`` that is not the head, the new checkpoint
        starts a branch from it and becomes the head.

        Returns:
            The new checkpoint's id.
        """
        thread, cid = self._thread(thread_id, checkpoint_id, config, required=True)
        assert thread is not None
        if as_node is not None and as_node not in self.spec.nodes and as_node not in (START, END):
            raise GraphExecError(
                f"update_state(as_node={as_node!r}): no such node; known nodes: "
                f"{', '.join(self.spec.nodes)}"
            )
        run = Run(
            self,
            thread_id=thread,
            run_id=uuid.uuid4().hex,
            durability="sync",
            recursion_limit=self.recursion_limit,
            emitter=Emitter(frozenset(), None),
            lease=None,
        )
        tup = await run.load(cid)
        if tup is None:
            raise ThreadNotFoundError(
                f"thread {thread!r} does not exist; start it with invoke() first",
                thread_id=thread,
            )
        writer = as_node or "__update__"
        items = list(self.spec.schema.coerce_update(writer, values).items())
        outcome = Outcome(Task(writer, False, 0, None, ""), run._encode(writer, items), [])
        deltas = run._apply([outcome])
        if as_node is None:
            frontier = Frontier(
                [Task(t.node, t.push, t.index, t.arg, "") for t in run.frontier.tasks],
                run.frontier.barriers,
            )
        elif as_node == END:
            frontier = Frontier()
        else:
            outcome.routes = await run._branch_routes(as_node, run.values, None)
            frontier = run._next_frontier([outcome], run.frontier)
        meta = {"writes": {writer: [ch for ch, _ in items]}, "as_node": as_node}
        # What runs after an update is new work, even where it repeats a node that already ran
        # at this step on another branch: its idempotency keys must not match that run's.
        run.anchor = random_anchor()
        await run._commit("update", deltas, frontier, meta)
        assert run.head is not None
        return run.head

    def update_state(
        self,
        thread_id: str | None,
        values: Any,
        *,
        as_node: str | None = None,
        checkpoint_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> str:
        """Sync twin of :meth:`aupdate_state`."""
        return run_sync(
            self.aupdate_state(
                thread_id, values, as_node=as_node, checkpoint_id=checkpoint_id, config=config
            ),
            what="update_state",
        )

    async def afork(self, thread_id: str, checkpoint_id: str, new_thread_id: str) -> str:
        """Start ``new_thread_id`` from ``thread_id``'s checkpoint; the source is untouched.

        The new thread's first checkpoint holds the source checkpoint's values and next tasks;
        running it with ``invoke(None, thread_id=new_thread_id)`` continues from there. Task ids
        and idempotency keys differ from the source's.

        Returns:
            The new thread's first checkpoint id.
        """
        self._thread(thread_id, checkpoint_id, None, required=True)
        self._thread(new_thread_id, None, None, required=True)
        store = self._store()
        if await store.get(new_thread_id) is not None:
            raise CheckpointError(
                f"fork target thread {new_thread_id!r} already exists; choose a new thread id"
            )
        tup = await store.get(thread_id, "", checkpoint_id)
        if tup is None:
            raise CheckpointNotFoundError(
                f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}",
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
            )
        run = Run(
            self,
            thread_id=new_thread_id,
            run_id=uuid.uuid4().hex,
            durability="sync",
            recursion_limit=self.recursion_limit,
            emitter=Emitter(frozenset(), None),
            lease=None,
        )
        run.values = self.materialize(tup)
        source = self.decode_frontier(tup.checkpoint)
        run.step = tup.checkpoint.step - 1
        frontier = Frontier(
            [Task(t.node, t.push, t.index, t.arg, "") for t in source.tasks], source.barriers
        )
        meta = {"forked_from": {"thread_id": thread_id, "checkpoint_id": checkpoint_id}}
        run.anchor = random_anchor()
        await run._commit("fork", {}, frontier, meta)
        assert run.head is not None
        return run.head

    def fork(self, thread_id: str, checkpoint_id: str, new_thread_id: str) -> str:
        """Sync twin of :meth:`afork`."""
        return run_sync(self.afork(thread_id, checkpoint_id, new_thread_id), what="fork")

    async def alist_threads(self) -> list[ThreadInfo]:
        """Every thread in the checkpointer, most recently updated first."""
        return list(await self._store().list_threads())

    def list_threads(self) -> list[ThreadInfo]:
        """Sync twin of :meth:`alist_threads`."""
        return run_sync(self.alist_threads(), what="list_threads")

    async def alist_branches(self, thread_id: str) -> list[BranchInfo]:
        """The tips of every branch of the thread (replays and ``update_state`` forks)."""
        self._thread(thread_id, None, None, required=True)
        store = self._store()
        head = await store.get(thread_id)
        head_id = None if head is None else head.checkpoint.checkpoint_id
        return [
            BranchInfo(
                cp.checkpoint_id, cp.step, cp.created_at, cp.next_nodes, cp.checkpoint_id == head_id
            )
            for cp in await store.list_tips(thread_id)
        ]

    def list_branches(self, thread_id: str) -> list[BranchInfo]:
        """Sync twin of :meth:`alist_branches`."""
        return run_sync(self.alist_branches(thread_id), what="list_branches")

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, pending writes and lease."""
        self._thread(thread_id, None, None, required=True)
        await self._store().delete_thread(thread_id)

    def delete_thread(self, thread_id: str) -> None:
        """Sync twin of :meth:`adelete_thread`."""
        run_sync(self.adelete_thread(thread_id), what="delete_thread")

    async def aprune(self, thread_id: str, *, keep_last: int) -> int:
        """Keep exactly the last ``keep_last`` checkpoints of the thread's current branch.

        Checkpoints store deltas, so the oldest retained checkpoint is first given a full
        snapshot (materialised here, where the reducers are known); then everything older and
        every other branch is deleted. Every retained checkpoint stays readable.

        Returns:
            How many checkpoints were deleted.
        """
        self._thread(thread_id, None, None, required=True)
        if keep_last < 1:
            raise GraphExecError(f"prune(keep_last={keep_last}): keep at least 1 checkpoint")
        store = self._store()
        kept = list(await store.list(thread_id, "", limit=keep_last))
        rebase: tuple[str, dict[str, bytes]] | None = None
        if kept and kept[-1].snapshot is None:
            tup = await store.get(thread_id, "", kept[-1].checkpoint_id)
            if tup is not None:
                values = self.materialize(tup)
                snapshot = {ch: self.serde.dumps(v, channel=ch) for ch, v in values.items()}
                rebase = (kept[-1].checkpoint_id, snapshot)
        return await store.prune(thread_id, keep_last=keep_last, rebase=rebase)

    def prune(self, thread_id: str, *, keep_last: int) -> int:
        """Sync twin of :meth:`aprune`."""
        return run_sync(self.aprune(thread_id, keep_last=keep_last), what="prune")

    # -- introspection ----------------------------------------------------------------------

    def to_networkx(self) -> nx.MultiDiGraph[str]:
        """The graph as a networkx ``MultiDiGraph`` (one edge per declared connection).

        Edges carry a ``kind`` attribute: ``edge``, ``join``, ``conditional`` or
        ``destination``; conditional edges also carry the routing ``label``. Several routing
        keys leading to the same node, or a static edge beside a conditional one, are separate
        edges.
        """
        g: nx.MultiDiGraph[str] = nx.MultiDiGraph(name=self.name)
        g.add_node(START)
        for name, node in self.spec.nodes.items():
            g.add_node(name, subgraph=node.subgraph is not None)
        g.add_node(END)
        for source, targets in self.spec.edges.items():
            for t in targets:
                g.add_edge(source, t, kind="edge")
        for sources, target in self.spec.joins:
            for s in sources:
                g.add_edge(s, target, kind="join")
        for source, branches in self.spec.branches.items():
            for br in branches:
                mapping = br.path_map or {n: n for n in [*self.spec.nodes, END]}
                for key, target in mapping.items():
                    g.add_edge(source, target, kind="conditional", label=str(key))
        for name, node in self.spec.nodes.items():
            for d in node.destinations:
                g.add_edge(name, d, kind="destination")
            if node.on_reject is not None:
                g.add_edge(name, node.on_reject, kind="conditional", label="rejected")
        return g

    def draw_mermaid(self) -> str:
        """Mermaid flowchart text for the graph."""
        return draw_mermaid(self.to_networkx())

    def draw_svg(self) -> str:
        """A standalone SVG image of the graph (no renderer needed; any browser opens it)."""
        return draw_svg(self.to_networkx())
