"""The one helper behind every sync method: run a coroutine on a private background loop.

The core is async. Sync twins (``invoke``, ``get_state`` ...) are one line each over
:func:`run_sync`. It keeps one event loop in a daemon thread for the whole process, because
connections and locks held by checkpointers are bound to the loop that created them; it refuses
to run inside a running event loop (use the ``a``-prefixed method there); and it cancels its task
when the caller is interrupted with Ctrl-C.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["iterate_sync", "run_sync"]

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="graphexec-sync-loop", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def _refuse_inside_loop(what: str, instead: str | None = None) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"{what}() was called from a running event loop; inside async code use "
        + (instead or f"the async method (a{what})")
    )


def run_sync(coro: Coroutine[Any, Any, T], *, what: str = "invoke") -> T:
    """Run ``coro`` to completion on the background loop and return its result."""
    try:
        _refuse_inside_loop(what)
    except RuntimeError:
        coro.close()
        raise
    future = asyncio.run_coroutine_threadsafe(coro, _background_loop())
    try:
        return future.result()
    except KeyboardInterrupt:
        future.cancel()
        # Give the task a moment to unwind (release leases, roll back) before re-raising.
        concurrent.futures.wait([future], timeout=5)
        raise


def iterate_sync(
    agen: AsyncIterator[T], *, what: str = "stream", instead: str | None = None
) -> Iterator[T]:
    """Iterate an async iterator from sync code, one item per round trip to the loop.

    ``instead``: what to use in async code, for the error raised there (default: ``a{what}``).
    """
    _refuse_inside_loop(what, instead)

    async def next_item() -> tuple[bool, T | None]:
        try:
            return True, await agen.__anext__()
        except StopAsyncIteration:
            return False, None

    try:
        while True:
            ok, item = run_sync(next_item(), what=what)
            if not ok:
                return
            yield item  # type: ignore[misc]
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            run_sync(aclose(), what=what)
