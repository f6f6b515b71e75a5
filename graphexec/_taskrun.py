"""Running one task: approvals, the node call (retry, timeout, interrupts), effects, routing.

:class:`TaskRunner` is the task half of :class:`graphexec._executor.Run`; the step half (load,
loop, apply) lives in ``_executor.py`` and the commits in ``_commits.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import random
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from graphexec._context import NodeContext
from graphexec._hitl import TaskScope, current_scope, interrupt_id
from graphexec._records import encode_answers
from graphexec._serde import Serializer
from graphexec._state import _MISSING, StateSchema
from graphexec._tasks import EFFECT, RESUME, Emitter, Outcome, Task, TaskRecord, idempotency_key_for
from graphexec._threads import run_in_thread
from graphexec._types import END, Command, Interruption, Send
from graphexec.errors import (
    GraphExecError,
    GraphInterrupt,
    InvalidResumeError,
    InvalidUpdateError,
    NodeExecutionError,
    NodeTimeoutError,
    SerializationError,
)

if TYPE_CHECKING:
    from graphexec._builder import BranchSpec, GraphSpec, NodeSpec
    from graphexec._checkpoint import BaseCheckpointer, Lease
    from graphexec._types import Durability

__all__ = ["TaskRunner"]


# Failures that say the answer itself is unusable: the engine refused what the node did with it.
_ANSWER_REFUSED = (InvalidUpdateError, SerializationError, InvalidResumeError)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class TaskRunner(ABC):
    """Executes tasks for a run. Attributes below are provided by ``Run``."""

    spec: GraphSpec
    schema: StateSchema
    serde: Serializer
    cp: BaseCheckpointer | None
    thread_id: str | None
    ns: str
    run_id: str
    memory: Any
    emitter: Emitter
    lease: Lease | None
    values: dict[str, Any]
    records: dict[str, TaskRecord]
    step: int
    anchor: str | None
    durability: Durability
    _unsaved_answers: list[str]

    def _record(self, task_id: str) -> TaskRecord:
        return self.records.setdefault(task_id, TaskRecord())

    @abstractmethod
    async def _persist_now(self, task_id: str, writes: list[tuple[str, bytes]]) -> None:
        """Store writes of a running task durably before returning (effects, answers)."""

    @abstractmethod
    async def _make_durable(self) -> None:
        """Commit what the durability mode has held back, up to the running step's checkpoint."""

    @abstractmethod
    async def _run_subgraph(self, spec: NodeSpec, task: Task, rec: TaskRecord) -> Outcome:
        """Run a subgraph node as a nested run in its own checkpoint namespace."""

    @abstractmethod
    async def _save_attempt(self, task: Task, attempt: int) -> None:
        """Record a failed attempt so retries continue after a crash."""

    # -- the task -----------------------------------------------------------------------------

    async def _run_task(self, task: Task, step: int) -> Outcome:
        spec = self.spec.nodes[task.node]
        rec = self._record(task.task_id)
        emitter = self.emitter
        events = emitter.wants("events")
        if events:
            emitter.emit(
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
            outcome = await self._gated(spec, task, rec, step)
        except GraphInterrupt as gi:
            outcome = Outcome(task, [], [], interrupts=list(gi.interruptions))
        except Exception as e:
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
            if isinstance(e, _ANSWER_REFUSED):
                await self._withdraw_answers(task, rec)
            return Outcome(task, [], [], error=e)
        if outcome.interrupts:
            return outcome
        if events or emitter.wants("updates"):
            update = {ch: value for ch, value, _ in outcome.writes}
            emitter.emit("updates", {task.node: update})
            emitter.emit(
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

    async def _withdraw_answers(self, task: Task, rec: TaskRecord) -> None:
        """Withdraw the answers a failed task was running with, so its interrupts are pending.

        Called when the engine refused what the node made of them (its update fails the
        schema or the serializer, or an approval's decision is not approve/reject): the same
        answers would fail the same way, so kept, every ``run(None)`` would replay them and the
        thread would take no new answer. Any other failure (a flaky service, a crash) keeps
        them, so ``run(None)`` retries with them. Only the answers to the task's pending
        interrupts are withdrawn (those given for this run; answers to earlier ``interrupt()``
        calls of the node stay), and breakpoints' (they carry nothing the node uses). The
        task's recorded effects and its idempotency key are untouched: answering again re-runs
        it like any resume.
        """
        drop = [i.id for i in rec.interrupts if i.id in rec.answers and i.kind != "breakpoint"]
        if not drop:
            return
        for iid in drop:
            del rec.answers[iid]
            rec.answer_info.pop(iid, None)
        if self.durability != "exit":
            await self._persist_now(task.task_id, [(RESUME, encode_answers(self.serde, rec))])
        elif task.task_id not in self._unsaved_answers:
            # exit durability: stored with the failure, like the answers were to be
            self._unsaved_answers.append(task.task_id)

    async def _gated(self, spec: NodeSpec, task: Task, rec: TaskRecord, step: int) -> Outcome:
        """The approval gate, then the node."""
        edits: list[tuple[str, Any, bytes | None]] = []
        if spec.needs_approval is not False:
            iid = interrupt_id(self.ns, task.task_id, "__approval__")
            answer = rec.answers.get(iid)
            state_in = task.arg if task.push else self.schema.to_node_input(self.values)
            if answer is None:
                need = spec.needs_approval is True or bool(
                    await _maybe_await(spec.needs_approval(state_in))
                )
                if need:
                    preview = await self._preview(spec, task, state_in)
                    return Outcome(
                        task,
                        [],
                        [],
                        interrupts=[
                            Interruption(iid, task.node, "approval", preview, datetime.now(UTC))
                        ],
                    )
            elif answer.decision == "reject":
                target = spec.on_reject
                if target is None:
                    return Outcome(task, [], [], follow_edges=False, rejected=True)
                return Outcome(task, [], [] if target == END else [target], follow_edges=False)
            elif answer.decision != "approve":
                # Fail closed: only an explicit approve runs the gated node. Answers are checked
                # when given; this guards answers stored by older versions or by hand.
                raise InvalidResumeError(
                    f"node {task.node!r}: its approval {iid} was answered with decision "
                    f"{answer.decision!r}, which is neither 'approve' nor 'reject'; the node did "
                    "not run. Answer the approval again",
                    thread_id=self.thread_id,
                    pending=[iid],
                )
            elif answer.edited:
                items = list(self.schema.coerce_update(task.node, answer.edited).items())
                edits = self._encode(task.node, items)
        values = self.values
        if edits:
            values = dict(self.values)
            self._fold_into(values, task.node, edits)
        if spec.subgraph is not None:
            outcome = await self._run_subgraph(spec, task, rec)
        else:
            result = await self._call_with_retry(spec, task, rec, step, values)
            outcome = await self._process_result(task, result)
        if edits:
            outcome.writes = edits + outcome.writes
        if not outcome.interrupts:
            # outcome.writes already holds the edits: fold them onto the state from before them
            outcome.routes += await self._branch_routes(task.node, self.values, outcome)
        return outcome

    async def _preview(self, spec: NodeSpec, task: Task, state_in: Any) -> Any:
        rule = spec.preview
        if rule is None:
            return task.arg if task.push else dict(self.values)
        if callable(rule):
            return await _maybe_await(rule(state_in))
        return {k: self.values[k] for k in rule if k in self.values}

    # -- calling the node ---------------------------------------------------------------------

    def _task_key(self, task: Task, step: int) -> str:
        """The idempotency key of ``task`` running at ``step`` (see ``idempotency_key_for``)."""
        if self.anchor is None:  # a thread checkpointed before anchors existed
            raw = f"{self.thread_id}\x00{task.task_id}".encode()
            return hashlib.sha256(raw).hexdigest()[:32]
        return idempotency_key_for(
            self.thread_id, self.ns, self.anchor, step, task.node, task.push, task.index
        )

    def _context(
        self, spec: NodeSpec, task: Task, rec: TaskRecord, step: int, attempt: int
    ) -> NodeContext:
        emitter = self.emitter
        loop = asyncio.get_running_loop()

        async def effect_async(name: str, fn: Callable[[], Any]) -> Any:
            return await self._effect(task, rec, name, fn)

        def effect_sync(name: str, fn: Callable[[], Any]) -> Any:
            # Called from the sync node's worker thread: run fn here, store on the loop.
            if name in rec.effects:
                return self.serde.loads(rec.effects[name], channel=f"{EFFECT}{name}")
            asyncio.run_coroutine_threadsafe(self._make_durable(), loop).result()  # see _effect
            result = fn()
            if inspect.isawaitable(result):
                result = asyncio.run_coroutine_threadsafe(_maybe_await(result), loop).result()
            future = asyncio.run_coroutine_threadsafe(
                self._store_effect(task, rec, name, result), loop
            )
            return future.result()

        return NodeContext(
            thread_id=self.thread_id,
            run_id=self.run_id,
            step=step,
            node=spec.name,
            task_id=task.task_id,
            attempt=attempt,
            checkpoint_ns=self.ns,
            idempotency_key=self._task_key(task, step),
            memory=self.memory,
            _writer=lambda payload: emitter.emit_threadsafe("custom", payload),
            _effect_async=effect_async,
            _effect_sync=effect_sync,
        )

    async def _effect(
        self, task: Task, rec: TaskRecord, name: str, fn: Callable[[], Any | Awaitable[Any]]
    ) -> Any:
        if name in rec.effects:
            return self.serde.loads(rec.effects[name], channel=f"{EFFECT}{name}")
        # The effect's result is recorded against its step's checkpoint. In `async` and `exit`
        # durability that checkpoint may not be written yet; commit it first, so the record has
        # somewhere to go and a crash after it never re-invokes the effect. (A crash between
        # the effect and its record re-runs the task under the same idempotency key, which the
        # external system can dedupe.)
        await self._make_durable()
        result = await _maybe_await(fn())
        return await self._store_effect(task, rec, name, result)

    async def _store_effect(self, task: Task, rec: TaskRecord, name: str, result: Any) -> Any:
        try:
            blob = self.serde.dumps(result, channel=f"{EFFECT}{name}")
        except SerializationError as e:
            raise InvalidUpdateError(
                f"node {task.node!r}: the result of effect {name!r} cannot be stored: {e}",
                node=task.node,
                key=None,
            ) from e
        rec.effects[name] = blob
        await self._persist_now(task.task_id, [(EFFECT + name, blob)])
        return result

    async def _call_once(
        self,
        spec: NodeSpec,
        task: Task,
        rec: TaskRecord,
        step: int,
        attempt: int,
        values: dict[str, Any],
    ) -> Any:
        fn = spec.fn
        assert fn is not None
        arg = task.arg if task.push else self.schema.to_node_input(values)
        # The context (closures, the idempotency key's hash) only for nodes that take it.
        args = (arg, self._context(spec, task, rec, step, attempt)) if spec.takes_ctx else (arg,)
        token = current_scope.set(TaskScope(self.ns, task.task_id, task.node, rec.answers))
        try:
            if spec.timeout is None:
                if spec.is_async:
                    return await fn(*args)
                return await run_in_thread(fn, *args)
            try:
                async with asyncio.timeout(spec.timeout) as cm:
                    if spec.is_async:
                        return await fn(*args)
                    return await run_in_thread(fn, *args)
            except TimeoutError as e:
                if cm.expired():
                    raise NodeTimeoutError(
                        f"node {spec.name!r} did not finish within its timeout of "
                        f"{spec.timeout}s (attempt {attempt}); raise timeout= or make the "
                        "node faster",
                        node=spec.name,
                        timeout=spec.timeout,
                    ) from e
                raise
        finally:
            current_scope.reset(token)

    async def _call_with_retry(
        self, spec: NodeSpec, task: Task, rec: TaskRecord, step: int, values: dict[str, Any]
    ) -> Any:
        done_before = rec.attempts
        policy = spec.retry
        if policy is None:
            try:
                return await self._call_once(spec, task, rec, step, done_before + 1, values)
            except Exception as e:
                raise self._node_error(spec, done_before + 1, e) from e
        remaining = max(policy.max_attempts - done_before, 1)

        def wait(state: RetryCallState) -> float:
            base = policy.interval(done_before + state.attempt_number)
            return base + (random.random() if policy.jitter else 0.0)

        async def before_sleep(state: RetryCallState) -> None:
            rec.attempts = done_before + state.attempt_number
            await self._save_attempt(task, rec.attempts)

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
                    result = await self._call_once(spec, task, rec, step, attempt_no, values)
        except Exception as e:
            raise self._node_error(spec, attempt_no, e) from e
        return result

    def _node_error(self, spec: NodeSpec, attempt: int, e: Exception) -> Exception:
        if isinstance(e, GraphExecError):
            return e
        hint = (
            f" (thread {self.thread_id!r}; resume it with invoke(None, thread_id=...) after "
            "fixing the cause)"
            if self.thread_id is not None
            else ""
        )
        return NodeExecutionError(
            f"node {spec.name!r} failed on attempt {attempt}: {type(e).__name__}: {e}{hint}",
            node=spec.name,
            attempt=attempt,
            thread_id=self.thread_id,
        )

    # -- results and routes -------------------------------------------------------------------

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
