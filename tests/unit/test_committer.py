"""The durability committer: order, batching of independent pending writes, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from graphexec._tasks import ASYNC_AHEAD, Committer


class Recorder:
    """Storage calls that take one loop turn, logging start and end, and how many overlap."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.running = 0
        self.most = 0

    def call(self, name: str, *, fail: bool = False) -> Callable[[], Any]:
        async def run() -> None:
            self.running += 1
            self.most = max(self.most, self.running)
            self.log.append(f"start {name}")
            await asyncio.sleep(0)
            self.running -= 1
            self.log.append(f"end {name}")
            if fail:
                raise OSError(f"{name} failed")

        return run


async def test_writes_of_different_tasks_run_together_between_checkpoints() -> None:
    rec = Recorder()
    c = Committer("async")
    await c.submit(rec.call("cp1"))
    for t in ("a", "b", "c"):
        await c.submit(rec.call(f"w{t}"), writes_of=t)
    await c.submit(rec.call("cp2"))
    await c.flush()
    assert rec.log[:2] == ["start cp1", "end cp1"]
    assert sorted(rec.log[2:5]) == ["start wa", "start wb", "start wc"]  # all started at once
    assert rec.log[-2:] == ["start cp2", "end cp2"]  # the next checkpoint waits for them
    assert rec.most == 3


async def test_a_tasks_second_save_waits_for_its_first() -> None:
    rec = Recorder()
    c = Committer("async")
    await c.submit(rec.call("cp"))
    await c.submit(rec.call("a1"), writes_of="a")
    await c.submit(rec.call("b1"), writes_of="b")
    await c.submit(rec.call("a2"), writes_of="a")
    await c.flush()
    assert rec.log.index("start a2") > rec.log.index("end a1")
    assert rec.log.index("start a2") > rec.log.index("end b1")


async def test_a_failed_write_in_a_batch_is_raised_and_later_calls_are_skipped() -> None:
    rec = Recorder()
    c = Committer("async")
    await c.submit(rec.call("cp"))
    await c.submit(rec.call("a", fail=True), writes_of="a")
    await c.submit(rec.call("b"), writes_of="b")
    await c.submit(rec.call("cp2"))
    with pytest.raises(OSError, match="a failed"):
        await c.flush()
    assert "start cp2" not in rec.log


async def test_sync_durability_runs_each_call_at_once() -> None:
    rec = Recorder()
    c = Committer("sync")
    await c.submit(rec.call("a"), writes_of="a")
    assert rec.log == ["start a", "end a"]
    await c.flush()


async def test_flush_right_after_a_batch_of_writes_stores_them_and_returns() -> None:
    rec = Recorder()
    c = Committer("async")
    await c.submit(rec.call("a"), writes_of="a")
    await c.submit(rec.call("b"), writes_of="b")
    await asyncio.wait_for(c.flush(), timeout=5)  # the stop marker is not lost behind a batch
    assert sorted(rec.log) == ["end a", "end b", "start a", "start b"]


async def test_async_runs_stay_at_most_async_ahead_checkpoints_ahead_of_the_store() -> None:
    gate = asyncio.Event()
    started: list[int] = []

    def slow(i: int) -> Callable[[], Any]:
        async def run() -> None:
            started.append(i)
            await gate.wait()

        return run

    c = Committer("async")
    for i in range(ASYNC_AHEAD):
        await asyncio.wait_for(c.submit(slow(i)), timeout=5)  # room: returns at once
    blocked = asyncio.create_task(c.submit(slow(ASYNC_AHEAD)))
    writes = asyncio.create_task(c.submit(slow(-1), writes_of="t"))  # writes are not counted
    await asyncio.wait_for(writes, timeout=5)
    for _ in range(10):  # loop turns: the blocked submit stays blocked
        await asyncio.sleep(0)
    assert not blocked.done()  # waits until a checkpoint is stored
    gate.set()
    await asyncio.wait_for(blocked, timeout=5)
    await asyncio.wait_for(c.flush(), timeout=5)
    assert started == [*range(ASYNC_AHEAD), -1, ASYNC_AHEAD]


async def test_a_submit_waiting_for_room_raises_a_failure_found_meanwhile() -> None:
    rec = Recorder()
    c = Committer("async")
    await c.submit(rec.call("cp0", fail=True))
    for i in range(1, ASYNC_AHEAD):
        await c.submit(rec.call(f"cp{i}"))
    with pytest.raises(OSError, match="cp0 failed"):
        await asyncio.wait_for(c.submit(rec.call("late")), timeout=5)
    await c.flush()
    assert "start late" not in rec.log
