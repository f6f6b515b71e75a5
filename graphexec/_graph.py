"""``CompiledGraph``: running a graph, time travel and thread administration.

Reading threads (checkpoints folded back into values, ``get_state``, history) is its base
class, :class:`~graphexec._reader.ThreadReader`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
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
)
from graphexec._draw import draw_mermaid, draw_svg, graph_to_networkx
from graphexec._executor import Run, resume_error
from graphexec._hitl import INTERRUPT_PREFIX, Answer, RunState, to_answer
from graphexec._reader import Prefetched, ThreadReader
from graphexec._state import _MISSING
from graphexec._streamed import StreamedRun
from graphexec._sync import iterate_sync, run_sync
from graphexec._tasks import (
    Emitter,
    Frontier,
    Heartbeat,
    Outcome,
    Task,
    random_anchor,
)
from graphexec._types import (
    END,
    START,
    Command,
    Durability,
    Interruption,
    RunResult,
    RunStatus,
    StreamMode,
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
    TaskLimitError,
    ThreadBusyError,
    ThreadInterruptedError,
    ThreadNotFoundError,
)

__all__ = ["BranchInfo", "CompiledGraph"]

_DURABILITIES = ("sync", "async", "exit")
_MODES = ("values", "updates", "events", "custom")
_RUN_FAILURES = (
    NodeExecutionError,
    NodeTimeoutError,
    InvalidUpdateError,
    RecursionLimitError,
    TaskLimitError,
)


def _stream_modes(mode: StreamMode | Sequence[StreamMode]) -> frozenset[str]:
    modes = [mode] if isinstance(mode, str) else list(mode)
    for m in modes:
        if m not in _MODES:
            raise GraphExecError(f"unknown stream mode {m!r}; choose from {_MODES}")
    if not modes:
        raise GraphExecError("pass at least one stream mode")
    return frozenset(modes)


StateT = TypeVar("StateT")


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


class CompiledGraph(ThreadReader, Generic[StateT]):
    """A validated graph, ready to run. Create it with :meth:`StateGraph.compile`.

    Every operation is async (``ainvoke``, ``aget_state`` ...) with a sync twin of the same name
    without the ``a`` (``invoke``, ``get_state`` ...) for scripts and notebooks. The exception is
    :meth:`run_streamed`, whose one result is iterated with ``async for`` or ``for``.

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
        super().__init__(spec, checkpointer)
        self.memory = memory
        self.name = name
        self.recursion_limit = recursion_limit
        self.analysis = analysis
        self.lease_ttl = lease_ttl
        self.interrupt_before = interrupt_before
        self.interrupt_after = interrupt_after

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

    def _start_base(
        self, input: Any, thread_id: str | None, checkpoint_id: str | None, durability: str
    ) -> tuple[bool, tuple[Checkpoint, dict[str, Any]] | None]:
        """Whether a run can start without reading the thread first, and from what.

        New input (not a resume, not a ``RunState``) at the head of a thread can be applied,
        and committed with the run's lease in one storage call (:meth:`_start_in_one_call`),
        when this process knows the thread's state: ``(True, (head, values))`` for the settled
        head it cached when a run ended there, ``(True, None)`` when it holds no values of the
        thread (most likely a new one). The start checks the guess, so a wrong one costs only
        the work of applying the input. ``(False, None)``: start the usual way. That is the
        answer for a thread cached mid-run (interrupted, failed), in ``exit`` durability
        (which commits the input later), when a routing function runs at START (it would run a
        second time after a wrong guess), and with a backend that cannot do it in one call
        (with the default, a lease call then a put, nothing is saved, and under ``async``
        durability the input's put would wait for its commit instead of overlapping the steps).
        """
        store = self.checkpointer
        if not (
            thread_id is not None
            and store is not None
            and type(store).acquire_lease_and_put is not BaseCheckpointer.acquire_lease_and_put
            and checkpoint_id is None
            and durability != "exit"
            and input is not None
            and not isinstance(input, RunState)
            and not (isinstance(input, Command) and input.resume is not None)
            and not self.spec.branches.get(START)
        ):
            return False, None
        settled = self.values_cache.settled(thread_id, "")
        if settled is not None:
            return True, settled
        return self.values_cache.get(thread_id, "") is None, None

    async def _start_in_one_call(
        self, run: Run, input: Any, base: tuple[Checkpoint, dict[str, Any]] | None
    ) -> tuple[Run | None, Lease | None, Prefetched | None]:
        """Take the lease and commit the input on ``base`` (see :meth:`_start_base`) at once.

        Returns ``(run, lease, None)`` when the input is committed (``run`` goes on with the
        steps), ``(None, lease, prefetched)`` when the thread's head was another (start as
        usual from the head read with the lease), and ``(None, None, None)`` when the usual
        start must decide: the input was refused (applied again there, it raises there, where
        such errors always surface), the thread is busy (``on_busy`` applies there), or the
        checkpointer has no leases.
        """
        try:
            cp = await run.prepare_start(input, base)
        except Exception:
            return None, None, None
        try:
            lease, tup, committed = await run.commit_start(cp, ttl=self.lease_ttl)
        except (ThreadBusyError, NotSupportedError):
            return None, None, None
        if committed:
            return run, lease, None
        known = None if base is None else (base[0].checkpoint_id, base[1])
        return None, lease, (tup, known)

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

        def new_run(lease: Lease | None) -> Run:
            return Run(
                self,
                thread_id=thread_id,
                run_id=run_id,
                durability=durability,
                recursion_limit=limit,
                emitter=emitter,
                lease=lease,
                metadata=metadata,
            )

        run: Run | None = None
        lease: Lease | None = None
        prefetched: Prefetched | None = None
        one_call, base = self._start_base(input, thread_id, checkpoint_id, durability)
        if one_call:
            run, lease, prefetched = await self._start_in_one_call(new_run(None), input, base)
        if lease is None:
            lease, prefetched = await self._acquire(thread_id, run_id, on_busy, checkpoint_id)
        beat = None if lease is None else Heartbeat(self._store(), lease, self.lease_ttl)
        if run is None:
            run = new_run(lease)
            started = False
        else:
            started = True  # the input is committed already
        try:
            if started:
                await run.loop()
            else:
                await self._dispatch(run, input, thread_id, checkpoint_id, prefetched)
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

    async def _dispatch(
        self,
        run: Run,
        input: Any,
        thread_id: str | None,
        checkpoint_id: str | None,
        prefetched: Prefetched | None,
    ) -> None:
        """Load where the run starts, apply ``input`` (new input, a resume, or none) and run."""
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
            self._check_edits(thread_id, pending, answers, run.values)
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
        # A mapping with any key that looks like an interrupt id ("intr-" + 24 hex digits, or
        # just the prefix) answers by id: every key must then be a pending id. Reading it as one
        # value for the single pending interrupt would record a mistyped id as the answer.
        if (
            isinstance(resume, Mapping)
            and resume
            and any(isinstance(k, str) and k.startswith(INTERRUPT_PREFIX) for k in resume)
        ):
            unknown = [k for k in resume if k not in by_id]
            if unknown:
                raise InvalidResumeError(
                    f"thread {thread_id!r}: interruption id(s) {unknown} are not pending "
                    f"(unknown, stale or already answered); pending: {ids}. Ids are 'intr-' "
                    "and 24 hex digits, as listed in result.interruptions",
                    thread_id=thread_id,
                    pending=ids,
                )
            return {k: to_answer(by_id[k], v, thread_id=thread_id) for k, v in resume.items()}
        if len(pending) > 1:
            raise InvalidResumeError(
                f"thread {thread_id!r} has {len(pending)} pending interrupts; answer by id with "
                f"Command(resume={{id: value, ...}}); pending: {ids}",
                thread_id=thread_id,
                pending=ids,
            )
        return {pending[0].id: to_answer(pending[0], resume, thread_id=thread_id)}

    def check_update(self, writer: str, update: Any) -> None:
        """Refuse, without writing anything, an update the schema or the serializer would refuse.

        ``writer`` is the node (or ``"__input__"``) named in the error.

        Raises:
            InvalidUpdateError: The update does not fit the state schema.
            SerializationError: A value cannot be stored.
        """
        for ch, value in self.spec.schema.coerce_update(writer, update).items():
            self.serde.dumps(value, channel=ch)

    def _check_edited(self, writer: str, update: Any, values: Mapping[str, Any]) -> None:
        """:meth:`check_update`, then fold the update through the reducers onto ``values``.

        Approved edits are checked like this before they are recorded: an edit only a reducer
        refuses (a str for a ``list`` key reduced with ``operator.add``) would otherwise be
        stored, and fail the run each time it resumes.
        """
        channels = self.spec.schema.channels
        for ch, value in self.spec.schema.coerce_update(writer, update).items():
            self.serde.dumps(value, channel=ch)
            spec = channels[ch]
            if spec.reducer is not None:
                spec.reduce(writer, values.get(ch, _MISSING), value)

    def _check_edits(
        self,
        thread_id: str | None,
        pending: Sequence[Interruption],
        answers: Mapping[str, Answer],
        values: Mapping[str, Any],
    ) -> None:
        """Refuse approval edits the schema or a reducer would refuse, before anything is recorded.

        ``values`` is the state the edits fold onto.
        """
        nodes = {i.id: i.node for i in pending}
        for iid, answer in answers.items():
            if not answer.edited:
                continue
            node = nodes[iid]
            try:
                self._check_edited(node, answer.edited, values)
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

    def run_streamed(
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
    ) -> StreamedRun:
        """A run to iterate for its parts as they happen, then read as a :class:`RunResult`.

        :meth:`astream` and :meth:`arun` in one: ``async for part in run`` (or ``for`` in sync
        code) yields the parts of ``mode`` (see :meth:`astream`), and once the iteration has
        ended ``run.result`` is the :class:`~graphexec.RunResult` (interrupted, failed, ...),
        without raising for a node's failure. The arguments are :meth:`arun`'s, checked now;
        the run starts when the iteration does. See :class:`~graphexec.StreamedRun`.
        """
        modes = _stream_modes(mode)
        if isinstance(input, RunState) and thread_id is None and config is None:
            thread_id = input.thread_id
        thread_id, checkpoint_id = self._thread(thread_id, checkpoint_id, config, required=False)

        def execute(emitter: Emitter) -> Awaitable[RunResult]:
            return self._execute(
                input,
                thread_id=thread_id,
                checkpoint_id=checkpoint_id,
                durability=durability,
                recursion_limit=recursion_limit,
                on_busy=on_busy,
                metadata=metadata,
                emitter=emitter,
            )

        return StreamedRun(execute, modes, single=isinstance(mode, str))

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
        :meth:`ainvoke` when the run fails; :meth:`run_streamed` reports how it ended instead.
        """
        run = self.run_streamed(
            input,
            mode=mode,
            thread_id=thread_id,
            checkpoint_id=checkpoint_id,
            config=config,
            durability=durability,
            recursion_limit=recursion_limit,
            on_busy=on_busy,
            metadata=metadata,
        )
        parts = aiter(run)
        try:
            async for part in parts:
                yield part
        finally:
            await parts.aclose()  # leaving early cancels the run now, not when collected
        if run.result.error is not None:
            raise run.result.error

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
        return graph_to_networkx(self.spec, self.name)

    def draw_mermaid(self) -> str:
        """Mermaid flowchart text for the graph."""
        return draw_mermaid(self.to_networkx())

    def draw_svg(self) -> str:
        """A standalone SVG image of the graph (no renderer needed; any browser opens it)."""
        return draw_svg(self.to_networkx())
