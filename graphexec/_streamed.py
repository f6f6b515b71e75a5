"""``StreamedRun``: a run whose parts are iterated as they happen, then read as a ``RunResult``.

What :meth:`CompiledGraph.run_streamed <graphexec.CompiledGraph.run_streamed>` returns, and what
:meth:`~graphexec.CompiledGraph.astream` is built on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from typing import Any

from graphexec._sync import iterate_sync
from graphexec._tasks import Emitter
from graphexec._types import RunResult
from graphexec.errors import GraphExecError

__all__ = ["StreamedRun"]

_DONE = object()


class StreamedRun:
    """A run to iterate for its parts as they happen; its :class:`~graphexec.RunResult` after.

    Returned by :meth:`CompiledGraph.run_streamed <graphexec.CompiledGraph.run_streamed>`. The
    run starts when the iteration starts: ``async for part in run`` in async code, ``for part in
    run`` in sync code (which runs the graph on graphexec's background event loop, as
    :meth:`~graphexec.CompiledGraph.invoke` does). Parts are those of
    :meth:`~graphexec.CompiledGraph.astream` for the same ``mode``.

    When the iteration has ended, :attr:`result` is what :meth:`~graphexec.CompiledGraph.arun`
    would have returned: a run stopped by an interrupt has ``status="interrupted"`` and its
    interruptions, and a node's failure does not raise, the result has ``status="failed"`` and
    the error. Misuse (an unknown thread, a busy thread, bad input) raises from the iteration.

    The run runs only while it is iterated: leaving the loop early (``break``, an exception)
    cancels it once the iterator is closed (at once with :meth:`aclose`, else when the
    iterator is garbage-collected). What it committed stays: resume the thread with input
    ``None``. A ``StreamedRun`` is iterated once.

    Example::

        run = graph.run_streamed({"question": q}, mode="updates", thread_id="t1")
        async for update in run:
            print(update)
        if run.result.status == "interrupted":
            state = run.result.to_state()
    """

    __slots__ = (
        "_execute",
        "_iterator",
        "_modes",
        "_raised",
        "_result",
        "_single",
        "_started",
        "_stopped",
    )

    def __init__(
        self,
        execute: Callable[[Emitter], Awaitable[RunResult]],
        modes: frozenset[str],
        *,
        single: bool,
    ) -> None:
        self._execute = execute
        self._modes = modes
        self._single = single
        self._started = False
        self._stopped = False
        self._raised: BaseException | None = None
        self._result: RunResult | None = None
        self._iterator: AsyncGenerator[Any, None] | None = None

    def __repr__(self) -> str:
        if self._result is not None:
            state = f"ended: {self._result.status}"
        elif self._raised is not None:
            state = f"raised {type(self._raised).__name__}"
        else:
            state = "stopped early" if self._stopped else "running" if self._started else "new"
        return f"<StreamedRun {state}>"

    @property
    def result(self) -> RunResult:
        """How the run ended; available once the iteration has ended.

        Raises:
            GraphExecError: the run has not ended (not iterated yet, still being iterated, or
                left early and cancelled), or it raised instead of ending.
        """
        if self._raised is not None:
            raise GraphExecError(
                f"the run raised {type(self._raised).__name__} ({self._raised}) from its "
                "iteration, so it has no result"
            ) from self._raised
        if self._result is None:
            if not self._started:
                raise GraphExecError(
                    "the run has not started: iterate it (async for part in run) to run it"
                )
            raise GraphExecError(
                "the run has not ended: iterate it to its end first (a run left early is "
                "cancelled; resume its thread with input None)"
            )
        return self._result

    def __aiter__(self) -> AsyncGenerator[Any, None]:
        self._iterator = self._parts()
        return self._iterator

    def __iter__(self) -> Iterator[Any]:
        return iterate_sync(
            self.__aiter__(),
            what="run_streamed",
            instead="'async for part in run' ('for part in run' is for sync code)",
        )

    async def aclose(self) -> None:
        """Stop iterating: cancel the run if it is still going (its commits stay)."""
        if self._iterator is not None:
            await self._iterator.aclose()

    async def _parts(self) -> AsyncGenerator[Any, None]:
        if self._started:
            raise GraphExecError("this run was iterated already; start another run")
        self._started = True
        queue: asyncio.Queue[Any] = asyncio.Queue()
        task = asyncio.ensure_future(self._execute(Emitter(self._modes, queue)))
        task.add_done_callback(lambda _: queue.put_nowait(_DONE))
        try:
            while True:
                item = await queue.get()
                if item is _DONE:
                    break
                yield item[1] if self._single else item
            try:
                self._result = await task
            except BaseException as e:
                self._raised = e
                raise
        finally:
            self._stopped = self._result is None and self._raised is None
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
