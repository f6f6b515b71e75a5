"""The checkpointer contract, part three: leases and the calls that take or release them.

Mixed into :class:`graphexec.testing.contracts.CheckpointerContract`; not a suite on its own.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from graphexec._checkpoint import (
    BaseCheckpointer,
    Lease,
)
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    LeaseLostError,
    ThreadBusyError,
)
from graphexec.testing._contract_helpers import (
    assert_eventually,
    assert_same,
    get_tuple,
    ids_of,
    make_checkpoint,
    put_chain,
)

__all__ = ["LeaseContract"]


class LeaseContract:
    """Leases: acquire, renew, release, take-over, fencing, and the final and one-call stores."""

    # -- leases ---------------------------------------------------------------------------

    async def _take_over(self, checkpointer: BaseCheckpointer, thread_id: str, owner: str) -> Lease:
        """Acquire as soon as the current lease has expired."""
        return await assert_eventually(
            lambda: checkpointer.acquire_lease(thread_id, owner=owner, ttl=60),
            retry_on=(ThreadBusyError,),
        )

    async def test_acquire_lease_returns_a_live_lease(self, checkpointer: BaseCheckpointer) -> None:
        """Acquiring returns a lease for the owner, expiring after ``ttl``."""
        before = time.time()
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=30)
        assert (lease.thread_id, lease.owner) == ("t", "run-1")
        assert lease.epoch >= 1
        assert before + 20 < lease.expires_at < time.time() + 40

    async def test_lease_holder_can_commit(self, checkpointer: BaseCheckpointer) -> None:
        """The lease holder's commits and writes are accepted."""
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        cps = await put_chain(checkpointer, "t", 3, lease=lease)
        await checkpointer.put_writes(
            "t", "", cps[-1].checkpoint_id, "a", [("x", b"")], lease=lease
        )
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))

    async def test_second_owner_is_busy_while_the_lease_is_live(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Another owner cannot take a live lease."""
        await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        with pytest.raises(ThreadBusyError) as info:
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert info.value.owner == "run-1"
        assert info.value.thread_id == "t"

    async def test_expired_lease_is_taken_over_with_a_higher_epoch(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """An expired lease is taken over with a higher epoch."""
        first = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        second = await self._take_over(checkpointer, "t", "run-2")
        assert second.owner == "run-2"
        assert second.epoch > first.epoch
        with pytest.raises(ThreadBusyError) as info:
            await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        assert info.value.owner == "run-2"

    async def test_stale_lease_put_is_rejected_and_writes_nothing(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A commit with a stale epoch is rejected and nothing is written."""
        stale = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [head] = await put_chain(checkpointer, "t", 1, lease=stale)
        fresh = await self._take_over(checkpointer, "t", "run-2")
        late = make_checkpoint("t", parent=head)
        with pytest.raises(LeaseLostError) as info:
            await checkpointer.put(late, expected_head=head.checkpoint_id, lease=stale)
        assert (info.value.thread_id, info.value.epoch) == ("t", stale.epoch)
        assert await checkpointer.get("t", "", late.checkpoint_id) is None
        assert ids_of(await checkpointer.list("t")) == [head.checkpoint_id]
        await put_chain(checkpointer, "t", 1, after=head, lease=fresh)

    async def test_stale_lease_put_writes_is_rejected_and_writes_nothing(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Writes with a stale epoch are rejected and nothing is saved."""
        stale = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [head] = await put_chain(checkpointer, "t", 1, lease=stale)
        await self._take_over(checkpointer, "t", "run-2")
        with pytest.raises(LeaseLostError):
            await checkpointer.put_writes(
                "t", "", head.checkpoint_id, "task", [("x", b"1")], lease=stale
            )
        assert (await get_tuple(checkpointer, "t")).pending_writes == ()

    async def test_writing_without_a_lease_on_a_busy_thread_is_rejected(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Writing without a lease on a thread another run owns is refused."""
        [head] = await put_chain(checkpointer, "t", 1)
        await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        late = make_checkpoint("t", parent=head)
        with pytest.raises(ThreadBusyError) as info:
            await checkpointer.put(late, expected_head=head.checkpoint_id)
        assert info.value.owner == "run-1"
        with pytest.raises(ThreadBusyError):
            await checkpointer.put_writes("t", "", head.checkpoint_id, "task", [("x", b"1")])
        got = await get_tuple(checkpointer, "t")
        assert got.checkpoint.checkpoint_id == head.checkpoint_id
        assert got.pending_writes == ()

    async def test_writing_without_a_lease_after_expiry_is_allowed(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """An expired lease no longer blocks lease-less writers."""
        [head] = await put_chain(checkpointer, "t", 1)
        await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [child] = await assert_eventually(
            lambda: put_chain(checkpointer, "t", 1, after=head), retry_on=(ThreadBusyError,)
        )
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == child.checkpoint_id

    async def test_lease_of_another_thread_is_refused(self, checkpointer: BaseCheckpointer) -> None:
        """A lease is only good for its own thread."""
        lease = await checkpointer.acquire_lease("a", owner="run-1", ttl=60)
        with pytest.raises(CheckpointError):
            await checkpointer.put(make_checkpoint("b"), expected_head=None, lease=lease)
        assert await checkpointer.get("b") is None

    async def test_renew_extends_the_lease(self, checkpointer: BaseCheckpointer) -> None:
        """Renewing keeps the epoch and pushes expiry out."""
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        renewed = await checkpointer.renew_lease(lease, ttl=60)
        assert (renewed.thread_id, renewed.owner, renewed.epoch) == ("t", "run-1", lease.epoch)
        assert renewed.expires_at > lease.expires_at + 30
        while time.time() < lease.expires_at + 0.05:  # the original lease would have expired
            await asyncio.sleep(0.01)
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, lease=renewed)

    async def test_renew_of_a_lost_lease_raises(self, checkpointer: BaseCheckpointer) -> None:
        """Renewing a lease taken over or released raises ``LeaseLostError``."""
        lost = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        await self._take_over(checkpointer, "t", "run-2")
        with pytest.raises(LeaseLostError) as info:
            await checkpointer.renew_lease(lost, ttl=60)
        assert (info.value.thread_id, info.value.epoch) == ("t", lost.epoch)
        released = await checkpointer.acquire_lease("u", owner="run-1", ttl=60)
        await checkpointer.release_lease(released)
        with pytest.raises(LeaseLostError):
            await checkpointer.renew_lease(released, ttl=60)

    async def test_release_lets_another_owner_acquire_immediately(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A released lease is free at once, and its epoch is dead."""
        first = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        await checkpointer.release_lease(first)
        second = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert second.epoch > first.epoch
        with pytest.raises(LeaseLostError):
            await put_chain(checkpointer, "t", 1, lease=first)

    async def test_put_final_commits_and_releases_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """``put_final`` commits, then the lease is free at once and its epoch is dead."""
        first = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=first)
        last = make_checkpoint("t", parent=head)
        await checkpointer.put_final(last, expected_head=head.checkpoint_id, lease=first)
        assert_same((await get_tuple(checkpointer, "t")).checkpoint, last)
        second = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert second.epoch > first.epoch
        with pytest.raises(LeaseLostError):
            await put_chain(checkpointer, "t", 1, after=last, lease=first)

    async def test_failed_put_final_keeps_the_lease(self, checkpointer: BaseCheckpointer) -> None:
        """A ``put_final`` that conflicts writes nothing and releases nothing."""
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=lease)
        stray = make_checkpoint("t", parent=head)
        with pytest.raises(CheckpointConflictError):
            await checkpointer.put_final(stray, expected_head=None, lease=lease)
        assert await checkpointer.get("t", "", stray.checkpoint_id) is None
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=lease)

    async def test_put_final_with_a_lost_lease_leaves_the_new_owner_alone(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A stale ``put_final`` is rejected and does not release the new owner's lease."""
        stale = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [head] = await put_chain(checkpointer, "t", 1, lease=stale)
        fresh = await self._take_over(checkpointer, "t", "run-2")
        with pytest.raises(LeaseLostError):
            await checkpointer.put_final(
                make_checkpoint("t", parent=head), expected_head=head.checkpoint_id, lease=stale
            )
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-3", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=fresh)

    async def test_put_writes_final_saves_and_releases_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """``put_writes_final`` stores the writes, then the lease is free and its epoch dead."""
        first = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=first)
        await checkpointer.put_writes_final(
            "t", "", head.checkpoint_id, "task", [("x", b"1"), ("y", b"2")], lease=first
        )
        stored = (await get_tuple(checkpointer, "t")).pending_writes
        assert [(w.task_id, w.channel, w.data) for w in stored] == [
            ("task", "x", b"1"),
            ("task", "y", b"2"),
        ]
        second = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert second.epoch > first.epoch
        with pytest.raises(LeaseLostError):
            await checkpointer.put_writes(
                "t", "", head.checkpoint_id, "task", [("z", b"3")], lease=first
            )

    async def test_failed_put_writes_final_keeps_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A ``put_writes_final`` to an unknown checkpoint writes nothing, releases nothing."""
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=lease)
        with pytest.raises(CheckpointError):
            await checkpointer.put_writes_final("t", "", "nope", "task", [("x", b"1")], lease=lease)
        assert (await get_tuple(checkpointer, "t")).pending_writes == ()
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=lease)

    async def test_put_writes_final_with_a_lost_lease_leaves_the_new_owner_alone(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A stale ``put_writes_final`` is rejected and does not release the new owner's lease."""
        stale = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [head] = await put_chain(checkpointer, "t", 1, lease=stale)
        fresh = await self._take_over(checkpointer, "t", "run-2")
        with pytest.raises(LeaseLostError):
            await checkpointer.put_writes_final(
                "t", "", head.checkpoint_id, "task", [("x", b"1")], lease=stale
            )
        assert (await get_tuple(checkpointer, "t")).pending_writes == ()
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-3", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=fresh)

    async def test_put_with_writes_final_stores_both_and_releases_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The checkpoint becomes the head with the task's writes pending; the lease is free."""
        first = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=first)
        last = make_checkpoint("t", parent=head)
        await checkpointer.put_with_writes_final(
            last, "task", [("x", b"1"), ("y", b"2")], expected_head=head.checkpoint_id, lease=first
        )
        got = await get_tuple(checkpointer, "t")
        assert_same(got.checkpoint, last)
        assert [(w.task_id, w.channel, w.data) for w in got.pending_writes] == [
            ("task", "x", b"1"),
            ("task", "y", b"2"),
        ]
        second = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert second.epoch > first.epoch
        with pytest.raises(LeaseLostError):
            await put_chain(checkpointer, "t", 1, after=last, lease=first)

    async def test_failed_put_with_writes_final_writes_nothing_and_keeps_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A conflicting ``put_with_writes_final``: no checkpoint, no writes, the lease kept."""
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        [head] = await put_chain(checkpointer, "t", 1, lease=lease)
        stray = make_checkpoint("t", parent=head)
        with pytest.raises(CheckpointConflictError):
            await checkpointer.put_with_writes_final(
                stray, "task", [("x", b"1")], expected_head=None, lease=lease
            )
        assert await checkpointer.get("t", "", stray.checkpoint_id) is None
        got = await get_tuple(checkpointer, "t")
        assert_same(got.checkpoint, head)
        assert got.pending_writes == ()
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=lease)

    async def test_put_with_writes_final_with_a_lost_lease_leaves_the_new_owner_alone(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A stale ``put_with_writes_final`` is rejected: nothing written, nothing released."""
        stale = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        [head] = await put_chain(checkpointer, "t", 1, lease=stale)
        fresh = await self._take_over(checkpointer, "t", "run-2")
        late = make_checkpoint("t", parent=head)
        with pytest.raises(LeaseLostError):
            await checkpointer.put_with_writes_final(
                late, "task", [("x", b"1")], expected_head=head.checkpoint_id, lease=stale
            )
        assert await checkpointer.get("t", "", late.checkpoint_id) is None
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-3", ttl=60)
        await put_chain(checkpointer, "t", 1, after=head, lease=fresh)

    async def test_acquire_lease_and_get_reads_what_get_reads(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The lease comes with the head (or the named checkpoint), as get/get_since read it."""
        lease, tup = await checkpointer.acquire_lease_and_get("t", owner="run-1", ttl=60)
        assert tup is None and lease.owner == "run-1"
        cps = await put_chain(checkpointer, "t", 5, lease=lease)
        await checkpointer.put_writes(
            "t", "", cps[-1].checkpoint_id, "task", [("x", b"1")], lease=lease
        )
        await checkpointer.release_lease(lease)
        again, tup = await checkpointer.acquire_lease_and_get("t", owner="run-2", ttl=60)
        assert again.epoch > lease.epoch
        want = await get_tuple(checkpointer, "t")
        assert tup is not None and tup.is_head
        assert_same(tup.checkpoint, want.checkpoint)
        assert ids_of(tup.chain) == ids_of(want.chain) and tup.pending_writes == want.pending_writes
        await checkpointer.release_lease(again)
        third, tup = await checkpointer.acquire_lease_and_get(
            "t", owner="run-3", ttl=60, checkpoint_id=cps[3].checkpoint_id
        )
        assert tup is not None and not tup.is_head and ids_of(tup.chain) == ids_of(cps[:3])
        await checkpointer.release_lease(third)
        _, tup = await checkpointer.acquire_lease_and_get(
            "t", owner="run-4", ttl=60, known=cps[2].checkpoint_id
        )
        assert tup is not None and ids_of(tup.chain) in (ids_of(cps[3:4]), ids_of(cps[:4]))

    async def test_acquire_lease_and_get_on_a_busy_thread_raises(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A live lease of another owner: ThreadBusyError, and that lease is untouched."""
        held = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease_and_get("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, lease=held)

    async def test_acquire_lease_and_put_starts_a_new_thread(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """On a thread without checkpoints: the lease is taken and the checkpoint is the head."""
        first = make_checkpoint("t")
        lease, tup, committed = await checkpointer.acquire_lease_and_put(
            first, expected_head=None, owner="run-1", ttl=60
        )
        assert committed and tup is None and lease.owner == "run-1"
        assert_same((await get_tuple(checkpointer, "t")).checkpoint, first)
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        [second] = await put_chain(checkpointer, "t", 1, after=first, lease=lease)
        await checkpointer.put_final(
            make_checkpoint("t", parent=second), expected_head=second.checkpoint_id, lease=lease
        )
        again = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        assert again.epoch > lease.epoch

    async def test_acquire_lease_and_put_on_an_unexpected_head_writes_only_the_lease(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The head is not the expected one: the lease and the head, as acquire_lease_and_get."""
        cps = await put_chain(checkpointer, "t", 3)
        before = ids_of(await checkpointer.list("t"))
        lease, tup, committed = await checkpointer.acquire_lease_and_put(
            make_checkpoint("t"), expected_head=None, owner="run-1", ttl=60
        )
        assert not committed and lease.owner == "run-1"
        assert tup is not None and tup.is_head
        assert_same(tup.checkpoint, cps[-1])
        assert ids_of(await checkpointer.list("t")) == before
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await put_chain(checkpointer, "t", 1, after=cps[-1], lease=lease)
        await checkpointer.release_lease(lease)
        # A wrong non-None guess on a thread without checkpoints is refused the same way.
        other, tup, committed = await checkpointer.acquire_lease_and_put(
            make_checkpoint("u", parent=cps[0]),
            expected_head=cps[0].checkpoint_id,
            owner="run-3",
            ttl=60,
        )
        assert not committed and tup is None and other.owner == "run-3"
        assert await checkpointer.get("u", "") is None

    async def test_acquire_lease_and_put_continues_the_expected_head(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """With the head as expected, the checkpoint is put on it under the new lease."""
        cps = await put_chain(checkpointer, "t", 2)
        nxt = make_checkpoint("t", parent=cps[-1])
        lease, tup, committed = await checkpointer.acquire_lease_and_put(
            nxt, expected_head=cps[-1].checkpoint_id, owner="run-1", ttl=60
        )
        assert committed and tup is None
        assert_same((await get_tuple(checkpointer, "t")).checkpoint, nxt)
        await checkpointer.release_lease(lease)

    async def test_acquire_lease_and_put_on_a_busy_thread_writes_nothing(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A live lease of another owner: ThreadBusyError, no checkpoint, that lease untouched."""
        held = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease_and_put(
                make_checkpoint("t"), expected_head=None, owner="run-2", ttl=60
            )
        assert await checkpointer.get("t", "") is None
        await put_chain(checkpointer, "t", 1, lease=held)

    async def test_acquire_lease_and_put_refuses_a_namespace(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Runs start in the root namespace: a subgraph checkpoint is refused, nothing taken."""
        with pytest.raises(ValueError, match="namespace"):
            await checkpointer.acquire_lease_and_put(
                make_checkpoint("t", ns="child"), expected_head=None, owner="run-1", ttl=60
            )
        lease = await checkpointer.acquire_lease("t", owner="run-2", ttl=60)
        await checkpointer.release_lease(lease)

    async def test_releasing_a_lost_lease_is_a_no_op(self, checkpointer: BaseCheckpointer) -> None:
        """Releasing a lease already lost leaves the new owner's lease alone."""
        lost = await checkpointer.acquire_lease("t", owner="run-1", ttl=0.05)
        current = await self._take_over(checkpointer, "t", "run-2")
        await checkpointer.release_lease(lost)
        with pytest.raises(ThreadBusyError) as info:
            await checkpointer.acquire_lease("t", owner="run-3", ttl=60)
        assert info.value.owner == "run-2"
        await put_chain(checkpointer, "t", 1, lease=current)

    async def test_concurrent_acquire_has_one_winner(self, checkpointer: BaseCheckpointer) -> None:
        """Of many concurrent acquirers exactly one wins."""
        results = await asyncio.gather(
            *(checkpointer.acquire_lease("t", owner=f"run-{i}", ttl=60) for i in range(20)),
            return_exceptions=True,
        )
        winners = [r for r in results if isinstance(r, Lease)]
        assert len(winners) == 1
        assert all(isinstance(r, ThreadBusyError) for r in results if r is not winners[0])
