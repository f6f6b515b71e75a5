"""Contract test suites that every checkpoint backend passes unmodified.

A backend's test module is a subclass plus one fixture that yields a fresh, empty checkpointer
for every test::

    class TestSQLite(CheckpointerContract):
        @pytest.fixture
        async def checkpointer(self, tmp_path: Path) -> AsyncIterator[BaseCheckpointer]:
            async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
                yield cp

The suite is one class, written in three modules: this one (round trips, delta chains, reads
from known values, ordering, compare-and-set, isolation, concurrency, a model-based property),
:mod:`~graphexec.testing._retention_contract` (pending writes, aliasing, ``delete_thread``,
``prune``) and :mod:`~graphexec.testing._lease_contract` (leases and the calls that take or
release them); the sample checkpoints and assertions they share are in
:mod:`~graphexec.testing._contract_helpers`.

The suite uses only the public :class:`~graphexec._checkpoint.BaseCheckpointer` surface. It is
meant for full backends, so the optional methods (``list_tips``, ``list_threads``, ``prune``
and leases) are tested too. The class name has no ``Test`` prefix, so pytest collects only the
subclasses.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import (
    AsyncIterator,
    Sequence,
)
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    PendingWrite,
    new_checkpoint_id,
)
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    NotSupportedError,
    ThreadBusyError,
)
from graphexec.testing._contract_helpers import (
    NAMESPACES,
    SIMILAR_THREAD_IDS,
    assert_eventually,
    assert_readable,
    assert_same,
    get_tuple,
    ids_of,
    make_checkpoint,
    put_chain,
)
from graphexec.testing._lease_contract import LeaseContract
from graphexec.testing._retention_contract import WritesAndRetentionContract

__all__ = ["CheckpointerContract", "assert_eventually", "make_checkpoint", "put_chain"]


class CheckpointerContract(WritesAndRetentionContract, LeaseContract):
    """The behaviour every :class:`BaseCheckpointer` backend must show.

    Subclass it as ``Test<Backend>`` and override the ``checkpointer`` fixture so that it
    yields a fresh, empty checkpointer (set up, and closed afterwards) for each test.
    """

    get_since_stops: bool = True
    """Whether the backend's :meth:`~BaseCheckpointer.get_since` stops chains at ``known``.

    Set it to ``False`` for a backend that keeps the default (a full :meth:`get`): the tests
    then accept either answer the contract allows.
    """

    @pytest.fixture
    async def checkpointer(self) -> AsyncIterator[BaseCheckpointer]:
        """Override: yield a fresh, empty checkpointer of the backend under test."""
        raise NotImplementedError(f"{type(self).__name__} must override the checkpointer fixture")
        yield  # unreachable: makes this an async generator fixture like its overrides

    # -- round trip -------------------------------------------------------------------------

    async def test_put_then_get_round_trips_every_field(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Every field of a stored checkpoint reads back equal, with the documented types."""
        root = make_checkpoint(
            "rt",
            created_at=datetime(2024, 5, 17, 12, 34, 56, 789012, tzinfo=UTC),
            graph_version="v1",
            next_nodes=("plan", "search"),
        )
        child = make_checkpoint(
            "rt",
            parent=root,
            source="update",
            created_at=datetime(2024, 5, 17, 12, 34, 56, 789013, tzinfo=UTC),
            graph_version="v2",
            deltas={
                "messages": ChannelDelta("fold", (b'{"a":1}', "日本語 ✓".encode(), b"")),
                "blob": ChannelDelta("set", (bytes(range(256)),)),
            },
            next_nodes=(),
            metadata={
                "source": "update",
                "step": 1,
                "writes": {"agent": {"messages": [{"role": "ai", "content": "héllo 🚀"}]}},
                "user": {"tags": ["ß", "日本"], "deep": [1, 2.5, True, None, {"k": []}], "e": {}},
                "ünïcödé key": "value ✓",
            },
        )
        await checkpointer.put(root, expected_head=None)
        await checkpointer.put(child, expected_head=root.checkpoint_id)

        got_root = await get_tuple(checkpointer, "rt", cid=root.checkpoint_id)
        assert_same(got_root.checkpoint, root)
        assert got_root.checkpoint.snapshot is not None
        got_child = await get_tuple(checkpointer, "rt", cid=child.checkpoint_id)
        assert_same(got_child.checkpoint, child)
        assert got_child.checkpoint.snapshot is None
        assert got_child.pending_writes == ()

    async def test_get_head_and_get_by_id(self, checkpointer: BaseCheckpointer) -> None:
        """Get without an id returns the head; with an id, that checkpoint."""
        cps = await put_chain(checkpointer, "t", 3)
        head = await get_tuple(checkpointer, "t")
        assert_same(head.checkpoint, cps[-1])
        assert head.is_head
        by_id = await get_tuple(checkpointer, "t", cid=cps[-1].checkpoint_id)
        assert_same(by_id.checkpoint, cps[-1])
        assert by_id.is_head
        older = await get_tuple(checkpointer, "t", cid=cps[1].checkpoint_id)
        assert_same(older.checkpoint, cps[1])
        assert not older.is_head

    async def test_get_of_unknown_thread_or_checkpoint_is_none(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A lookup miss (thread, namespace or checkpoint) returns ``None``."""
        assert await checkpointer.get("nobody") is None
        assert await checkpointer.get("nobody", "", new_checkpoint_id()) is None
        cps = await put_chain(checkpointer, "t", 2)
        assert await checkpointer.get("t", "", new_checkpoint_id()) is None
        assert await checkpointer.get("t", "sub") is None
        assert await checkpointer.get("t", "sub", cps[0].checkpoint_id) is None

    async def test_is_head_moves_with_the_head(self, checkpointer: BaseCheckpointer) -> None:
        """Only the newest checkpoint of the current branch is flagged ``is_head``."""
        [first] = await put_chain(checkpointer, "t", 1)
        assert (await get_tuple(checkpointer, "t", cid=first.checkpoint_id)).is_head
        [second] = await put_chain(checkpointer, "t", 1, after=first)
        assert not (await get_tuple(checkpointer, "t", cid=first.checkpoint_id)).is_head
        assert (await get_tuple(checkpointer, "t", cid=second.checkpoint_id)).is_head

    # -- delta chains ---------------------------------------------------------------------

    async def test_chain_of_head_runs_back_to_the_snapshot_oldest_first(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The head's chain is its ancestors back to the snapshot, oldest first."""
        cps = await put_chain(checkpointer, "t", 6)
        got = await get_tuple(checkpointer, "t")
        assert ids_of(got.chain) == ids_of(cps[:-1])
        for stored, original in zip(got.chain, cps, strict=False):
            assert_same(stored, original)
        assert (await get_tuple(checkpointer, "t", cid=cps[0].checkpoint_id)).chain == ()

    async def test_later_snapshot_resets_the_chain(self, checkpointer: BaseCheckpointer) -> None:
        """A chain stops at the nearest snapshot."""
        cps = await put_chain(checkpointer, "t", 6, snapshot_steps={3})
        assert ids_of((await get_tuple(checkpointer, "t")).chain) == ids_of(cps[3:5])
        assert (await get_tuple(checkpointer, "t", cid=cps[3].checkpoint_id)).chain == ()
        before_snapshot = await get_tuple(checkpointer, "t", cid=cps[2].checkpoint_id)
        assert ids_of(before_snapshot.chain) == ids_of(cps[:2])

    async def test_chain_of_a_mid_history_checkpoint(self, checkpointer: BaseCheckpointer) -> None:
        """A mid-history checkpoint's chain holds only its own ancestors."""
        cps = await put_chain(checkpointer, "t", 7)
        got = await get_tuple(checkpointer, "t", cid=cps[3].checkpoint_id)
        assert ids_of(got.chain) == ids_of(cps[:3])
        assert_same(got.checkpoint, cps[3])

    async def test_chain_of_a_branch_follows_its_own_ancestors(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A branch's chain follows parent links, not the old branch."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[2], source="fork")
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert ids_of((await get_tuple(checkpointer, "t")).chain) == ids_of(cps[:3])
        assert ids_of(
            (await get_tuple(checkpointer, "t", cid=cps[4].checkpoint_id)).chain
        ) == ids_of(cps[:4])

    # -- reads from known values (get_since) ---------------------------------------------

    async def _assert_since(
        self,
        checkpointer: BaseCheckpointer,
        thread_id: str,
        target: Checkpoint,
        known: str,
        stopped: Sequence[Checkpoint] | None,
    ) -> None:
        """``get_since(target, known)`` returns the full chain, or (if allowed) ``stopped``."""
        full = await get_tuple(checkpointer, thread_id, cid=target.checkpoint_id)
        got = await checkpointer.get_since(thread_id, "", target.checkpoint_id, known=known)
        assert got is not None
        assert_same(got.checkpoint, target)
        assert got.is_head == full.is_head
        assert got.pending_writes == full.pending_writes
        answers = [ids_of(full.chain)]
        if stopped is not None:
            answers = [ids_of(stopped)] if self.get_since_stops else [*answers, ids_of(stopped)]
        assert ids_of(got.chain) in answers
        for stored, original in zip(got.chain, full.chain[-len(got.chain) :], strict=False):
            assert_same(stored, original)

    async def test_get_since_stops_after_the_known_checkpoint(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The chain starts at ``known``'s child, or is empty when ``known`` is the target."""
        cps = await put_chain(checkpointer, "t", 6)
        head = cps[-1]
        await self._assert_since(checkpointer, "t", head, cps[2].checkpoint_id, cps[3:5])
        await self._assert_since(checkpointer, "t", head, cps[4].checkpoint_id, [])
        await self._assert_since(checkpointer, "t", head, head.checkpoint_id, [])
        await self._assert_since(checkpointer, "t", cps[3], cps[1].checkpoint_id, cps[2:3])
        got = await checkpointer.get_since("t", "", None, known=cps[2].checkpoint_id)
        assert got is not None and got.checkpoint.checkpoint_id == head.checkpoint_id

    async def test_get_since_stops_at_a_snapshot_newer_than_known(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A snapshot between ``known`` and the target ends the chain as in ``get``."""
        cps = await put_chain(checkpointer, "t", 6, snapshot_steps={3})
        await self._assert_since(checkpointer, "t", cps[-1], cps[1].checkpoint_id, None)
        got = await checkpointer.get_since("t", "", None, known=cps[1].checkpoint_id)
        assert got is not None and ids_of(got.chain) == ids_of(cps[3:5])

    async def test_get_since_ignores_a_known_checkpoint_off_the_chain(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """``known`` on another branch, pruned, deleted or never stored changes nothing."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[1], source="fork")
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        for known in (cps[3].checkpoint_id, cps[4].checkpoint_id, new_checkpoint_id()):
            await self._assert_since(checkpointer, "t", fork, known, None)
            got = await checkpointer.get_since("t", "", None, known=known)
            assert got is not None and ids_of(got.chain) == ids_of(cps[:2])
        await checkpointer.delete_thread("t")
        again = await put_chain(checkpointer, "t", 3)
        got = await checkpointer.get_since("t", "", None, known=cps[1].checkpoint_id)
        assert got is not None and ids_of(got.chain) == ids_of(again[:2])
        assert await checkpointer.get_since("nope", "", None, known=cps[1].checkpoint_id) is None

    async def test_get_since_after_prune_with_rebase(self, checkpointer: BaseCheckpointer) -> None:
        """A known checkpoint pruned away is simply not reached: the rebased snapshot is."""
        cps = await put_chain(checkpointer, "t", 6)
        try:
            await checkpointer.prune("t", keep_last=2, rebase=(cps[4].checkpoint_id, {"x": b"1"}))
        except NotSupportedError:
            pytest.skip("backend does not support prune()")
        got = await checkpointer.get_since("t", "", None, known=cps[1].checkpoint_id)
        assert got is not None and ids_of(got.chain) == ids_of(cps[4:5])
        assert got.chain[0].snapshot == {"x": b"1"}

    # -- ordering -------------------------------------------------------------------------

    async def test_list_is_newest_first(self, checkpointer: BaseCheckpointer) -> None:
        """List the current branch newest first, every field intact."""
        cps = await put_chain(checkpointer, "t", 5, snapshot_steps={2})
        listed = await checkpointer.list("t")
        assert ids_of(listed) == ids_of(reversed(cps))
        for got, want in zip(listed, reversed(cps), strict=True):
            assert_same(got, want)

    async def test_list_limit(self, checkpointer: BaseCheckpointer) -> None:
        """``limit`` caps the listing from the newest end."""
        cps = await put_chain(checkpointer, "t", 5)
        assert ids_of(await checkpointer.list("t", limit=2)) == ids_of([cps[4], cps[3]])
        assert ids_of(await checkpointer.list("t", limit=1)) == [cps[4].checkpoint_id]
        assert len(await checkpointer.list("t", limit=50)) == 5

    async def test_list_before(self, checkpointer: BaseCheckpointer) -> None:
        """``before`` starts the listing at that checkpoint's parent."""
        cps = await put_chain(checkpointer, "t", 5)
        before = cps[3].checkpoint_id
        assert ids_of(await checkpointer.list("t", before=before)) == ids_of(reversed(cps[:3]))
        assert ids_of(await checkpointer.list("t", before=before, limit=2)) == ids_of(
            [cps[2], cps[1]]
        )
        assert list(await checkpointer.list("t", before=cps[0].checkpoint_id)) == []

    async def test_list_after_a_branch_follows_only_the_new_branch(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """After a branch, the listing follows the new branch only."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[1], source="update")
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert ids_of(await checkpointer.list("t")) == ids_of([fork, cps[1], cps[0]])
        old = await get_tuple(checkpointer, "t", cid=cps[4].checkpoint_id)
        assert not old.is_head
        [child] = await put_chain(checkpointer, "t", 1, after=fork)
        assert ids_of(await checkpointer.list("t")) == ids_of([child, fork, cps[1], cps[0]])

    async def test_list_tips_returns_one_tip_per_branch_newest_first(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Each branch has exactly one tip; tips are listed newest first."""
        cps = await put_chain(checkpointer, "t", 4)
        assert ids_of(await checkpointer.list_tips("t")) == [cps[-1].checkpoint_id]
        fork = make_checkpoint("t", parent=cps[1])
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert ids_of(await checkpointer.list_tips("t")) == ids_of([fork, cps[-1]])

    async def test_list_of_unknown_thread_is_empty(self, checkpointer: BaseCheckpointer) -> None:
        """Listing an unknown thread or namespace returns nothing."""
        await put_chain(checkpointer, "t", 2)
        assert list(await checkpointer.list("nobody")) == []
        assert list(await checkpointer.list("t", "sub")) == []
        assert list(await checkpointer.list_tips("nobody")) == []

    # -- compare-and-set ------------------------------------------------------------------

    async def test_wrong_expected_head_conflicts_and_writes_nothing(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A stale ``expected_head`` is a conflict and nothing is written."""
        cps = await put_chain(checkpointer, "t", 3)
        late = make_checkpoint("t", parent=cps[1])
        with pytest.raises(CheckpointConflictError) as info:
            await checkpointer.put(late, expected_head=cps[1].checkpoint_id)
        assert info.value.thread_id == "t"
        assert info.value.expected_head == cps[1].checkpoint_id
        assert info.value.actual_head == cps[2].checkpoint_id
        assert await checkpointer.get("t", "", late.checkpoint_id) is None
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == cps[2].checkpoint_id
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))
        assert ids_of(await checkpointer.list_tips("t")) == [cps[2].checkpoint_id]

    async def test_new_thread_requires_expected_head_none(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The first checkpoint of a thread must expect no head."""
        first = make_checkpoint("t")
        with pytest.raises(CheckpointConflictError) as info:
            await checkpointer.put(first, expected_head=new_checkpoint_id())
        assert info.value.actual_head is None
        assert await checkpointer.get("t") is None
        await checkpointer.put(first, expected_head=None)
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == first.checkpoint_id

    async def test_expected_head_none_on_existing_thread_conflicts(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Expecting no head on an existing thread is a conflict."""
        [first] = await put_chain(checkpointer, "t", 1)
        with pytest.raises(CheckpointConflictError) as info:
            await checkpointer.put(make_checkpoint("t"), expected_head=None)
        assert info.value.expected_head is None
        assert info.value.actual_head == first.checkpoint_id
        assert ids_of(await checkpointer.list("t")) == [first.checkpoint_id]

    async def test_duplicate_checkpoint_id_is_rejected(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A checkpoint id can be stored once; the original stays."""
        cps = await put_chain(checkpointer, "t", 3)
        dup = make_checkpoint(
            "t", parent=cps[2], checkpoint_id=cps[0].checkpoint_id, metadata={"dup": True}
        )
        with pytest.raises(CheckpointError) as info:
            await checkpointer.put(dup, expected_head=cps[2].checkpoint_id)
        assert not isinstance(info.value, CheckpointConflictError)
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == cps[2].checkpoint_id
        assert_same(
            (await get_tuple(checkpointer, "t", cid=cps[0].checkpoint_id)).checkpoint, cps[0]
        )

    async def test_reputting_the_head_is_rejected(self, checkpointer: BaseCheckpointer) -> None:
        """Re-putting an identical checkpoint is an error."""
        cps = await put_chain(checkpointer, "t", 2)
        with pytest.raises(CheckpointError):
            await checkpointer.put(cps[1], expected_head=cps[1].checkpoint_id)
        assert ids_of(await checkpointer.list("t")) == ids_of(reversed(cps))

    async def test_unknown_parent_is_rejected(self, checkpointer: BaseCheckpointer) -> None:
        """A parent outside the thread's stored checkpoints is refused."""
        cps = await put_chain(checkpointer, "t", 2)
        orphan = replace(make_checkpoint("t", parent=cps[1]), parent_id=new_checkpoint_id())
        with pytest.raises(CheckpointError):
            await checkpointer.put(orphan, expected_head=cps[1].checkpoint_id)
        assert await checkpointer.get("t", "", orphan.checkpoint_id) is None
        assert (await get_tuple(checkpointer, "t")).checkpoint.checkpoint_id == cps[1].checkpoint_id
        other = make_checkpoint("other", parent=cps[1])  # the parent lives in another thread
        with pytest.raises(CheckpointError):
            await checkpointer.put(other, expected_head=None)
        assert await checkpointer.get("other") is None

    # -- isolation ------------------------------------------------------------------------

    async def test_threads_are_isolated_by_exact_id(self, checkpointer: BaseCheckpointer) -> None:
        """Similar thread ids never see each other's checkpoints, heads or writes."""
        chains: dict[str, list[Checkpoint]] = {}
        for i, tid in enumerate(SIMILAR_THREAD_IDS):
            chains[tid] = await put_chain(checkpointer, tid, 2)
            await checkpointer.put_writes(
                tid, "", chains[tid][-1].checkpoint_id, f"task-{i}", [("out", tid.encode())]
            )
        for i, (tid, cps) in enumerate(chains.items()):
            head = await get_tuple(checkpointer, tid)
            assert_same(head.checkpoint, cps[-1])
            assert head.pending_writes == (PendingWrite(f"task-{i}", "out", tid.encode()),)
            assert ids_of(await checkpointer.list(tid)) == ids_of(reversed(cps))
            assert ids_of(await checkpointer.list_tips(tid)) == [cps[-1].checkpoint_id]
            for other, other_cps in chains.items():
                if other != tid:
                    assert await checkpointer.get(tid, "", other_cps[-1].checkpoint_id) is None
        with pytest.raises(CheckpointError):
            await checkpointer.put_writes("t1", "", chains["t"][-1].checkpoint_id, "x", [])
        with pytest.raises(CheckpointConflictError):
            await checkpointer.put(
                make_checkpoint("t", parent=chains["t"][-1]),
                expected_head=chains["t1"][-1].checkpoint_id,
            )

    async def test_leases_are_isolated_by_exact_thread_id(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A lease on one thread id never blocks a similar one."""
        leases = {
            tid: await checkpointer.acquire_lease(tid, owner=f"run-{i}", ttl=60)
            for i, tid in enumerate(SIMILAR_THREAD_IDS)
        }
        for tid, lease in leases.items():
            assert lease.thread_id == tid
            with pytest.raises(ThreadBusyError) as info:
                await checkpointer.acquire_lease(tid, owner="intruder", ttl=60)
            assert info.value.owner == lease.owner
        await checkpointer.release_lease(leases["t"])
        await checkpointer.acquire_lease("t", owner="intruder", ttl=60)
        with pytest.raises(ThreadBusyError):
            await checkpointer.acquire_lease("t1", owner="other", ttl=60)

    async def test_namespaces_are_isolated_with_own_heads(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Each namespace of a thread has its own head, history and writes."""
        chains = {
            ns: await put_chain(checkpointer, "t", 2 + i, ns=ns) for i, ns in enumerate(NAMESPACES)
        }
        for i, (ns, cps) in enumerate(chains.items()):
            await checkpointer.put_writes(
                "t", ns, cps[-1].checkpoint_id, "task", [("ns", bytes([i]))]
            )
        for i, (ns, cps) in enumerate(chains.items()):
            head = await get_tuple(checkpointer, "t", ns)
            assert_same(head.checkpoint, cps[-1])
            assert head.checkpoint.checkpoint_ns == ns
            assert head.pending_writes == (PendingWrite("task", "ns", bytes([i])),)
            assert ids_of(await checkpointer.list("t", ns)) == ids_of(reversed(cps))
            for other, other_cps in chains.items():
                if other != ns:
                    assert await checkpointer.get("t", ns, other_cps[0].checkpoint_id) is None
        with pytest.raises(CheckpointError):
            await checkpointer.put_writes("t", "sub", chains[""][-1].checkpoint_id, "x", [])

    async def test_list_threads_lists_root_namespace_threads_only(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """``list_threads`` lists threads with a root-namespace head, once each."""
        await put_chain(checkpointer, "root-only", 2)
        both = await put_chain(checkpointer, "both", 1)
        await put_chain(checkpointer, "both", 3, ns="sub")
        await put_chain(checkpointer, "sub-only", 2, ns="sub")
        infos = await checkpointer.list_threads()
        assert sorted(info.thread_id for info in infos) == ["both", "root-only"]
        [info] = [i for i in infos if i.thread_id == "both"]
        assert info.head_id == both[0].checkpoint_id
        assert info.checkpoints == 1

    async def test_list_threads_summarises_heads_most_recent_first(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """``list_threads`` summarises each head, most recently updated first."""
        a = await put_chain(checkpointer, "a", 2)
        b = await put_chain(checkpointer, "b", 3)
        fork = make_checkpoint("b", parent=b[0], next_nodes=())
        await checkpointer.put(fork, expected_head=b[-1].checkpoint_id)
        a += await put_chain(checkpointer, "a", 1, after=a[-1])
        infos = await checkpointer.list_threads()
        assert [i.thread_id for i in infos] == ["a", "b"]
        info_a, info_b = infos
        assert (info_a.head_id, info_a.step, info_a.checkpoints) == (a[-1].checkpoint_id, 2, 3)
        assert info_a.updated_at == a[-1].created_at
        assert tuple(info_a.next_nodes) == ("agent",)
        assert (info_b.head_id, info_b.step, info_b.checkpoints) == (fork.checkpoint_id, 1, 4)
        assert tuple(info_b.next_nodes) == ()

    # -- concurrency ----------------------------------------------------------------------

    async def test_concurrent_writers_on_one_head_have_exactly_one_winner(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Of many writers on one head exactly one commits; history never forks."""
        cps = await put_chain(checkpointer, "t", 2)
        head = cps[-1]
        children = [make_checkpoint("t", parent=head, metadata={"writer": i}) for i in range(20)]
        results = await asyncio.gather(
            *(checkpointer.put(c, expected_head=head.checkpoint_id) for c in children),
            return_exceptions=True,
        )
        won = [c for c, r in zip(children, results, strict=True) if r is None]
        assert len(won) == 1
        lost = [r for r in results if r is not None]
        assert all(isinstance(r, CheckpointConflictError) for r in lost), lost
        assert all(
            r.actual_head == won[0].checkpoint_id
            for r in lost
            if isinstance(r, CheckpointConflictError)
        )
        assert ids_of(await checkpointer.list("t")) == ids_of([won[0], *reversed(cps)])
        assert ids_of(await checkpointer.list_tips("t")) == [won[0].checkpoint_id]

    async def test_many_threads_written_concurrently_are_all_readable(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Threads written concurrently are all complete and readable."""
        tids = [f"thread-{i}" for i in range(30)]
        chains = await asyncio.gather(
            *(put_chain(checkpointer, tid, 5, snapshot_steps={3}) for tid in tids)
        )
        for tid, cps in zip(tids, chains, strict=True):
            assert ids_of(await checkpointer.list(tid)) == ids_of(reversed(cps))
            for cp in cps:
                await assert_readable(checkpointer, cp)
        assert len(await checkpointer.list_threads()) == len(tids)

    # -- ids ------------------------------------------------------------------------------

    async def test_new_checkpoint_ids_are_unique_and_time_ordered(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Checkpoint ids are unique and sort in creation order."""
        ids = [new_checkpoint_id() for _ in range(10_000)]
        assert len(set(ids)) == len(ids)
        assert sorted(ids) == ids
        cps = await put_chain(checkpointer, "t", 50)
        assert sorted(ids_of(cps)) == ids_of(cps)

    # -- property -------------------------------------------------------------------------

    # The fixture's checkpointer is shared by all examples of one test (each example uses its
    # own thread), and every backend's subclass runs this same method: replaying one backend's
    # examples against another is harmless, so neither health check applies.
    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.differing_executors,
        ],
    )
    @given(
        ops=st.lists(
            st.tuples(st.booleans(), st.integers(min_value=0, max_value=1000), st.booleans()),
            min_size=1,
            max_size=20,
        )
    )
    async def test_random_histories_match_a_model(
        self, checkpointer: BaseCheckpointer, ops: list[tuple[bool, int, bool]]
    ) -> None:
        """Random appends and branches: listing, tips and chains match a model."""
        # One checkpointer serves every example, so each example gets its own thread.
        tid = f"prop-{uuid.uuid4().hex}"
        head = make_checkpoint(tid)
        await checkpointer.put(head, expected_head=None)
        created = [head]
        for branch, pick, snapshot in ops:
            parent = created[pick % len(created)] if branch else head
            cp = make_checkpoint(tid, parent=parent, snapshot=snapshot)
            await checkpointer.put(cp, expected_head=head.checkpoint_id)
            created.append(cp)
            head = cp

        by_id = {cp.checkpoint_id: cp for cp in created}
        branch_ids: list[str] = []
        cursor: str | None = head.checkpoint_id
        while cursor is not None:
            branch_ids.append(cursor)
            cursor = by_id[cursor].parent_id
        assert ids_of(await checkpointer.list(tid)) == branch_ids
        parents = {cp.parent_id for cp in created}
        tips = {cp.checkpoint_id for cp in created if cp.checkpoint_id not in parents}
        assert set(ids_of(await checkpointer.list_tips(tid))) == tips

        for cp in created:
            got = await get_tuple(checkpointer, tid, cid=cp.checkpoint_id)
            assert got.is_head == (cp is head)
            expected_chain: list[str] = []
            walk = cp
            while walk.snapshot is None and walk.parent_id is not None:
                walk = by_id[walk.parent_id]
                expected_chain.insert(0, walk.checkpoint_id)
            assert ids_of(got.chain) == expected_chain
            await assert_readable(checkpointer, cp)
