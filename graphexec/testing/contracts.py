"""Contract test suites that every checkpoint backend passes unmodified.

A backend's test module is a subclass plus one fixture that yields a fresh, empty checkpointer
for every test::

    class TestSQLite(CheckpointerContract):
        @pytest.fixture
        async def checkpointer(self, tmp_path: Path) -> AsyncIterator[BaseCheckpointer]:
            async with SqliteCheckpointer.open(tmp_path / "cp.db") as cp:
                yield cp

The suite uses only the public :class:`~graphexec._checkpoint.BaseCheckpointer` surface. It is
meant for full backends, so the optional methods (``list_tips``, ``list_threads``, ``prune``
and leases) are tested too. The class name has no ``Test`` prefix, so pytest collects only the
subclasses.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Mapping,
    MutableMapping,
    MutableSequence,
    Sequence,
)
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphexec._checkpoint import (
    BaseCheckpointer,
    ChannelDelta,
    Checkpoint,
    CheckpointSource,
    CheckpointTuple,
    Lease,
    PendingWrite,
    new_checkpoint_id,
)
from graphexec.errors import (
    CheckpointConflictError,
    CheckpointError,
    LeaseLostError,
    NotSupportedError,
    ThreadBusyError,
)

__all__ = ["CheckpointerContract", "assert_eventually", "make_checkpoint", "put_chain"]

_T = TypeVar("_T")

_GRAPH_VERSION = "sha256:5f1d0c3be4a79a2c"
_clock_lock = threading.Lock()
_last_created_at = datetime(1970, 1, 1, tzinfo=UTC)


def _next_created_at() -> datetime:
    """Now (UTC), strictly later than any earlier call, so creation order is unambiguous."""
    global _last_created_at
    with _clock_lock:
        now = datetime.now(UTC)
        if now <= _last_created_at:
            now = _last_created_at + timedelta(microseconds=1)
        _last_created_at = now
        return now


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode()


def _sample_deltas(step: int) -> dict[str, ChannelDelta]:
    message = {"role": "assistant" if step % 2 else "user", "content": f"message {step} ✓"}
    return {
        "messages": ChannelDelta("fold", (_encode([message]),)),
        "counter": ChannelDelta("set", (_encode(step),)),
    }


def _sample_snapshot(step: int) -> dict[str, bytes]:
    messages = [{"role": "user", "content": f"message {i} ✓"} for i in range(step + 1)]
    return {"messages": _encode(messages), "counter": _encode(step), "notes": b""}


def make_checkpoint(
    thread_id: str,
    *,
    parent: Checkpoint | None = None,
    ns: str = "",
    step: int | None = None,
    source: CheckpointSource | None = None,
    deltas: Mapping[str, ChannelDelta] | None = None,
    snapshot: Mapping[str, bytes] | bool | None = None,
    metadata: Mapping[str, Any] | None = None,
    next_nodes: tuple[str, ...] = ("agent",),
    checkpoint_id: str | None = None,
    created_at: datetime | None = None,
    graph_version: str = _GRAPH_VERSION,
) -> Checkpoint:
    """Build a valid, realistic :class:`Checkpoint` (it is not stored).

    Args:
        thread_id: The thread the checkpoint belongs to.
        parent: The checkpoint it follows; ``None`` for the first checkpoint of a thread.
        ns: The checkpoint namespace.
        step: Defaults to 0 for a first checkpoint, else the parent's step plus one.
        source: Defaults to ``"input"`` for a first checkpoint, else ``"loop"``.
        deltas: What the step changed; defaults to a realistic fold and set.
        snapshot: A full snapshot, ``True`` to generate one, ``False`` for none. ``None`` (the
            default) means a snapshot for a first checkpoint only.
        metadata: Defaults to what the engine records (source, step, run id).
        next_nodes: The nodes the frontier will run next.
        checkpoint_id: Defaults to :func:`new_checkpoint_id`.
        created_at: Defaults to now (UTC), strictly increasing across calls.
        graph_version: The graph fingerprint.

    Returns:
        The checkpoint, with ``delta_depth``, ``delta_bytes`` and ``snapshot_bytes``
        consistent with ``parent``.

    """
    if step is None:
        step = 0 if parent is None else parent.step + 1
    if source is None:
        source = "input" if parent is None else "loop"
    if deltas is None:
        deltas = _sample_deltas(step)
    if snapshot is None:
        snapshot = parent is None
    if snapshot is True:
        snapshot = _sample_snapshot(step)
    elif snapshot is False:
        snapshot = None
    if snapshot is not None:
        depth, delta_bytes, snapshot_bytes = 0, 0, sum(len(b) for b in snapshot.values())
    elif parent is not None:
        depth = parent.delta_depth + 1
        delta_bytes = parent.delta_bytes + sum(d.nbytes for d in deltas.values())
        snapshot_bytes = parent.snapshot_bytes
    else:
        depth, delta_bytes, snapshot_bytes = 0, 0, 0
    if metadata is None:
        metadata = {"source": source, "step": step, "run_id": "run-1", "tags": ["contract"]}
    frontier = _encode([{"node": node, "task_id": f"{node}:{step + 1}"} for node in next_nodes])
    return Checkpoint(
        thread_id=thread_id,
        checkpoint_ns=ns,
        checkpoint_id=checkpoint_id or new_checkpoint_id(),
        parent_id=None if parent is None else parent.checkpoint_id,
        step=step,
        source=source,
        created_at=created_at or _next_created_at(),
        graph_version=graph_version,
        deltas=deltas,
        snapshot=snapshot,
        frontier=frontier,
        next_nodes=next_nodes,
        metadata=metadata,
        delta_depth=depth,
        delta_bytes=delta_bytes,
        snapshot_bytes=snapshot_bytes,
    )


async def put_chain(
    checkpointer: BaseCheckpointer,
    thread_id: str,
    length: int,
    *,
    ns: str = "",
    after: Checkpoint | None = None,
    snapshot_steps: Collection[int] = (),
    lease: Lease | None = None,
) -> list[Checkpoint]:
    """Commit ``length`` checkpoints in a row and return them, oldest first.

    Args:
        checkpointer: Where to commit.
        thread_id: The thread.
        length: How many checkpoints to commit.
        ns: The checkpoint namespace.
        after: The current head to continue from; ``None`` starts a new thread (its first
            checkpoint carries a snapshot).
        snapshot_steps: Steps whose checkpoint also carries a snapshot.
        lease: Passed to every :meth:`~BaseCheckpointer.put`.

    """
    out: list[Checkpoint] = []
    head = after
    for _ in range(length):
        step = 0 if head is None else head.step + 1
        cp = make_checkpoint(
            thread_id, parent=head, ns=ns, snapshot=head is None or step in snapshot_steps
        )
        await checkpointer.put(
            cp, expected_head=None if head is None else head.checkpoint_id, lease=lease
        )
        out.append(cp)
        head = cp
    return out


async def assert_eventually(
    probe: Callable[[], Awaitable[_T]],
    *,
    timeout: float = 5.0,
    interval: float = 0.01,
    retry_on: tuple[type[BaseException], ...] = (AssertionError,),
) -> _T:
    """Await ``probe`` until it stops raising ``retry_on``; return its result.

    Args:
        probe: The check to retry.
        timeout: Give up (re-raising the last error) after this many seconds.
        interval: Pause between attempts, in seconds.
        retry_on: The exceptions that mean "not yet".

    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await probe()
        except retry_on:
            if loop.time() >= deadline:
                raise
        await asyncio.sleep(interval)


def _ids(checkpoints: Iterable[Checkpoint]) -> list[str]:
    return [cp.checkpoint_id for cp in checkpoints]


def _assert_same(got: Checkpoint, want: Checkpoint) -> None:
    """Field-by-field equality, plus the types a backend must hand back."""
    for name in (
        "thread_id",
        "checkpoint_ns",
        "checkpoint_id",
        "parent_id",
        "step",
        "source",
        "created_at",
        "graph_version",
        "frontier",
        "next_nodes",
        "delta_depth",
        "delta_bytes",
        "snapshot_bytes",
    ):
        assert getattr(got, name) == getattr(want, name), name
    assert got.created_at.utcoffset() == timedelta(0)
    assert dict(got.deltas) == dict(want.deltas)
    assert all(isinstance(b, bytes) for d in got.deltas.values() for b in d.blobs)
    assert (None if got.snapshot is None else dict(got.snapshot)) == want.snapshot
    assert got.snapshot is None or all(isinstance(b, bytes) for b in got.snapshot.values())
    assert isinstance(got.frontier, bytes)
    assert dict(got.metadata) == dict(want.metadata)


async def _get(
    checkpointer: BaseCheckpointer, thread_id: str, ns: str = "", cid: str = ""
) -> CheckpointTuple:
    """``get`` that must find something (``cid=""`` means the head)."""
    got = await checkpointer.get(thread_id, ns, cid or None)
    assert got is not None, (thread_id, ns, cid)
    return got


async def _assert_readable(checkpointer: BaseCheckpointer, cp: Checkpoint) -> None:
    """``cp`` is stored, and its chain is complete back to a snapshot."""
    got = await _get(checkpointer, cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id)
    _assert_same(got.checkpoint, cp)
    links = [*got.chain, got.checkpoint]
    assert links[0].snapshot is not None
    assert all(c.snapshot is None for c in links[1:])
    for older, newer in itertools.pairwise(links):
        assert newer.parent_id == older.checkpoint_id


def _try_mutate(value: Any) -> None:
    """Mutate every mutable container reachable from ``value``; read-only ones are fine."""
    try:
        if isinstance(value, MutableMapping):
            for item in list(value.values()):
                _try_mutate(item)
            value["__mutated__"] = True
            value.pop(next(iter(value)), None)
        elif isinstance(value, MutableSequence):
            for item in list(value):
                _try_mutate(item)
            value.append("__mutated__")
    except (TypeError, AttributeError):
        pass


_SIMILAR_THREAD_IDS = (
    "t",
    "t1",
    "t%",
    "t_",
    "T",
    "t ",
    " t",
    "t'",
    't"',
    "t\\",
    "t/sub",
    "t|sub",
    "t:sub",
    "tü",
    "t.*",
)
_NAMESPACES = ("", "sub", "sub|x", "sub:x", "Sub")


class CheckpointerContract:
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

        got_root = await _get(checkpointer, "rt", cid=root.checkpoint_id)
        _assert_same(got_root.checkpoint, root)
        assert got_root.checkpoint.snapshot is not None
        got_child = await _get(checkpointer, "rt", cid=child.checkpoint_id)
        _assert_same(got_child.checkpoint, child)
        assert got_child.checkpoint.snapshot is None
        assert got_child.pending_writes == ()

    async def test_get_head_and_get_by_id(self, checkpointer: BaseCheckpointer) -> None:
        """Get without an id returns the head; with an id, that checkpoint."""
        cps = await put_chain(checkpointer, "t", 3)
        head = await _get(checkpointer, "t")
        _assert_same(head.checkpoint, cps[-1])
        assert head.is_head
        by_id = await _get(checkpointer, "t", cid=cps[-1].checkpoint_id)
        _assert_same(by_id.checkpoint, cps[-1])
        assert by_id.is_head
        older = await _get(checkpointer, "t", cid=cps[1].checkpoint_id)
        _assert_same(older.checkpoint, cps[1])
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
        assert (await _get(checkpointer, "t", cid=first.checkpoint_id)).is_head
        [second] = await put_chain(checkpointer, "t", 1, after=first)
        assert not (await _get(checkpointer, "t", cid=first.checkpoint_id)).is_head
        assert (await _get(checkpointer, "t", cid=second.checkpoint_id)).is_head

    # -- delta chains ---------------------------------------------------------------------

    async def test_chain_of_head_runs_back_to_the_snapshot_oldest_first(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """The head's chain is its ancestors back to the snapshot, oldest first."""
        cps = await put_chain(checkpointer, "t", 6)
        got = await _get(checkpointer, "t")
        assert _ids(got.chain) == _ids(cps[:-1])
        for stored, original in zip(got.chain, cps, strict=False):
            _assert_same(stored, original)
        assert (await _get(checkpointer, "t", cid=cps[0].checkpoint_id)).chain == ()

    async def test_later_snapshot_resets_the_chain(self, checkpointer: BaseCheckpointer) -> None:
        """A chain stops at the nearest snapshot."""
        cps = await put_chain(checkpointer, "t", 6, snapshot_steps={3})
        assert _ids((await _get(checkpointer, "t")).chain) == _ids(cps[3:5])
        assert (await _get(checkpointer, "t", cid=cps[3].checkpoint_id)).chain == ()
        before_snapshot = await _get(checkpointer, "t", cid=cps[2].checkpoint_id)
        assert _ids(before_snapshot.chain) == _ids(cps[:2])

    async def test_chain_of_a_mid_history_checkpoint(self, checkpointer: BaseCheckpointer) -> None:
        """A mid-history checkpoint's chain holds only its own ancestors."""
        cps = await put_chain(checkpointer, "t", 7)
        got = await _get(checkpointer, "t", cid=cps[3].checkpoint_id)
        assert _ids(got.chain) == _ids(cps[:3])
        _assert_same(got.checkpoint, cps[3])

    async def test_chain_of_a_branch_follows_its_own_ancestors(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A branch's chain follows parent links, not the old branch."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[2], source="fork")
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert _ids((await _get(checkpointer, "t")).chain) == _ids(cps[:3])
        assert _ids((await _get(checkpointer, "t", cid=cps[4].checkpoint_id)).chain) == _ids(
            cps[:4]
        )

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
        full = await _get(checkpointer, thread_id, cid=target.checkpoint_id)
        got = await checkpointer.get_since(thread_id, "", target.checkpoint_id, known=known)
        assert got is not None
        _assert_same(got.checkpoint, target)
        assert got.is_head == full.is_head
        assert got.pending_writes == full.pending_writes
        answers = [_ids(full.chain)]
        if stopped is not None:
            answers = [_ids(stopped)] if self.get_since_stops else [*answers, _ids(stopped)]
        assert _ids(got.chain) in answers
        for stored, original in zip(got.chain, full.chain[-len(got.chain) :], strict=False):
            _assert_same(stored, original)

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
        assert got is not None and _ids(got.chain) == _ids(cps[3:5])

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
            assert got is not None and _ids(got.chain) == _ids(cps[:2])
        await checkpointer.delete_thread("t")
        again = await put_chain(checkpointer, "t", 3)
        got = await checkpointer.get_since("t", "", None, known=cps[1].checkpoint_id)
        assert got is not None and _ids(got.chain) == _ids(again[:2])
        assert await checkpointer.get_since("nope", "", None, known=cps[1].checkpoint_id) is None

    async def test_get_since_after_prune_with_rebase(self, checkpointer: BaseCheckpointer) -> None:
        """A known checkpoint pruned away is simply not reached: the rebased snapshot is."""
        cps = await put_chain(checkpointer, "t", 6)
        try:
            await checkpointer.prune("t", keep_last=2, rebase=(cps[4].checkpoint_id, {"x": b"1"}))
        except NotSupportedError:
            pytest.skip("backend does not support prune()")
        got = await checkpointer.get_since("t", "", None, known=cps[1].checkpoint_id)
        assert got is not None and _ids(got.chain) == _ids(cps[4:5])
        assert got.chain[0].snapshot == {"x": b"1"}

    # -- ordering -------------------------------------------------------------------------

    async def test_list_is_newest_first(self, checkpointer: BaseCheckpointer) -> None:
        """List the current branch newest first, every field intact."""
        cps = await put_chain(checkpointer, "t", 5, snapshot_steps={2})
        listed = await checkpointer.list("t")
        assert _ids(listed) == _ids(reversed(cps))
        for got, want in zip(listed, reversed(cps), strict=True):
            _assert_same(got, want)

    async def test_list_limit(self, checkpointer: BaseCheckpointer) -> None:
        """``limit`` caps the listing from the newest end."""
        cps = await put_chain(checkpointer, "t", 5)
        assert _ids(await checkpointer.list("t", limit=2)) == _ids([cps[4], cps[3]])
        assert _ids(await checkpointer.list("t", limit=1)) == [cps[4].checkpoint_id]
        assert len(await checkpointer.list("t", limit=50)) == 5

    async def test_list_before(self, checkpointer: BaseCheckpointer) -> None:
        """``before`` starts the listing at that checkpoint's parent."""
        cps = await put_chain(checkpointer, "t", 5)
        before = cps[3].checkpoint_id
        assert _ids(await checkpointer.list("t", before=before)) == _ids(reversed(cps[:3]))
        assert _ids(await checkpointer.list("t", before=before, limit=2)) == _ids([cps[2], cps[1]])
        assert list(await checkpointer.list("t", before=cps[0].checkpoint_id)) == []

    async def test_list_after_a_branch_follows_only_the_new_branch(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """After a branch, the listing follows the new branch only."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[1], source="update")
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert _ids(await checkpointer.list("t")) == _ids([fork, cps[1], cps[0]])
        old = await _get(checkpointer, "t", cid=cps[4].checkpoint_id)
        assert not old.is_head
        [child] = await put_chain(checkpointer, "t", 1, after=fork)
        assert _ids(await checkpointer.list("t")) == _ids([child, fork, cps[1], cps[0]])

    async def test_list_tips_returns_one_tip_per_branch_newest_first(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Each branch has exactly one tip; tips are listed newest first."""
        cps = await put_chain(checkpointer, "t", 4)
        assert _ids(await checkpointer.list_tips("t")) == [cps[-1].checkpoint_id]
        fork = make_checkpoint("t", parent=cps[1])
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert _ids(await checkpointer.list_tips("t")) == _ids([fork, cps[-1]])

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
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == cps[2].checkpoint_id
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))
        assert _ids(await checkpointer.list_tips("t")) == [cps[2].checkpoint_id]

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
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == first.checkpoint_id

    async def test_expected_head_none_on_existing_thread_conflicts(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Expecting no head on an existing thread is a conflict."""
        [first] = await put_chain(checkpointer, "t", 1)
        with pytest.raises(CheckpointConflictError) as info:
            await checkpointer.put(make_checkpoint("t"), expected_head=None)
        assert info.value.expected_head is None
        assert info.value.actual_head == first.checkpoint_id
        assert _ids(await checkpointer.list("t")) == [first.checkpoint_id]

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
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == cps[2].checkpoint_id
        _assert_same((await _get(checkpointer, "t", cid=cps[0].checkpoint_id)).checkpoint, cps[0])

    async def test_reputting_the_head_is_rejected(self, checkpointer: BaseCheckpointer) -> None:
        """Re-putting an identical checkpoint is an error."""
        cps = await put_chain(checkpointer, "t", 2)
        with pytest.raises(CheckpointError):
            await checkpointer.put(cps[1], expected_head=cps[1].checkpoint_id)
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))

    async def test_unknown_parent_is_rejected(self, checkpointer: BaseCheckpointer) -> None:
        """A parent outside the thread's stored checkpoints is refused."""
        cps = await put_chain(checkpointer, "t", 2)
        orphan = replace(make_checkpoint("t", parent=cps[1]), parent_id=new_checkpoint_id())
        with pytest.raises(CheckpointError):
            await checkpointer.put(orphan, expected_head=cps[1].checkpoint_id)
        assert await checkpointer.get("t", "", orphan.checkpoint_id) is None
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == cps[1].checkpoint_id
        other = make_checkpoint("other", parent=cps[1])  # the parent lives in another thread
        with pytest.raises(CheckpointError):
            await checkpointer.put(other, expected_head=None)
        assert await checkpointer.get("other") is None

    # -- isolation ------------------------------------------------------------------------

    async def test_threads_are_isolated_by_exact_id(self, checkpointer: BaseCheckpointer) -> None:
        """Similar thread ids never see each other's checkpoints, heads or writes."""
        chains: dict[str, list[Checkpoint]] = {}
        for i, tid in enumerate(_SIMILAR_THREAD_IDS):
            chains[tid] = await put_chain(checkpointer, tid, 2)
            await checkpointer.put_writes(
                tid, "", chains[tid][-1].checkpoint_id, f"task-{i}", [("out", tid.encode())]
            )
        for i, (tid, cps) in enumerate(chains.items()):
            head = await _get(checkpointer, tid)
            _assert_same(head.checkpoint, cps[-1])
            assert head.pending_writes == (PendingWrite(f"task-{i}", "out", tid.encode()),)
            assert _ids(await checkpointer.list(tid)) == _ids(reversed(cps))
            assert _ids(await checkpointer.list_tips(tid)) == [cps[-1].checkpoint_id]
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
            for i, tid in enumerate(_SIMILAR_THREAD_IDS)
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
            ns: await put_chain(checkpointer, "t", 2 + i, ns=ns) for i, ns in enumerate(_NAMESPACES)
        }
        for i, (ns, cps) in enumerate(chains.items()):
            await checkpointer.put_writes(
                "t", ns, cps[-1].checkpoint_id, "task", [("ns", bytes([i]))]
            )
        for i, (ns, cps) in enumerate(chains.items()):
            head = await _get(checkpointer, "t", ns)
            _assert_same(head.checkpoint, cps[-1])
            assert head.checkpoint.checkpoint_ns == ns
            assert head.pending_writes == (PendingWrite("task", "ns", bytes([i])),)
            assert _ids(await checkpointer.list("t", ns)) == _ids(reversed(cps))
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

    # -- pending writes -------------------------------------------------------------------

    async def test_put_writes_round_trip_in_insertion_order(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Pending writes read back as saved, in insertion order."""
        [cp] = await put_chain(checkpointer, "t", 1)
        writes = [("messages", b'{"x":1}'), ("__route__", b"\x00\xff"), ("empty", b"")]
        await checkpointer.put_writes("t", "", cp.checkpoint_id, "task-a", writes)
        got = await _get(checkpointer, "t")
        assert got.pending_writes == tuple(PendingWrite("task-a", c, d) for c, d in writes)
        assert all(isinstance(w.data, bytes) for w in got.pending_writes)

    async def test_put_writes_of_several_tasks(self, checkpointer: BaseCheckpointer) -> None:
        """Writes of several tasks are kept in the order they were saved."""
        [cp] = await put_chain(checkpointer, "t", 1)
        cid = cp.checkpoint_id
        await checkpointer.put_writes("t", "", cid, "task-b", [("x", b"b1"), ("y", b"b2")])
        await checkpointer.put_writes("t", "", cid, "task-a", [("x", b"a1")])
        await checkpointer.put_writes("t", "", cid, "task-c", [("z", b"c1")])
        assert (await _get(checkpointer, "t")).pending_writes == (
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
        got = (await _get(checkpointer, "t")).pending_writes
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
        assert (await _get(checkpointer, "t")).pending_writes == ()

    async def test_committing_a_child_clears_the_parents_writes(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Committing a child folds in (and removes) the parent's writes."""
        [cp] = await put_chain(checkpointer, "t", 1)
        await checkpointer.put_writes("t", "", cp.checkpoint_id, "task", [("x", b"1")])
        [child] = await put_chain(checkpointer, "t", 1, after=cp)
        assert (await _get(checkpointer, "t", cid=cp.checkpoint_id)).pending_writes == ()
        assert (await _get(checkpointer, "t", cid=child.checkpoint_id)).pending_writes == ()

    async def test_writes_on_a_non_head_checkpoint_are_kept(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Writes of a non-head checkpoint stay until a child of it is committed."""
        cps = await put_chain(checkpointer, "t", 3)
        await checkpointer.put_writes("t", "", cps[0].checkpoint_id, "old", [("x", b"0")])
        await checkpointer.put_writes("t", "", cps[2].checkpoint_id, "new", [("x", b"2")])
        [child] = await put_chain(checkpointer, "t", 1, after=cps[2])
        old = await _get(checkpointer, "t", cid=cps[0].checkpoint_id)
        assert old.pending_writes == (PendingWrite("old", "x", b"0"),)
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == child.checkpoint_id
        fork = make_checkpoint("t", parent=cps[0])
        await checkpointer.put(fork, expected_head=child.checkpoint_id)
        assert (await _get(checkpointer, "t", cid=cps[0].checkpoint_id)).pending_writes == ()

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
        got = (await _get(checkpointer, "t")).pending_writes
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
        deltas = dict(_sample_deltas(1))
        child = make_checkpoint("t", parent=root, deltas=deltas)
        await checkpointer.put(child, expected_head=root.checkpoint_id)
        _try_mutate(metadata)
        snapshot["z"] = b"3"
        del snapshot["x"]
        deltas["extra"] = ChannelDelta("set", (b"!",))
        del deltas["counter"]
        _assert_same((await _get(checkpointer, "t", cid=root.checkpoint_id)).checkpoint, original)
        got_child = (await _get(checkpointer, "t")).checkpoint
        assert dict(got_child.deltas) == _sample_deltas(1)

    async def test_mutating_get_results_does_not_change_the_store(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Mutating what ``get`` returned does not change what is stored."""
        metadata = {"user": {"tags": ["a", "b"], "deep": {"k": [1]}}, "n": 1}
        cps = await put_chain(checkpointer, "t", 1)
        child = make_checkpoint("t", parent=cps[0], metadata=metadata)
        await checkpointer.put(child, expected_head=cps[0].checkpoint_id)
        first = await _get(checkpointer, "t")
        for cp in (first.checkpoint, *first.chain):
            _try_mutate(cp.metadata)
            _try_mutate(cp.deltas)
            _try_mutate(cp.snapshot)
        again = await _get(checkpointer, "t")
        _assert_same(again.checkpoint, child)
        _assert_same(again.chain[0], cps[0])

    async def test_mutating_list_results_does_not_change_the_store(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Mutating what ``list`` returned does not change what is stored."""
        cps = await put_chain(checkpointer, "t", 3)
        for cp in await checkpointer.list("t"):
            _try_mutate(cp.metadata)
            _try_mutate(cp.deltas)
        for got, want in zip(await checkpointer.list("t"), reversed(cps), strict=True):
            _assert_same(got, want)

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
        for i, tid in enumerate(_SIMILAR_THREAD_IDS):
            chains[tid] = await put_chain(checkpointer, tid, 2)
            await put_chain(checkpointer, tid, 1, ns="sub")
            await checkpointer.put_writes(tid, "", chains[tid][-1].checkpoint_id, "w", [("x", b"")])
            await checkpointer.acquire_lease(tid, owner=f"run-{i}", ttl=60)
        await checkpointer.delete_thread("t")
        for i, (tid, cps) in enumerate(chains.items()):
            if tid == "t":
                continue
            head = await _get(checkpointer, tid)
            _assert_same(head.checkpoint, cps[-1])
            assert head.pending_writes == (PendingWrite("w", "x", b""),)
            assert _ids(await checkpointer.list(tid)) == _ids(reversed(cps))
            assert await checkpointer.get(tid, "sub") is not None
            with pytest.raises(ThreadBusyError) as info:
                await checkpointer.acquire_lease(tid, owner="intruder", ttl=60)
            assert info.value.owner == f"run-{i}"
        listed = sorted(info.thread_id for info in await checkpointer.list_threads())
        assert listed == sorted(set(_SIMILAR_THREAD_IDS) - {"t"})

    async def test_delete_unknown_thread_is_a_no_op(self, checkpointer: BaseCheckpointer) -> None:
        """Deleting a thread that does not exist is not an error."""
        cps = await put_chain(checkpointer, "t", 2)
        await checkpointer.delete_thread("nobody")
        await checkpointer.delete_thread("t1")
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))

    async def test_thread_can_be_recreated_after_delete(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """A deleted thread id starts afresh."""
        old = await put_chain(checkpointer, "t", 3)
        await checkpointer.delete_thread("t")
        new = await put_chain(checkpointer, "t", 2)
        assert _ids(await checkpointer.list("t")) == _ids(reversed(new))
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
                await _assert_readable(checkpointer, cp)
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
        assert [c.checkpoint_id for c in head.chain] == _ids(cps[3:5])
        # a rebase naming a checkpoint that does not exist changes nothing but retention
        assert await checkpointer.prune("t", keep_last=3, rebase=("missing", snapshot)) == 0

    async def test_prune_deletes_other_branches(self, checkpointer: BaseCheckpointer) -> None:
        """Prune deletes checkpoints off the current branch."""
        cps = await put_chain(checkpointer, "t", 5)
        fork = make_checkpoint("t", parent=cps[1])
        await checkpointer.put(fork, expected_head=cps[-1].checkpoint_id)
        assert await checkpointer.prune("t", keep_last=10) == 3
        assert _ids(await checkpointer.list_tips("t")) == [fork.checkpoint_id]
        assert _ids(await checkpointer.list("t")) == _ids([fork, cps[1], cps[0]])
        for cp in cps[2:]:
            assert await checkpointer.get("t", "", cp.checkpoint_id) is None

    async def test_prune_rejects_keep_last_below_one(self, checkpointer: BaseCheckpointer) -> None:
        """Prune refuses to keep nothing."""
        cps = await put_chain(checkpointer, "t", 3)
        for keep_last in (0, -1):
            with pytest.raises(ValueError):
                await checkpointer.prune("t", keep_last=keep_last)
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))

    async def test_prune_leaves_other_threads_intact(self, checkpointer: BaseCheckpointer) -> None:
        """Prune touches only the named thread."""
        chains = {
            tid: await put_chain(checkpointer, tid, 4, snapshot_steps={3})
            for tid in _SIMILAR_THREAD_IDS
        }
        assert await checkpointer.prune("t", keep_last=1) == 3
        for tid, cps in chains.items():
            if tid != "t":
                assert _ids(await checkpointer.list(tid)) == _ids(reversed(cps))

    async def test_prune_keeps_head_writes_and_namespaces_readable(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """After prune the head's writes survive and every head stays readable."""
        cps = await put_chain(checkpointer, "t", 5, snapshot_steps={3})
        sub = await put_chain(checkpointer, "t", 4, ns="sub", snapshot_steps={2})
        await checkpointer.put_writes("t", "", cps[-1].checkpoint_id, "task", [("x", b"1")])
        await checkpointer.prune("t", keep_last=1)
        head = await _get(checkpointer, "t")
        assert head.pending_writes == (PendingWrite("task", "x", b"1"),)
        await _assert_readable(checkpointer, cps[-1])
        await _assert_readable(checkpointer, sub[-1])
        [child] = await put_chain(checkpointer, "t", 1, after=cps[-1])
        await _assert_readable(checkpointer, child)

    async def test_prune_is_repeatable(self, checkpointer: BaseCheckpointer) -> None:
        """Prune again (any ``keep_last``) after history was truncated."""
        cps = await put_chain(checkpointer, "t", 7, snapshot_steps={3})
        assert await checkpointer.prune("t", keep_last=2) == 3
        assert await checkpointer.prune("t", keep_last=2) == 0
        assert await checkpointer.prune("t", keep_last=10) == 0
        assert await checkpointer.prune("t", keep_last=1) == 0
        for cp in cps[3:]:
            await _assert_readable(checkpointer, cp)

    async def test_prune_with_nothing_to_delete_returns_zero(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Prune with nothing to delete returns 0."""
        cps = await put_chain(checkpointer, "t", 3)
        assert await checkpointer.prune("t", keep_last=3) == 0
        assert await checkpointer.prune("nobody", keep_last=1) == 0
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))

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
        assert _ids(await checkpointer.list("t")) == _ids(reversed(cps))

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
        assert _ids(await checkpointer.list("t")) == [head.checkpoint_id]
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
        assert (await _get(checkpointer, "t")).pending_writes == ()

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
        got = await _get(checkpointer, "t")
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
        assert (await _get(checkpointer, "t")).checkpoint.checkpoint_id == child.checkpoint_id

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
        _assert_same((await _get(checkpointer, "t")).checkpoint, last)
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
        stored = (await _get(checkpointer, "t")).pending_writes
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
        assert (await _get(checkpointer, "t")).pending_writes == ()
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
        assert (await _get(checkpointer, "t")).pending_writes == ()
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
        got = await _get(checkpointer, "t")
        _assert_same(got.checkpoint, last)
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
        got = await _get(checkpointer, "t")
        _assert_same(got.checkpoint, head)
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
        want = await _get(checkpointer, "t")
        assert tup is not None and tup.is_head
        _assert_same(tup.checkpoint, want.checkpoint)
        assert _ids(tup.chain) == _ids(want.chain) and tup.pending_writes == want.pending_writes
        await checkpointer.release_lease(again)
        third, tup = await checkpointer.acquire_lease_and_get(
            "t", owner="run-3", ttl=60, checkpoint_id=cps[3].checkpoint_id
        )
        assert tup is not None and not tup.is_head and _ids(tup.chain) == _ids(cps[:3])
        await checkpointer.release_lease(third)
        _, tup = await checkpointer.acquire_lease_and_get(
            "t", owner="run-4", ttl=60, known=cps[2].checkpoint_id
        )
        assert tup is not None and _ids(tup.chain) in (_ids(cps[3:4]), _ids(cps[:4]))

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
        _assert_same((await _get(checkpointer, "t")).checkpoint, first)
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
        before = _ids(await checkpointer.list("t"))
        lease, tup, committed = await checkpointer.acquire_lease_and_put(
            make_checkpoint("t"), expected_head=None, owner="run-1", ttl=60
        )
        assert not committed and lease.owner == "run-1"
        assert tup is not None and tup.is_head
        _assert_same(tup.checkpoint, cps[-1])
        assert _ids(await checkpointer.list("t")) == before
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
        _assert_same((await _get(checkpointer, "t")).checkpoint, nxt)
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
        assert _ids(await checkpointer.list("t")) == _ids([won[0], *reversed(cps)])
        assert _ids(await checkpointer.list_tips("t")) == [won[0].checkpoint_id]

    async def test_many_threads_written_concurrently_are_all_readable(
        self, checkpointer: BaseCheckpointer
    ) -> None:
        """Threads written concurrently are all complete and readable."""
        tids = [f"thread-{i}" for i in range(30)]
        chains = await asyncio.gather(
            *(put_chain(checkpointer, tid, 5, snapshot_steps={3}) for tid in tids)
        )
        for tid, cps in zip(tids, chains, strict=True):
            assert _ids(await checkpointer.list(tid)) == _ids(reversed(cps))
            for cp in cps:
                await _assert_readable(checkpointer, cp)
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
        assert sorted(_ids(cps)) == _ids(cps)

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
        assert _ids(await checkpointer.list(tid)) == branch_ids
        parents = {cp.parent_id for cp in created}
        tips = {cp.checkpoint_id for cp in created if cp.checkpoint_id not in parents}
        assert set(_ids(await checkpointer.list_tips(tid))) == tips

        for cp in created:
            got = await _get(checkpointer, tid, cid=cp.checkpoint_id)
            assert got.is_head == (cp is head)
            expected_chain: list[str] = []
            walk = cp
            while walk.snapshot is None and walk.parent_id is not None:
                walk = by_id[walk.parent_id]
                expected_chain.insert(0, walk.checkpoint_id)
            assert _ids(got.chain) == expected_chain
            await _assert_readable(checkpointer, cp)
