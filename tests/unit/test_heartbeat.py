"""The lease heartbeat of a run (``graphexec._tasks.Heartbeat``)."""

from __future__ import annotations

import asyncio
from typing import Any, TypedDict

import pytest

from graphexec import END, START, InMemoryCheckpointer, Lease, StateGraph
from graphexec._tasks import Heartbeat
from graphexec.errors import StorageError
from graphexec.testing import assert_eventually


class S(TypedDict, total=False):
    n: int


async def test_a_run_longer_than_its_lease_keeps_renewing_it() -> None:
    cp = InMemoryCheckpointer()
    renewed: list[Lease] = []
    original = cp.renew_lease

    async def spy(lease: Lease, *, ttl: float) -> Lease:
        out = await original(lease, ttl=ttl)
        renewed.append(out)
        return out

    cp.renew_lease = spy  # type: ignore[method-assign]

    async def slow(state: S) -> dict[str, Any]:
        async def twice() -> None:
            assert len(renewed) >= 2

        await assert_eventually(twice)
        return {"n": 1}

    b = StateGraph(S)
    b.add_node("slow", slow)
    b.add_edge(START, "slow")
    b.add_edge("slow", END)
    g = b.compile(checkpointer=cp, lease_ttl=0.06)
    assert (await g.ainvoke({}, thread_id="t")) == {"n": 1}
    assert renewed[1].expires_at > renewed[0].expires_at
    # released at the end (the next run acquires at once, with the next epoch)
    lease = await cp.acquire_lease("t", owner="other", ttl=5)
    assert lease.epoch == renewed[-1].epoch + 1


async def test_stop_ignores_a_lost_lease_and_reraises_other_renewal_errors() -> None:
    cp = InMemoryCheckpointer()
    lease = await cp.acquire_lease("t", owner="a", ttl=0.0)  # expired at once ...
    await cp.acquire_lease("t", owner="b", ttl=5)  # ... so b takes over: a is fenced off
    beat = Heartbeat(cp, lease, 0.03)

    async def failed() -> None:
        assert beat._renewal is not None and beat._renewal.done()

    await assert_eventually(failed)
    await beat.stop()  # LeaseLostError: swallowed (the run's next commit reports it)

    async def broken(lease: Lease, *, ttl: float) -> Lease:
        raise StorageError("database gone")

    cp.renew_lease = broken  # type: ignore[method-assign]
    beat = Heartbeat(cp, lease, 0.03)
    await assert_eventually(failed)
    with pytest.raises(StorageError):
        await beat.stop()


async def test_stop_before_the_first_renewal_schedules_nothing() -> None:
    cp = InMemoryCheckpointer()
    lease = await cp.acquire_lease("t", owner="a", ttl=5)
    beat = Heartbeat(cp, lease, 30)
    await beat.stop()
    await asyncio.sleep(0)
    assert beat.lease is lease and beat._renewal is None
