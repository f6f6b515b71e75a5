"""Running sync node functions in worker threads, with less overhead than ``asyncio.to_thread``.

Sync nodes may block (an LLM call), so they never run on the event loop. ``asyncio.to_thread``
hands each call to the loop's default executor: a ``concurrent.futures`` work item and future,
a shared work queue woken through a lock, an idle semaphore, and an asyncio future chained to
the concurrent one. For a node that returns in microseconds the hop is most of its step. A
trivial function awaited 5,000 times on 2 vCPUs: 32 us against 14 us here when both threads
share one CPU (``taskset -c 0``), which is what the two thread wake-ups every hop needs cost;
93 us against 75 us when they run on different vCPUs, as the scheduler places them on an idle
machine: a wake-up across vCPUs of that VM costs ~30 us (an inter-processor interrupt to a
halted vCPU), and that, not this code, is most of a sync node's hop there. ``async def``
nodes run on the loop and have no hop.

:func:`run_in_thread` keeps, per event loop, a small pool of long-lived daemon worker threads
(the same size bound as the default executor) in the style of AnyIO's worker threads: each
worker has its own jobs and its own wake-up pipe (see :class:`_Worker` for why a pipe), idle
workers are reused last-in first-out (the most recently run thread is the likeliest to be
scheduled quickly), and a finished call completes its asyncio future with a single
``call_soon_threadsafe``. Calls beyond the bound wait in a backlog, in order.

Semantics are those of ``asyncio.to_thread``: the caller's ``contextvars`` are visible in the
function; its exception (traceback included) is raised to the awaiting coroutine; cancelling
the await (``asyncio.timeout``) abandons the call but does not stop it, so a timed-out node
keeps running in its thread until it returns, and a call cancelled before a worker picks it up
never starts.

Lifetime: the pool starts its workers on demand and stops them when the loop shuts down. The one
shutdown hook ``asyncio.run``, ``asyncio.Runner`` and pytest-asyncio all call on a loop is
:meth:`~asyncio.AbstractEventLoop.shutdown_asyncgens`, which closes every suspended async
generator the loop knows; each pool parks one (:meth:`_NodeThreads._lifetime`) whose ``finally``
stops and joins the workers, waiting (like ``shutdown_default_executor``) for calls still
running. A loop closed by hand without ``shutdown_asyncgens()`` keeps its idle workers until the
next pool is created (:func:`_stop_orphans`). The private loop of the sync API (``_sync.py``)
runs for the whole process, and so do its workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import weakref
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

__all__ = ["max_workers", "run_in_thread"]

T = TypeVar("T")

max_workers = min(32, (os.cpu_count() or 1) + 4)
"""Worker threads per event loop at most: the bound of the default executor."""

_Job = tuple["asyncio.Future[Any]", contextvars.Context, Callable[..., Any], tuple[Any, ...]]

_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _NodeThreads] = (
    weakref.WeakKeyDictionary()
)


async def run_in_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """Call ``fn(*args)`` in a worker thread of the running loop and return its result.

    A drop-in for ``asyncio.to_thread(fn, *args)`` (see the module docstring for what differs
    under the hood).
    """
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        _stop_orphans()
        pool = _pools[loop] = _NodeThreads(loop)
    return await pool.submit(fn, args)  # type: ignore[no-any-return]


def _stop_orphans() -> None:
    """Stop the pools of loops that were closed without ``shutdown_asyncgens()``.

    Such a loop never tells its pool to stop (``loop.close()`` alone shuts down only the
    default executor). Code that runs each call on a new loop and closes it by hand would
    otherwise pile up idle threads, so every new pool first stops those left behind.
    """
    for loop, pool in list(_pools.items()):
        if loop.is_closed():
            pool.stop()


class _Worker:
    """One daemon thread, its jobs, and the pipe that wakes it.

    A job goes in a deque and one byte into the pipe; the thread blocks in ``os.read`` on the
    other end. Waking a thread through a pipe rather than a lock (``queue.SimpleQueue``) matters
    because ``os.write`` releases the GIL: the woken thread can take it and run the node at
    once. Woken by a lock release, it often preempts the loop's thread only to block on the GIL
    the loop still holds, and must be woken a second time (measured: a hop of ~16 us instead of
    ~26 us, ~22 us instead of ~37 us when the loop has work between hops).
    """

    __slots__ = ("_wake", "busy", "jobs", "thread")

    def __init__(self, pool: _NodeThreads, index: int) -> None:
        self.jobs: deque[_Job | None] = deque()
        """Jobs handed over and not yet taken; ``None`` stops the thread."""
        self.busy = False
        """Set while a job is handed to the worker and not yet reported back (loop thread)."""
        read_end, self._wake = os.pipe()
        self.thread = threading.Thread(
            target=_work,
            args=(self, read_end, pool.report),
            name=f"graphexec-node-{index}",
            daemon=True,
        )
        self.thread.start()

    def give(self, job: _Job | None) -> None:
        """Hand the thread a job (or ``None``: stop). Only while the thread is running."""
        self.jobs.append(job)
        os.write(self._wake, b"\0")


def _work(worker: _Worker, wake: int, report: Callable[..., None]) -> None:
    """A worker thread's loop: run jobs in their callers' contexts, report each to the loop.

    The thread owns the pipe and closes both ends when it stops: after its stop signal, or when
    its loop is gone (nothing is handed to it after either).
    """
    try:
        while True:
            os.read(wake, 1)
            job = worker.jobs.popleft()
            if job is None:
                return
            future, ctx, fn, args = job
            result: Any = None
            error: BaseException | None = None
            if not future.cancelled():  # abandoned before it started: never run it
                try:
                    result = ctx.run(fn, *args)
                except BaseException as e:
                    error = e
            loop = future.get_loop()
            try:
                loop.call_soon_threadsafe(report, worker, future, result, error)
            except RuntimeError:  # the loop closed while a timed-out call was still running
                return
            finally:
                # Drop references before blocking again: a result or traceback must not
                # outlive the call in an idle thread.
                del job, future, ctx, fn, args, result, error, loop
    finally:
        os.close(wake)
        os.close(worker._wake)


class _NodeThreads:
    """The worker threads of one event loop. Used from that loop's thread only."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []
        self._backlog: deque[_Job] = deque()
        self._closed = False
        self._lifetime_gen = self._lifetime()
        # Run the generator up to its ``yield``: from now on the loop tracks it and
        # shutdown_asyncgens() will close it (see the module docstring).
        with contextlib.suppress(StopIteration):
            next(self._lifetime_gen.__anext__().__await__())

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Queue ``fn(*args)`` for a worker; the returned future gets its outcome."""
        loop = self._loop()
        assert loop is not None
        if self._closed:
            raise RuntimeError("the event loop is shutting down; cannot start a sync node now")
        future = loop.create_future()
        job: _Job = (future, contextvars.copy_context(), fn, args)
        if self._idle:
            worker = self._idle.pop()
        elif len(self._workers) < max_workers:
            worker = _Worker(self, len(self._workers))
            self._workers.append(worker)
        else:
            self._backlog.append(job)
            return future
        worker.busy = True
        worker.give(job)
        return future

    def report(
        self,
        worker: _Worker,
        future: asyncio.Future[Any],
        result: Any,
        error: BaseException | None,
    ) -> None:
        """On the loop: settle a finished job's future and give the worker its next job."""
        if not future.cancelled():
            if error is None:
                future.set_result(result)
            elif isinstance(error, StopIteration):
                # A future cannot hold StopIteration (it would end the awaiting coroutine).
                wrapped = RuntimeError(f"the function raised {error!r}")
                wrapped.__cause__ = error
                future.set_exception(wrapped)
            else:
                future.set_exception(error)
        while self._backlog and not self._closed:
            job = self._backlog.popleft()
            if not job[0].cancelled():
                worker.give(job)
                return
        worker.busy = False
        if self._closed:
            worker.give(None)
        else:
            self._idle.append(worker)

    async def _lifetime(self) -> AsyncGenerator[None, None]:
        """Parked at its ``yield`` until the loop shuts down; then stops the workers."""
        try:
            yield
        finally:
            # Like the default executor's shutdown, wait for calls still running (a timed-out
            # node), without blocking the loop: such a call may still need it (ctx.effect).
            for worker in self.stop():
                await asyncio.to_thread(worker.thread.join)

    def stop(self) -> list[_Worker]:
        """Stop taking calls, stop and join the idle workers; return the busy ones.

        A busy worker gets its stop signal when it reports back (see :meth:`report`), or exits
        when it finds its loop closed.
        """
        self._closed = True
        loop = self._loop()
        if loop is not None and _pools.get(loop) is self:
            del _pools[loop]
        for job in self._backlog:
            job[0].cancel()
        self._backlog.clear()
        self._idle.clear()
        busy = [w for w in self._workers if w.busy]
        idle = [w for w in self._workers if not w.busy]
        for worker in idle:
            worker.give(None)
        for worker in idle:
            worker.thread.join()
        return busy
