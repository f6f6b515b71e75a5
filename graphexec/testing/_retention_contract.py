"""The checkpointer contract, part two: pending writes, aliasing, deletion and pruning.

Mixed into :class:`graphexec.testing.contracts.CheckpointerContract`; not a suite on its own.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    PendingWrite,
    new_checkpoint_id,
)
from graphexec.errors import (
    CheckpointError,
    InvalidTTLError,
    LeaseLostError,
    NotSupportedError,
    ThreadBusyError,
)
from graphexec.testing._contract_helpers import (
    SIMILAR_THREAD_IDS,
    assert_readable,
    assert_same,
    get_tuple,
    ids_of,
    make_checkpoint,
    put_chain,
    sample_deltas,
    try_mutate,
)

__all__ = ["WritesAndRetentionContract"]


class WritesAndRetentionContract:
    """Pending writes, no aliasing between callers and storage, ``delete_thread`` and ``prune``."""

    # -- pending writes -------------------------------------------------------------------

    async def test_put_writes_round_trip_in_insertion_order(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Pending writes read back as saved, in insertion order."""
        [cp] = await put_chain(checkpointer, "t", 1)
        writes = [("messages", b'{"x":1}'), ("__route__", b"\x00\xff"), ("empty", b"")]
        await checkpointer.put_writes("t", "", cp.checkpoint_id, "task-a", writes)
        got = await get_tuple(checkpointer, "t")
        assert got.pending_writes == tuple(PendingWrite("task-a", c, d) for c, d in writes)
        assert all(isinstance(w.data, bytes) for w in got.pending_writes)

    async def test_put_writes_of_several_tasks(self, checkpointer: BaseCheckpointer) -> None:
        """Writes of several tasks are kept in the order they were saved."""
        [cp] = await put_chain(checkpointer, "t", 1)
        cid = cp.checkpoint_id
        await checkpointer.put_writes("t", "", cid, "task-b", [("x", b"b1"), ("y", b"b2")])
        await checkpointer.put_writes("t", "", cid, "task-a", [("x", b"a1")])
        await checkpointer.put_writes("t", "", cid, "task-c", [("z", b"c1")])
        assert (await get_tuple(checkpointer, "t")).pending_writes == (
            PendingWrite("task-b", "x", b"b1"),
            PendingWrite("task-b", "y", b"b2"),
            PendingWrite("task-a", "x", b"a1"),
            PendingWrite("task-c", "z", b"c1"),
        )

    async def test_put_writes_is_idempotent_per_task_and_channel(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Re-putting a ``(task_id, channel)`` write replaces it."""
        [cp] = await put_chain(checkpointer, "t", 1)
        cid = cp.checkpoint_id
        await checkpointer.put_writes("t", "", cid, "task-a", [("x", b"old"), ("y", b"y")])
        await checkpointer.put_writes("t", "", cid, "task-b", [("x", b"b")])
        await checkpointer.put_writes("t", "", cid, "task-a", [("x", b"new")])
        await checkpointer.put_writes("t", "", cid, "task-a", [("x", b"new")])
        got = (await get_tuple(checkpointer, "t")).pending_writes
        assert len(got) == 3
        assert set(got) == {
            PendingWrite("task-a", "x", b"new"),
            PendingWrite("task-a", "y", b"y"),
            PendingWrite("task-b", "x", b"b"),
        }

    async def test_put_writes_for_unknown_checkpoint_raises(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Writes for a checkpoint that does not exist are refused."""
        await put_chain(checkpointer, "t", 1)
        with pytest.raises(CheckpointError):
            await checkpointer.put_writes("t", "", new_checkpoint_id(), "task", [("x", b"1")])
        with pytest.raises(CheckpointError):
            await checkpointer.put_writes("nobody", "", new_checkpoint_id(), "task", [("x", b"")])
        assert (await get_tuple(checkpointer, "t")).pending_writes == ()

    async def test_committing_a_child_clears_the_parents_writes(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Committing a child folds in (and removes) the parent's writes."""
        [cp] = await put_chain(checkpointer, "t", 1)
        await checkpointer.put_writes("t", "", cp.checkpoint_id, "task", [("x", b"1")])
        [child] = await put_chain(checkpointer, "t", 1, after=cp)
        assert (await get_tuple(checkpointer, "t", cid=cp.checkpoint_id)).pending_writes == ()
        assert (await get_tuple(checkpointer, "t", cid=child.checkpoint_id)).pending_writes == ()

    async def test_writes_on_a_non_head_checkpoint_are_kept(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Writes of a non-head checkpoint stay until a child of it is committed."""
        cps = await put_chain(checkpointer, "t", 3)
        await checkpointer.put_writes("t", "", cps[0].checkpoint_id, "old", [("x", b"0")])
        await checkpointer.put_writes("t", "", cps[2].checkpoint_id, "new", [("x", b"2")])
        [child] = await put_chain(checkpointer, "t", 1, after=cps[2])
        old = await get_tuple(checkpointer, "t", cid=cps[0].checkpoint_id)
        assert old.pending_writes == (PendingWrite("old", "x", b"0"),)
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == child.checkpoint_id
        fork = make_checkpoint("t", parent=cps[0])
        await checkpointer.put(fork, expected_head=child.checkpoint_id)
        assert (await get_tuple(checkpointer, "t", cid=cps[0].checkpoint_id)).pending_writes == ()

    async def test_concurrent_put_writes_are_all_saved(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Concurrent tasks' writes are all saved."""
        [cp] = await put_chain(checkpointer, "t", 1)
        await asyncio.gather(
            *(
                checkpointer.put_writes("t", "", cp.checkpoint_id, f"task-{i}", [("x", bytes([i]))])
                for i in range(20)
            )
        )
        got = (await get_tuple(checkpointer, "t")).pending_writes
        assert set(got) == {PendingWrite(f"task-{i}", "x", bytes([i])) for i in range(20)}
        assert len(got) == 20

    # -- no aliasing ----------------------------------------------------------------------

    async def test_mutating_inputs_after_put_does_not_change_the_store(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The store keeps its own copy of what was put."""
        metadata: dict[str, Any] = {"user": {"tags": ["a"]}, "n": 1}
        snapshot = {"x": b"1", "y": b"2"}
        root = make_checkpoint("t", metadata=metadata, snapshot=snapshot)
        original = replace(
            root, metadata={"user": {"tags": ["a"]}, "n": 1}, snapshot=dict(snapshot)
        )
        await checkpointer.put(root, expected_head=None)
        deltas = dict(sample_deltas(1))
        child = make_checkpoint("t", parent=root, deltas=deltas)
        await checkpointer.put(child, expected_head=root.checkpoint_id)
        try_mutate(metadata)
        snapshot["z"] = b"3"
        del snapshot["x"]
        deltas["extra"] = ChannelDelta("set", (b"!",))
        del deltas["counter"]
        assert_same(
            (await get_tuple(checkpointer, "t", cid=root.checkpoint_id)).checkpoint, original
        )
        got_child = (await get_tuple(checkpointer, "t")).checkpoint
        assert dict(got_child.deltas) == sample_deltas(1)

    async def test_mutating_get_results_does_not_change_the_store(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Mutating what ``get`` returned does not change what is stored."""
        metadata = {"user": {"tags": ["a", "b"], "deep": {"k": [1]}}, "n": 1}
        cps = await put_chain(checkpointer, "t", 1)
        child = make_checkpoint("t", parent=cps[0], metadata=metadata)
        await checkpointer.put(child, expected_head=cps[0].checkpoint_id)
        first = await get_tuple(checkpointer, "t")
        for cp in (first.checkpoint, *first.chain):
            try_mutate(cp.metadata)
            try_mutate(cp.deltas)
            try_mutate(cp.snapshot)
        again = await get_tuple(checkpointer, "t")
        assert_same(again.checkpoint, child)
        assert_same(again.chain[0], cps[0])

    async def test_mutating_list_results_does_not_change_the_store(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Mutating what ``list`` returned does not change what is stored."""
        cps = await put_chain(checkpointer, "t", 3)
        for cp in await checkpointer.list("t"):
            try_mutate(cp.metadata)
            try_mutate(cp.deltas)
        for got, want in zip(await checkpointer.list("t"), reversed(cps), strict=True):
            assert_same(got, want)

    # -- delete_thread --------------------------------------------------------------------

    async def test_delete_thread_removes_namespaces_writes_and_leases(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Deleting a thread removes every namespace, write and lease of it."""
        root = await put_chain(checkpointer, "t", 2)
        sub = await put_chain(checkpointer, "t", 2, ns="sub")
        await checkpointer.put_writes("t", "", root[-1].checkpoint_id, "task", [("x", b"1")])
        await checkpointer.put_writes("t", "sub", sub[-1].checkpoint_id, "task", [("x", b"1")])
        lease = await checkpointer.acquire_lease("t", owner="run-1", ttl=60)
        await checkpointer.delete_thread("t")
        for ns, cps in (("", root), ("sub", sub)):
            assert await checkpointer.get("t", ns) is None
            assert await checkpointer.get("t", ns, cps[0].checkpoint_id) is None
            assert list(await checkpointer.list("t", ns)) == []
            assert list(await checkpointer.list_tips("t", ns)) == []
        assert "t" not in [info.thread_id for info in await checkpointer.list_threads()]
        await checkpointer.acquire_lease("t", owner="run-2", ttl=60)  # no longer busy
        with pytest.raises(LeaseLostError):
            await checkpointer.renew_lease(lease, ttl=60)

    async def test_delete_thread_leaves_other_threads_untouched(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Deleting a thread leaves similarly named threads intact."""
        chains: dict[str, list[Checkpoint]] = {}
        for i, tid in enumerate(SIMILAR_THREAD_IDS):
            chains[tid] = await put_chain(checkpointer, tid, 2)
            await put_chain(checkpointer, tid, 1, ns="sub")
            await checkpointer.put_writes(tid, "", chains[tid][-1].checkpoint_id, "w", [("x", b"")])
            await checkpointer.acquire_lease(tid, owner=f"run-{i}", ttl=60)
        await checkpointer.delete_thread("t")
        for i, (tid, cps) in enumerate(chains.items()):
            if tid == "t":
                continue
            head = await get_tuple(checkpointer, tid)
            assert_same(head.checkpoint, cps[-1])
            assert head.pending_writes == (PendingWrite("w", "x", b""),)
            assert ids_of(await checkpointer.list(tid)) == ids_of(reversed(cps))
            assert await checkpointer.get(tid, "sub") is not None
            with pytest.raises(ThreadBusyError) as info:
                await checkpointer.acquire_lease(tid, owner="intruder", ttl=60)
            assert info.value.owner == f"run-{i}"
        listed = sorted(info.thread_id for info in await checkpointer.list_threads())
        assert listed == sorted(set(SIMILAR_THREAD_IDS) - {"t"})

    async def test_delete_unknown_thread_is_a_no_op(self, checkpointer: BaseCheckpointer) -> None:
        """Deleting a thread that does not exist is not an error."""
        cps = await put_chain(checkpointer, "t", 2)
        await checkpointer.delete_thread("nobody")
        await checkpointer.delete_thread("t1")
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))

    async def test_thread_can_be_recreated_after_delete(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A deleted thread id starts afresh."""
        old = await put_chain(checkpointer, "t", 3)
        await checkpointer.delete_thread("t")
        new = await put_chain(checkpointer, "t", 2)
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(new))
        assert await checkpointer.get("t", "", old[0].checkpoint_id) is None

    # -- prune ----------------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("length", "snapshot_steps", "keep_last", "kept_steps"),
        [
            (7, {3}, 2, [6, 5, 4, 3]),
            (7, {3}, 4, [6, 5, 4, 3]),
            (7, {4}, 3, [6, 5, 4]),
            (5, set(), 2, [4, 3, 2, 1, 0]),
            (5, {1, 2, 3, 4}, 1, [4]),
        ],
    )
    async def test_prune_keeps_last_n_and_what_they_need(
        self,
        checkpointer: BaseCheckpointer,
        length: int,
        snapshot_steps: set[int],
        keep_last: int,
        kept_steps: list[int],
    ) -> None:
        """Prune keeps the last N and their chains back to a snapshot."""
        cps = await put_chain(checkpointer, "t", length, snapshot_steps=snapshot_steps)
        deleted = await checkpointer.prune("t", keep_last=keep_last)
        assert deleted == length - len(kept_steps)
        assert [cp.step for cp in await checkpointer.list("t")] == kept_steps
        for cp in cps:
            if cp.step in kept_steps:
                await assert_readable(checkpointer, cp)
            else:
                assert await checkpointer.get("t", "", cp.checkpoint_id) is None

    async def test_prune_with_rebase_keeps_exactly_n(self, checkpointer: BaseCheckpointer) -> None:
        """A rebase snapshot on the oldest retained checkpoint frees everything older."""
        cps = await put_chain(checkpointer, "t", 6)
        oldest_kept = cps[3]
        snapshot = {"count": b"\x03", "log": b"\x93\xa1a\xa1b\xa1c"}
        deleted = await checkpointer.prune(
            "t", keep_last=3, rebase=(oldest_kept.checkpoint_id, snapshot)
        )
        assert deleted == 3
        assert [cp.step for cp in await checkpointer.list("t")] == [5, 4, 3]
        got = await checkpointer.get("t", "", oldest_kept.checkpoint_id)
        assert got is not None and got.chain == ()
        assert dict(got.checkpoint.snapshot or {}) == snapshot
        head = await checkpointer.get("t")
        assert head is not None
        assert [c.checkpoint_id for c in head.chain] == ids_of(cps[3:5])
        # a rebase naming a checkpoint that does not exist changes nothing but retention
        assert await checkpointer.prune("t", keep_last=3, rebase=("missing", snapshot)) == 0

    async def test_prune_deletes_other_branches(self, checkpointer: BaseCheckpointer) -> None:
        """Prune deletes checkpoints off the current branch."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[1])
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert await checkpointer.prune("t", keep_last=10) == 3
        assert ids_of(await checkpointer.list_tips("t")) == [fork.checkpoint_id]
        assert ids_of(await checkpointer.list("t")) == ids_of([fork, cps[1], cps[0]])
        for cp in cps[2:]:
            assert await checkpointer.get("t", "", cp.checkpoint_id) is None

    async def test_prune_rejects_keep_last_below_one(self, checkpointer: BaseCheckpointer) -> None:
        """Prune refuses to keep nothing."""
        cps = await put_chain(checkpointer, "t", 3)
        for keep_last in (0, -1):
            with pytest.raises(ValueError):
                await checkpointer.prune("t", keep_last=keep_last)
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))

    async def test_prune_leaves_other_threads_intact(self, checkpointer: BaseCheckpointer) -> None:
        """Prune touches only the named thread."""
        chains = {
            tid: await put_chain(checkpointer, tid, 4, snapshot_steps={3})
            for tid in SIMILAR_THREAD_IDS
        }
        assert await checkpointer.prune("t", keep_last=1) == 3
        for tid, cps in chains.items():
            if tid != "t":
                assert ids_of(await checkpointer.list(tid)) == ids_of(reversed(cps))

    async def test_prune_keeps_head_writes_and_namespaces_readable(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """After prune the head's writes survive and every head stays readable."""
        cps = await put_chain(checkpointer, "t", 5, snapshot_steps={3})
        sub = await put_chain(checkpointer, "t", 4, ns="sub", snapshot_steps={2})
        await checkpointer.put_writes("t", "", cps[-1].checkpoint_id, "task", [("x", b"1")])
        await checkpointer.prune("t", keep_last=1)
        head = await get_tuple(checkpointer, "t")
        assert head.pending_writes == (PendingWrite("task", "x", b"1"),)
        await assert_readable(checkpointer, cps[-1])
        await assert_readable(checkpointer, sub[-1])
        [child] = await put_chain(checkpointer, "t", 1, after=cps[-1])
        await assert_readable(checkpointer, child)

    async def test_prune_is_repeatable(self, checkpointer: BaseCheckpointer) -> None:
        """Prune again (any ``keep_last``) after history was truncated."""
        cps = await put_chain(checkpointer, "t", 7, snapshot_steps={3})
        assert await checkpointer.prune("t", keep_last=2) == 3
        assert await checkpointer.prune("t", keep_last=2) == 0
        assert await checkpointer.prune("t", keep_last=10) == 0
        assert await checkpointer.prune("t", keep_last=1) == 0
        for cp in cps[3:]:
            await assert_readable(checkpointer, cp)

    async def test_prune_with_nothing_to_delete_returns_zero(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Prune with nothing to delete returns 0."""
        cps = await put_chain(checkpointer, "t", 3)
        assert await checkpointer.prune("t", keep_last=3) == 0
        assert await checkpointer.prune("nobody", keep_last=1) == 0
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))

    # -- TTL validation -------------------------------------------------------------------

    @pytest.mark.parametrize(
        "ttl",
        [float("nan"), float("inf"), -float("inf"), -1, 10**308, 1e300, 10**400],
        ids=["nan", "inf", "-inf", "negative", "1e308-int", "1e300", "1e400-int"],
    )
    async def test_set_ttl_refuses_a_ttl_that_is_not_finite_sane_seconds(
        self, checkpointer: BaseCheckpointer, ttl: float
    ) -> None:
        """NaN, infinite, negative and absurdly long TTLs are refused, naming the thread."""
        cps = await put_chain(checkpointer, "t", 2)
        try:
            await checkpointer.set_ttl("t", 0)
            await checkpointer.set_ttl("t", None)
        except NotSupportedError:
            pytest.skip("backend does not support thread TTLs")
        with pytest.raises(InvalidTTLError, match="'t'"):
            await checkpointer.set_ttl("t", ttl)
        assert await checkpointer.expire() == 0  # nothing was stored: no TTL to expire on
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))
