"""The superstep executor: one ``Run`` drives one invocation of a graph on one thread.

A superstep runs every task of the frontier concurrently, then applies their writes in frontier
order (so results never depend on timing), computes the next frontier from edges, routes and
joins, and commits one checkpoint. Step logic lives here; storage I/O goes through the
checkpointer and the small :class:`_Committer`, which implements the durability modes.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import networkx as nx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    CheckpointTuple,
    Lease,
    new_checkpoint_id,
)
from graphexec._context import NodeContext
from graphexec._state import _MISSING
from graphexec._types import END, START, Command, Durability, Send
from graphexec.errors import (
    CheckpointNotFoundError,
    GraphExecError,
    GraphVersionError,
    InvalidUpdateError,
    NodeExecutionError,
    NodeTimeoutError,
    RecursionLimitError,
    SerializationError,
    ThreadNotFoundError,
)

if TYPE_CHECKING:
    from graphexec._builder import BranchSpec, NodeSpec
    from graphexec._graph import CompiledGraph

__all__ = ["Emitter", "Run", "Task"]

UPDATES = "__updates__"
ROUTE = "__route__"
ATTEMPT = "__attempt__"


@dataclass(frozen=True, slots=True)
class Task:
    """One node execution in a superstep."""

    node: str
    push: bool
    index: int
    arg: Any
    task_id: str


@dataclass(slots=True)
class Outcome:
    """What a task produced: state writes (in order) and where to go next."""

    task: Task
    writes: list[tuple[str, Any, bytes | None]]
    routes: list[str | Send]
    error: BaseException | None = None
    saved: bool = False


@dataclass(slots=True)
class Frontier:
    """The tasks of the next superstep and the state of join barriers."""

    tasks: list[Task] = field(default_factory=list)
    barriers: dict[int, list[str]] = field(default_factory=dict)


def task_id_for(ns: str, checkpoint_id: str, node: str, push: bool, index: int) -> str:
    """Deterministic task id: the same task of the same checkpoint always gets the same id."""
    raw = f"{ns}\x00{checkpoint_id}\x00{node}\x00{int(push)}\x00{index}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class Emitter:
    """Routes stream parts to a queue, for the modes a consumer asked for."""

    def __init__(self, modes: frozenset[str], queue: asyncio.Queue[Any] | None) -> None:
        self.modes = modes
        self.queue = queue
        self.loop = asyncio.get_running_loop() if queue is not None else None

    def wants(self, mode: str) -> bool:
        """Whether anyone listens to ``mode``."""
        return mode in self.modes

    def emit(self, mode: str, payload: Any) -> None:
        """Queue a part (from the event loop's thread)."""
        if self.queue is not None and mode in self.modes:
            self.queue.put_nowait((mode, payload))

    def emit_threadsafe(self, mode: str, payload: Any) -> None:
        """Queue a part from any thread (sync nodes run in worker threads)."""
        if self.queue is None or self.loop is None or mode not in self.modes:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.queue.put_nowait((mode, payload))
        else:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (mode, payload))


class _Committer:
    """Applies the durability mode to storage calls.

    ``sync`` awaits each call; ``async`` runs calls in order in one background task so the next
    step overlaps the commit, and re-raises a failed commit at the next submit or flush.
    """

    def __init__(self, durability: Durability) -> None:
        self.durability = durability
        self._queue: asyncio.Queue[Callable[[], Any] | None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def submit(self, call: Callable[[], Any]) -> None:
        if self.durability != "async":
            await call()
            return
        if self._error is not None:
            raise self._error
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.create_task(self._drain())
        self._queue.put_nowait(call)

    async def _drain(self) -> None:
        assert self._queue is not None
        while True:
            call = await self._queue.get()
            try:
                if call is None:
                    return
                if self._error is None:
                    await call()
            except Exception as e:
                self._error = e
            finally:
                self._queue.task_done()

    async def flush(self) -> None:
        if self._queue is not None and self._worker is not None:
            self._queue.put_nowait(None)
            await asyncio.shield(self._worker)
            self._queue = None
            self._worker = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def abandon(self) -> None:
        if self._worker is not None:
            self._worker.cancel()


class Run:
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
        metadata: Mapping[str, Any] | None = None,
        checkpointer: BaseCheckpointer | None = None,
        memory: Any = None,
    ) -> None:
        self.graph = graph
        self.spec = graph.spec
        self.schema = graph.spec.schema
        self.serde = graph.serde
        store = checkpointer if checkpointer is not None else graph.checkpointer
        self.cp: BaseCheckpointer | None = store if thread_id is not None else None
        self.memory = memory if memory is not None else graph.memory
        self.thread_id = thread_id
        self.ns = checkpoint_ns
        self.run_id = run_id
        self.durability = durability
        self.recursion_limit = recursion_limit
        self.emitter = emitter
        self.lease = lease
        self.parent_task_id = parent_task_id
        self.user_metadata = dict(metadata or {})
        self.committer = _Committer(durability)
        self.values: dict[str, Any] = {}
        self.frontier = Frontier()
        self.head: str | None = None
        self.last: Checkpoint | None = None
        self.step = -1
        self.changes: dict[str, tuple[str, Any]] = {}
        self._exit_touched: dict[str, list[bytes] | None] = {}
        self._exit_parent: Checkpoint | None = None
        self._exit_expected: str | None = None
        self._exit_pending: tuple[str, str, dict[str, Any]] | None = None
        self._loaded: CheckpointTuple | None = None
        self._pending_outcomes: dict[str, Outcome] = {}

    # -- loading ----------------------------------------------------------------------------

    async def load(self, checkpoint_id: str | None) -> CheckpointTuple | None:
        """Load the head (or the named checkpoint) into ``values`` and ``frontier``."""
        if self.cp is None or self.thread_id is None:
            return None
        tup = await self.cp.get(self.thread_id, self.ns, checkpoint_id)
        if tup is None:
            if checkpoint_id is not None:
                raise CheckpointNotFoundError(
                    f"thread {self.thread_id!r} has no checkpoint {checkpoint_id!r}; list them "
                    "with get_state_history()",
                    thread_id=self.thread_id,
                    checkpoint_id=checkpoint_id,
                )
            return None
        self.values = self.graph.materialize(tup)
        self.frontier = self.graph.decode_frontier(tup.checkpoint)
        self.last = tup.checkpoint
        self.step = tup.checkpoint.step
        if tup.is_head:
            self.head = tup.checkpoint.checkpoint_id
        else:
            head = await self.cp.get(self.thread_id, self.ns)
            self.head = None if head is None else head.checkpoint.checkpoint_id
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

    # -- the loop ---------------------------------------------------------------------------

    async def start(self, input: Any, tup: CheckpointTuple | None) -> None:
        """Apply new input (or a ``Command``) as this thread's next checkpoint."""
        if isinstance(input, Command):
            if input.resume is not None:
                raise GraphExecError(
                    f"thread {self.thread_id!r} has no pending interrupt to resume; "
                    "Command(resume=...) answers an interrupt"
                )
            if tup is None:
                self.values = self.schema.initial_values()
            writes = self._encode(
                "__input__", list(self.schema.coerce_update("__input__", input.update).items())
            )
            routes = self._check_routes("__input__", input.goto_targets())
            sources = [Outcome(Task("__input__", False, 0, None, ""), writes, routes)]
        else:
            if tup is None:
                self.values = self.schema.initial_values()
            writes = self._encode(
                "__input__", list(self.schema.coerce_update("__input__", input).items())
            )
            sources = [Outcome(Task(START, False, 0, None, ""), writes, [])]
        deltas = self._apply(sources)
        if sources[0].task.node == START:
            sources[0].routes = await self._branch_routes(START, self.values, None)
        frontier = self._next_frontier(sources, Frontier(barriers={}))
        self.emitter.emit("values", dict(self.values))
        await self._commit("input", deltas, frontier, {"writes": {"__input__": _keys(writes)}})

    async def loop(self) -> None:
        """Run supersteps until the frontier is empty."""
        pending = self._pending_outcomes
        steps = 0
        executed: list[list[str]] = []
        while self.frontier.tasks:
            if steps >= self.recursion_limit:
                await self.committer.flush()
                raise self._recursion_error(steps, executed)
            tasks = self.frontier.tasks
            outcomes = await self._run_step(tasks, pending)
            pending = {}
            failed = [o for o in outcomes if o.error is not None]
            if failed:
                # Keep what finished: in exit durability the state so far is written first, so
                # the finished tasks' writes have a checkpoint to attach to.
                await self._flush_exit()
                await self._save_unsaved(outcomes, force=True)
                await self.committer.flush()
                raise failed[0].error  # type: ignore[misc]
            executed.append([t.node for t in tasks])
            deltas = self._apply(outcomes)
            frontier = self._next_frontier(outcomes, self.frontier)
            self.emitter.emit("values", dict(self.values))
            writes = {o.task.node: _keys(o.writes) for o in outcomes}
            await self._commit("loop", deltas, frontier, {"writes": writes})
            steps += 1
        await self._flush_exit()
        await self.committer.flush()

    def set_pending(self, tup: CheckpointTuple | None) -> None:
        """Decode writes saved by tasks of the loaded checkpoint's step (after a crash)."""
        self._pending_outcomes = {}
        if tup is None or not tup.pending_writes:
            return
        by_task: dict[str, dict[str, bytes]] = {}
        for w in tup.pending_writes:
            by_task.setdefault(w.task_id, {})[w.channel] = w.data
        tasks = {t.task_id: t for t in self.frontier.tasks}
        for task_id, chans in by_task.items():
            task = tasks.get(task_id)
            if task is None or ROUTE not in chans:
                continue
            pairs = self.serde.loads(chans.get(UPDATES, self.serde.dumps([])), channel=UPDATES)
            writes = [(ch, self.serde.loads(blob, channel=ch), blob) for ch, blob in pairs]
            routes = self._decode_routes(chans[ROUTE])
            self._pending_outcomes[task_id] = Outcome(task, writes, routes, saved=True)

    def attempts_done(self, tup: CheckpointTuple | None, task_id: str) -> int:
        """Failed attempts recorded for a task before a crash."""
        if tup is None:
            return 0
        for w in tup.pending_writes:
            if w.task_id == task_id and w.channel == ATTEMPT:
                return int(self.serde.loads(w.data, channel=ATTEMPT))
        return 0

    # -- one step ---------------------------------------------------------------------------

    async def _run_step(self, tasks: list[Task], pending: dict[str, Outcome]) -> list[Outcome]:
        outcomes: dict[str, Outcome] = {}
        todo = []
        for t in tasks:
            if t.task_id in pending:
                outcomes[t.task_id] = pending[t.task_id]
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
            if outcome.error is None and remaining > 0:
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
        if self.cp is None or outcome.saved or (self.durability == "exit" and not force):
            return
        outcome.saved = True
        pairs = [[ch, blob] for ch, _, blob in outcome.writes]
        writes = [
            (UPDATES, self.serde.dumps(pairs, channel=UPDATES)),
            (ROUTE, self._encode_routes(outcome.routes)),
        ]
        cp, thread_id, ns, cid, lease = self.cp, self.thread_id, self.ns, self.head, self.lease
        assert thread_id is not None and cid is not None
        task_id = outcome.task.task_id
        await self.committer.submit(
            lambda: cp.put_writes(thread_id, ns, cid, task_id, writes, lease=lease)
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

    async def _run_task(self, task: Task, step: int) -> Outcome:
        spec = self.spec.nodes[task.node]
        self.emitter.emit(
            "events",
            {
                "event": "task_start",
                "node": task.node,
                "task_id": task.task_id,
                "step": step,
                "ns": self.ns,
            },
        )
        try:
            if spec.subgraph is not None:
                writes = await self._run_subgraph(spec, task)
                outcome = Outcome(task, writes, [])
            else:
                result = await self._call_with_retry(spec, task, step)
                outcome = await self._process_result(task, result)
            outcome.routes += await self._branch_routes(task.node, self.values, outcome)
        except (GraphExecError, Exception) as e:
            self.emitter.emit(
                "events",
                {
                    "event": "task_error",
                    "node": task.node,
                    "task_id": task.task_id,
                    "step": step,
                    "ns": self.ns,
                    "error": repr(e),
                },
            )
            return Outcome(task, [], [], error=e)
        update = {ch: value for ch, value, _ in outcome.writes}
        self.emitter.emit("updates", {task.node: update})
        self.emitter.emit(
            "events",
            {
                "event": "task_end",
                "node": task.node,
                "task_id": task.task_id,
                "step": step,
                "ns": self.ns,
                "update": update,
            },
        )
        return outcome

    def _context(self, spec: NodeSpec, task: Task, step: int, attempt: int) -> NodeContext:
        key_src = f"{self.thread_id}\x00{task.task_id}".encode()
        emitter = self.emitter
        return NodeContext(
            thread_id=self.thread_id,
            run_id=self.run_id,
            step=step,
            node=spec.name,
            task_id=task.task_id,
            attempt=attempt,
            checkpoint_ns=self.ns,
            idempotency_key=hashlib.sha256(key_src).hexdigest()[:32],
            memory=self.memory,
            _writer=lambda payload: emitter.emit_threadsafe("custom", payload),
        )

    async def _call_once(self, spec: NodeSpec, task: Task, ctx: NodeContext) -> Any:
        fn = spec.fn
        assert fn is not None
        arg = task.arg if task.push else self.schema.to_node_input(self.values)
        args = (arg, ctx) if spec.takes_ctx else (arg,)
        if spec.timeout is None:
            if spec.is_async:
                return await fn(*args)
            return await asyncio.to_thread(fn, *args)
        try:
            async with asyncio.timeout(spec.timeout) as cm:
                if spec.is_async:
                    return await fn(*args)
                return await asyncio.to_thread(fn, *args)
        except TimeoutError as e:
            if cm.expired():
                raise NodeTimeoutError(
                    f"node {spec.name!r} did not finish within its timeout of {spec.timeout}s "
                    f"(attempt {ctx.attempt}); raise timeout= or make the node faster",
                    node=spec.name,
                    timeout=spec.timeout,
                ) from e
            raise

    async def _call_with_retry(self, spec: NodeSpec, task: Task, step: int) -> Any:
        done_before = self.attempts_done(self._loaded, task.task_id)
        policy = spec.retry
        if policy is None:
            ctx = self._context(spec, task, step, done_before + 1)
            try:
                return await self._call_once(spec, task, ctx)
            except Exception as e:
                raise self._node_error(spec, ctx.attempt, e) from e
        remaining = max(policy.max_attempts - done_before, 1)

        def wait(state: RetryCallState) -> float:
            import random

            base = policy.interval(done_before + state.attempt_number)
            return base + (random.random() if policy.jitter else 0.0)

        async def before_sleep(state: RetryCallState) -> None:
            await self._save_attempt(task, done_before + state.attempt_number)

        attempt_no = done_before + 1
        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(remaining),
                wait=wait,
                retry=retry_if_exception(policy.should_retry),
                before_sleep=before_sleep,
                reraise=True,
            ):
                with attempt:
                    attempt_no = done_before + attempt.retry_state.attempt_number
                    result = await self._call_once(
                        spec, task, self._context(spec, task, step, attempt_no)
                    )
        except Exception as e:
            raise self._node_error(spec, attempt_no, e) from e
        return result

    def _node_error(self, spec: NodeSpec, attempt: int, e: Exception) -> Exception:
        if isinstance(e, GraphExecError):
            return e
        return NodeExecutionError(
            f"node {spec.name!r} failed on attempt {attempt}: {type(e).__name__}: {e}"
            + (
                f" (thread {self.thread_id!r}; resume it with invoke(None, thread_id=...) "
                "after fixing the cause)"
                if self.thread_id is not None
                else ""
            ),
            node=spec.name,
            attempt=attempt,
            thread_id=self.thread_id,
        )

    async def _process_result(self, task: Task, result: Any) -> Outcome:
        node = task.node
        routes: list[str | Send] = []
        if isinstance(result, Command):
            if result.resume is not None:
                raise InvalidUpdateError(
                    f"node {node!r} returned Command(resume=...); resume is for answering an "
                    "interrupt from outside the graph",
                    node=node,
                    key=None,
                )
            update = result.update
            routes = self._check_routes(node, result.goto_targets())
        elif (
            isinstance(result, list | tuple) and result and all(isinstance(x, Send) for x in result)
        ):
            update = None
            routes = self._check_routes(node, list(result))
        elif isinstance(result, Send):
            update = None
            routes = self._check_routes(node, [result])
        else:
            update = result
        items = self.schema.coerce_update(node, update)
        return Outcome(task, self._encode(node, list(items.items())), routes)

    def _encode(
        self, node: str, items: list[tuple[str, Any]]
    ) -> list[tuple[str, Any, bytes | None]]:
        if self.cp is None:
            return [(ch, v, None) for ch, v in items]
        out: list[tuple[str, Any, bytes | None]] = []
        for ch, value in items:
            try:
                out.append((ch, value, self.serde.dumps(value, channel=ch)))
            except SerializationError as e:
                raise InvalidUpdateError(
                    f"node {node!r} wrote a value to state key {ch!r} that cannot be stored: {e}",
                    node=node,
                    key=ch,
                ) from e
        return out

    def _check_routes(self, node: str, targets: Sequence[Any]) -> list[str | Send]:
        out: list[str | Send] = []
        for t in targets:
            name = t.node if isinstance(t, Send) else t
            if not isinstance(name, str) or (name != END and name not in self.spec.nodes):
                raise InvalidUpdateError(
                    f"node {node!r} routed to unknown node {name!r}; known nodes: "
                    f"{', '.join(self.spec.nodes)}",
                    node=node,
                    key=None,
                )
            if isinstance(t, Send) and t.node == END:
                raise InvalidUpdateError(f"node {node!r}: cannot Send to END", node=node, key=None)
            out.append(t)
        return out

    async def _branch_routes(
        self, source: str, values: dict[str, Any], outcome: Outcome | None
    ) -> list[str | Send]:
        branches: tuple[BranchSpec, ...] = self.spec.branches.get(source, ())
        if not branches:
            return []
        local = values
        if outcome is not None and outcome.writes:
            local = dict(values)
            self._fold_into(local, source, outcome.writes)
        state = self.schema.to_node_input(local)
        routes: list[str | Send] = []
        for br in branches:
            result = await br.path(state) if br.is_async else br.path(state)
            items = result if isinstance(result, list | tuple) else [result]
            for item in items:
                if isinstance(item, Send):
                    routes.append(item)
                    continue
                if br.path_map is not None:
                    if item not in br.path_map:
                        raise InvalidUpdateError(
                            f"conditional edge {br.name!r} from {source!r} returned {item!r}, "
                            f"which is not a key of its path map {sorted(map(str, br.path_map))}",
                            node=source,
                            key=None,
                        )
                    item = br.path_map[item]
                routes.append(item)
        return self._check_routes(source, routes)

    def _fold_into(
        self, values: dict[str, Any], node: str, writes: Sequence[tuple[str, Any, Any]]
    ) -> None:
        for ch, value, _ in writes:
            spec = self.schema.channels[ch]
            if spec.reducer is None:
                values[ch] = value
            else:
                values[ch] = spec.reduce(node, values.get(ch, _MISSING), value)

    def _apply(self, outcomes: Sequence[Outcome]) -> dict[str, ChannelDelta]:
        setters: dict[str, str] = {}
        set_blobs: dict[str, bytes | None] = {}
        fold_blobs: dict[str, list[bytes | None]] = {}
        for o in outcomes:
            node = o.task.node
            for ch, value, blob in o.writes:
                spec = self.schema.channels[ch]
                if spec.reducer is None:
                    prev = setters.get(ch)
                    if prev is not None and prev != o.task.task_id:
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
                    self.changes[ch] = ("set", value)
                else:
                    self.values[ch] = spec.reduce(node, self.values.get(ch, _MISSING), value)
                    fold_blobs.setdefault(ch, []).append(blob)
                    kind = self.changes.get(ch)
                    if kind is None or kind[0] == "fold":
                        prev_updates = [] if kind is None else kind[1]
                        self.changes[ch] = ("fold", [*prev_updates, value])
                    else:
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

    def _next_frontier(self, outcomes: Sequence[Outcome], previous: Frontier) -> Frontier:
        spec = self.spec
        barriers = {k: list(v) for k, v in previous.barriers.items()}
        pulls: set[str] = set()
        pushes: list[Send] = []
        for o in outcomes:
            node = o.task.node
            for target in spec.edges.get(node, ()):
                if target != END:
                    pulls.add(target)
            for route in o.routes:
                if isinstance(route, Send):
                    pushes.append(route)
                elif route != END:
                    pulls.add(route)
            for i, (sources, target) in enumerate(spec.joins):
                if node in sources:
                    seen = barriers.setdefault(i, [])
                    if node not in seen:
                        seen.append(node)
                    if set(sources) <= set(seen):
                        pulls.add(target)
                        del barriers[i]
        ordered = sorted(pulls, key=lambda n: spec.order.get(n, 0))
        frontier = Frontier(barriers={k: v for k, v in barriers.items() if v})
        frontier.tasks = [Task(n, False, 0, None, "") for n in ordered] + [
            Task(s.node, True, i, s.arg, "") for i, s in enumerate(pushes)
        ]
        return frontier

    # -- commits ----------------------------------------------------------------------------

    async def _commit(
        self,
        source: str,
        deltas: dict[str, ChannelDelta],
        frontier: Frontier,
        metadata: dict[str, Any],
    ) -> None:
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
        self.frontier = frontier
        if self.cp is None:
            self.head = checkpoint_id
            return
        if self.durability == "exit":
            if self._exit_parent is None:
                self._exit_parent = self.last
                self._exit_expected = self.head
            for ch, d in deltas.items():
                prev = self._exit_touched.get(ch, [])
                self._exit_touched[ch] = (
                    None if d.op == "set" or prev is None else [*prev, *d.blobs]
                )
            self._exit_pending = (checkpoint_id, source, metadata)
            return
        cp = self._build(checkpoint_id, source, deltas, frontier, metadata, self.last)
        expected = self.head
        self.head = checkpoint_id
        self.last = cp
        store, lease = self.cp, self.lease
        await self.committer.submit(lambda: store.put(cp, expected_head=expected, lease=lease))
        self.emitter.emit(
            "events",
            {
                "event": "checkpoint",
                "checkpoint_id": checkpoint_id,
                "step": cp.step,
                "next": list(cp.next_nodes),
                "ns": self.ns,
            },
        )

    async def _flush_exit(self) -> None:
        """In ``exit`` durability, write one checkpoint with everything since the last one."""
        if self.durability != "exit" or self.cp is None or self._exit_pending is None:
            return
        checkpoint_id, source, metadata = self._exit_pending
        self._exit_pending = None
        deltas: dict[str, ChannelDelta] = {}
        for ch, blobs in self._exit_touched.items():
            if blobs is None:
                deltas[ch] = ChannelDelta("set", (self.serde.dumps(self.values[ch], channel=ch),))
            else:
                deltas[ch] = ChannelDelta("fold", tuple(blobs))
        self._exit_touched = {}
        cp = self._build(checkpoint_id, source, deltas, self.frontier, metadata, self._exit_parent)
        self._exit_parent = None
        expected = self._exit_expected
        self.head = checkpoint_id
        self.last = cp
        await self.cp.put(cp, expected_head=expected, lease=self.lease)

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
        snapshot: dict[str, bytes] | None = None
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

    # -- subgraphs ----------------------------------------------------------------------------

    async def _run_subgraph(
        self, spec: NodeSpec, task: Task
    ) -> list[tuple[str, Any, bytes | None]]:
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
            checkpointer=self.cp,
            memory=self.memory,
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
        return self._encode(task.node, checked)

    async def run_child(self, sub_input: dict[str, Any]) -> None:
        """Run as a subgraph task: resume this namespace if the same parent task began it."""
        tup = await self.load(None)
        resuming = (
            tup is not None and tup.checkpoint.metadata.get("parent_task") == self.parent_task_id
        )
        if resuming:
            assert tup is not None
            self._loaded = tup
            self.set_pending(tup)
            await self._replay_changes()
            await self.loop()
            return
        self.values = self.schema.initial_values()
        self.frontier = Frontier()
        self._loaded = None
        self._pending_outcomes = {}
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
            if cp.metadata.get("parent_task") != self.parent_task_id:
                break
            if cp.source == "input":
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

    def _encode_routes(self, routes: Sequence[str | Send]) -> bytes:
        data = [["n", r] if isinstance(r, str) else ["s", r.node, r.arg] for r in routes]
        return self.serde.dumps(data, channel=ROUTE)

    def _decode_routes(self, blob: bytes) -> list[str | Send]:
        out: list[str | Send] = []
        for item in self.serde.loads(blob, channel=ROUTE):
            out.append(item[1] if item[0] == "n" else Send(item[1], item[2]))
        return out

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
