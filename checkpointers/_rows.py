"""How checkpoints map to and from stored rows: ids, times, blobs (sealed when encrypted), metadata.

:class:`RowCodec` turns a :class:`~graphexec.Checkpoint` into the parameters and channel rows of
the schema in :mod:`checkpointers._sql` and decodes the union rows its queries return. Shared by
the SQLite and PostgreSQL checkpointers; SQLite's compact forms (16-byte ids, 8-byte graph
versions, compact metadata) are described in :mod:`checkpointers._sqlite_sql`.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import msgpack  # type: ignore[import-untyped]

from checkpointers._crypto import Encryption, blob_context, looks_encrypted
from graphexec._checkpoint import ChannelDelta, Checkpoint, CheckpointTuple, PendingWrite
from graphexec._serde import default_serializer
from graphexec.errors import CheckpointError, DeserializationError

__all__ = [
    "BlobCodec",
    "ChannelRow",
    "RowCodec",
    "from_micros",
    "id_key",
    "id_text",
    "json_tuple",
    "lease_row",
    "to_micros",
    "version_key",
    "version_text",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def to_micros(value: datetime) -> int:
    """A datetime as integer microseconds since the epoch (naive values are taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _MICRO


def from_micros(value: int) -> datetime:
    """Inverse of :func:`to_micros`, in UTC."""
    return _EPOCH + timedelta(microseconds=value)


_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")


def id_key(checkpoint_id: str) -> str | bytes:
    """How SQLite stores a checkpoint id: a canonical UUID as its 16 bytes, any other id as is.

    Canonical means lowercase and hyphenated, as :func:`~graphexec.new_checkpoint_id` writes
    them (36 characters become 16 bytes). The mapping is one to one: a canonical id is never
    stored as text, and SQLite never compares a BLOB equal to a TEXT, so an id column can hold
    both and its unique index still means unique ids. :func:`id_text` inverts it.
    """
    if len(checkpoint_id) == 36 and _CANONICAL_UUID.fullmatch(checkpoint_id):
        return bytes.fromhex(checkpoint_id.replace("-", ""))
    return checkpoint_id


def version_key(graph_version: str) -> str | bytes:
    """How SQLite stores a graph version: the engine's 16 hex digits as 8 bytes, else as is."""
    if len(graph_version) == 16 and _HEX16.fullmatch(graph_version):
        return bytes.fromhex(graph_version)
    return graph_version


def version_text(stored: Any) -> Any:
    """Inverse of :func:`version_key`; text passes."""
    if type(stored) is bytes and len(stored) == 8:
        return stored.hex()
    return stored


def id_text(stored: Any) -> Any:
    """The checkpoint id stored as ``stored`` (see :func:`id_key`); text and ``None`` pass."""
    if type(stored) is bytes and len(stored) == 16:
        h = stored.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return stored


class BlobCodec(Protocol):
    """Seals blobs before they are stored and opens them after they are read."""

    def seal(self, data: bytes, context: tuple[Any, ...]) -> bytes:
        """The bytes to store for ``data`` in the row named by ``context``."""
        ...

    def open(self, data: bytes, context: tuple[Any, ...], what: Callable[[], str]) -> bytes:
        """The original bytes of a stored blob (``what()`` names it in errors)."""
        ...


class _Plain:
    def seal(self, data: bytes, context: tuple[Any, ...]) -> bytes:
        return data

    def open(self, data: bytes, context: tuple[Any, ...], what: Callable[[], str]) -> bytes:
        return data


class _Sealed:
    def __init__(self, encryption: Encryption) -> None:
        self._enc = encryption

    def seal(self, data: bytes, context: tuple[Any, ...]) -> bytes:
        return self._enc.encrypt(data, context=blob_context(*context))

    def open(self, data: bytes, context: tuple[Any, ...], what: Callable[[], str]) -> bytes:
        return self._enc.decrypt(data, context=blob_context(*context), what=what())


_COMPACT_METADATA = b"\x92\xc4\x10"
"""How a compact metadata blob starts: a 2-element msgpack array, then 16 bytes (the run id)."""

ChannelRow = tuple[str, str, str, bytes]
"""``(role, channel, op, data)`` of one ``graphexec_channels`` row."""

STRUCTURE = (
    "parent_id",
    "step",
    "source",
    "graph_version",
    "next_nodes",
    "created_at",
    "delta_depth",
    "delta_bytes",
    "snapshot_bytes",
    "has_snapshot",
)
"""The ``graphexec_checkpoints`` columns an encrypted row's metadata blob authenticates."""


class RowCodec:
    """Maps :class:`Checkpoint` and :class:`PendingWrite` to rows and back.

    Metadata is encoded with graphexec's closed-registry serializer (so what a durable backend
    can store is exactly what the in-memory reference accepts); every blob goes through the
    :class:`BlobCodec` -- identity, or AES-GCM bound to the row when ``encryption`` is given.

    Args:
        encryption: Encrypt every stored blob with these keys.
        compact_metadata: Store the metadata the engine records in the columns' shadow (see
            :meth:`pack_metadata`). Only for a schema whose older readers are refused (SQLite);
            reading accepts both forms either way.
    """

    def __init__(
        self, encryption: Encryption | None = None, *, compact_metadata: bool = False
    ) -> None:
        self.encrypted = encryption is not None
        self.blobs: BlobCodec = _Plain() if encryption is None else _Sealed(encryption)
        self.compact_metadata = compact_metadata
        self._meta = default_serializer()

    # -- metadata

    def pack_metadata(self, cp: Checkpoint) -> bytes:
        """The metadata blob of ``cp`` (before sealing).

        The engine ends every checkpoint's metadata with ``source``, ``step`` and ``run_id`` (a
        UUID's 32 hex digits). With ``compact_metadata``, metadata that ends exactly so is
        stored as ``[run_id's 16 bytes, the rest]`` (a msgpack array, which a stored mapping
        never starts with): source and step are the row's own columns, so they are not stored
        twice, and :meth:`unpack_metadata` puts all three back, in the same order. Any other
        metadata is the msgpack mapping itself, as it always was.
        """
        meta = dict(cp.metadata)
        if self.compact_metadata and len(meta) >= 3:
            *rest, (k1, source), (k2, step), (k3, run_id) = meta.items()
            if (
                (k1, k2, k3) == ("source", "step", "run_id")
                and type(source) is str
                and source == cp.source
                and type(step) is int
                and step == cp.step
                and type(run_id) is str
                and _HEX32.fullmatch(run_id)
            ):
                packed = self._meta.dumps(dict(rest), channel="__metadata__")
                return _COMPACT_METADATA + bytes.fromhex(run_id) + packed
        return self._meta.dumps(meta, channel="__metadata__")

    def unpack_metadata(
        self, data: bytes, source: str, step: int, where: Callable[[], str]
    ) -> dict[str, Any]:
        """Inverse of :meth:`pack_metadata` (``source`` and ``step``: the row's columns)."""
        compact = data[:3] == _COMPACT_METADATA
        if compact and len(data) < 19:
            raise DeserializationError(
                f"metadata of {where()} is truncated", channel="__metadata__"
            )
        try:
            meta = self._meta.loads(data[19:] if compact else data, channel="__metadata__")
        except DeserializationError as e:
            raise DeserializationError(
                f"metadata of {where()} cannot be decoded: {e}", channel="__metadata__"
            ) from e
        if not isinstance(meta, dict):
            raise DeserializationError(
                f"metadata of {where()} is a {type(meta).__name__}, not a mapping",
                channel="__metadata__",
            )
        if compact:
            meta.update(source=source, step=step, run_id=data[3:19].hex())
        return meta

    # -- checkpoints

    def encode(self, cp: Checkpoint) -> tuple[dict[str, Any], list[ChannelRow]]:
        """``cp``'s ``graphexec_checkpoints`` column values and its ``graphexec_channels`` rows.

        With encryption, the metadata blob's associated data also covers the row's structural
        columns (parent, step, snapshot flag, sizes ...) and the list of its channel rows, so
        editing those columns, or adding or deleting a channel row, fails authentication on the
        next read like a tampered blob does.
        """
        rows = self.channel_rows(cp)
        key = (cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id)
        metadata = self.pack_metadata(cp)
        params: dict[str, Any] = {
            "thread_id": cp.thread_id,
            "checkpoint_ns": cp.checkpoint_ns,
            "checkpoint_id": cp.checkpoint_id,
            "parent_id": cp.parent_id,
            "step": cp.step,
            "source": cp.source,
            "created_at": to_micros(cp.created_at),
            "graph_version": cp.graph_version,
            "next_nodes": json_list(tuple(cp.next_nodes)),
            "frontier": self.blobs.seal(bytes(cp.frontier), (*key, "frontier")),
            "delta_depth": cp.delta_depth,
            "delta_bytes": cp.delta_bytes,
            "snapshot_bytes": cp.snapshot_bytes,
            "has_snapshot": 0 if cp.snapshot is None else 1,
        }
        context = self.metadata_context(
            key, [params[c] for c in STRUCTURE], ((r, c, o) for r, c, o, _ in rows)
        )
        params["metadata"] = self.blobs.seal(metadata, context)
        return params, rows

    def metadata_context(
        self,
        key: tuple[str, str, str],
        structure: Sequence[Any],
        manifest: Iterable[tuple[str, str, str]],
    ) -> tuple[Any, ...]:
        """Associated data of a checkpoint's metadata blob (see :meth:`encode`)."""
        if not self.encrypted:
            return (*key, "metadata")
        return (*key, "metadata", *structure, *itertools.chain.from_iterable(sorted(manifest)))

    def channel_rows(self, cp: Checkpoint) -> list[ChannelRow]:
        """The ``graphexec_channels`` rows of ``cp``: its deltas, then its snapshot."""
        key = (cp.thread_id, cp.checkpoint_ns, cp.checkpoint_id)
        rows: list[ChannelRow] = []
        set_values: dict[str, bytes] = {}
        for channel, delta in cp.deltas.items():
            if delta.op == "set":
                if len(delta.blobs) != 1:
                    raise CheckpointError(
                        f"thread {cp.thread_id!r}, checkpoint {cp.checkpoint_id!r}: the 'set' "
                        f"delta of channel {channel!r} must carry exactly one blob, got "
                        f"{len(delta.blobs)}"
                    )
                data = bytes(delta.blobs[0])
                set_values[channel] = data
            elif delta.op == "fold":
                data = msgpack.packb([bytes(b) for b in delta.blobs], use_bin_type=True)
            else:
                raise CheckpointError(
                    f"checkpoint {cp.checkpoint_id!r}: channel {channel!r} has unknown delta op "
                    f"{delta.op!r} (expected 'set' or 'fold')"
                )
            sealed = self.blobs.seal(data, (*key, "d", channel, delta.op))
            rows.append(("d", channel, delta.op, sealed))
        for channel, value in (cp.snapshot or {}).items():
            if set_values.get(channel) == value:
                # stored once, under the delta; an (authenticated) empty marker stands here
                rows.append(
                    ("s", channel, "same", self.blobs.seal(b"", (*key, "s", channel, "same")))
                )
            else:
                rows.append(
                    (
                        "s",
                        channel,
                        "set",
                        self.blobs.seal(bytes(value), (*key, "s", channel, "set")),
                    )
                )
        return rows

    def snapshot_rows(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, snapshot: Mapping[str, bytes]
    ) -> list[ChannelRow]:
        """``graphexec_channels`` rows giving an existing checkpoint a snapshot (prune's rebase)."""
        key = (thread_id, checkpoint_ns, checkpoint_id, "s")
        return [
            ("s", channel, "set", self.blobs.seal(bytes(value), (*key, channel, "set")))
            for channel, value in snapshot.items()
        ]

    def rebased_metadata(
        self,
        key: tuple[str, str, str],
        metadata: bytes,
        structure: Sequence[Any],
        manifest: Sequence[tuple[str, str, str]],
        rebase_rows: Sequence[ChannelRow],
        snapshot_bytes: int,
    ) -> bytes:
        """The metadata blob of a checkpoint that prune's rebase gives a snapshot.

        ``structure`` and ``manifest`` describe the row as stored; the blob is re-sealed for the
        row as it will be (snapshot flag set, sizes reset, snapshot rows added).
        """
        if not self.encrypted:
            return metadata
        old = self.metadata_context(key, structure, manifest)
        plain = self.blobs.open(metadata, old, lambda: f"metadata of checkpoint {key[2]!r}")
        after = dict(zip(STRUCTURE, structure, strict=True))
        after.update(has_snapshot=1, delta_depth=0, delta_bytes=0, snapshot_bytes=snapshot_bytes)
        rows = [*manifest, *((r, c, o) for r, c, o, _ in rebase_rows)]
        return self.blobs.seal(plain, self.metadata_context(key, list(after.values()), rows))

    def checkpoints_from_rows(
        self, thread_id: str, checkpoint_ns: str, rows: Iterable[Sequence[Any]]
    ) -> tuple[list[tuple[int, Checkpoint]], list[tuple[int, str, str, bytes]]]:
        """Decode the union rows of a checkpoint query.

        Returns:
            ``(pos, checkpoint)`` pairs sorted by ``pos``, and the ``'w'`` rows as ``(seq,
            task_id, channel, sealed data)``. (Each ``'c'`` row also carries the head id of the
            namespace in its last column.)
        """
        heads: dict[int, Sequence[Any]] = {}
        channels: dict[int, list[Sequence[Any]]] = {}
        writes: list[tuple[int, str, str, bytes]] = []
        for row in rows:
            kind = row[0]
            if kind == "c":
                heads[row[1]] = row
            elif kind == "b":
                channels.setdefault(row[1], []).append(row)
            else:
                writes.append((row[1], row[3], row[4], row[8]))
        out = [
            (r[2], self._checkpoint(thread_id, checkpoint_ns, r, channels.get(seq, ())))
            for seq, r in heads.items()
        ]
        out.sort(key=lambda pair: pair[0])
        writes.sort(key=lambda w: w[0])
        return out, writes

    def checkpoint_tuple(
        self,
        thread_id: str,
        checkpoint_ns: str,
        rows: Sequence[Sequence[Any]],
        known: str | None = None,
    ) -> CheckpointTuple | None:
        """The :class:`CheckpointTuple` of the rows of :data:`GET_CHECKPOINT` (``None``: none).

        ``known`` is the query's ``:known``: a chain may then stop at it or its child.

        Raises:
            CheckpointError: The delta chain does not reach a snapshot (a checkpoint it needs is
                missing).
        """
        if not rows:
            return None
        head = id_text(next(r[16] for r in rows if r[0] == "c"))
        found, writes = self.checkpoints_from_rows(thread_id, checkpoint_ns, rows)
        target = found[0][1]
        chain = [cp for _, cp in reversed(found[1:])]
        oldest = chain[0] if chain else target
        stopped = known is not None and known in (oldest.checkpoint_id, oldest.parent_id)
        if oldest.snapshot is None and not stopped:
            lost = max((r for r in rows if r[0] == "c"), key=lambda r: r[2])[17:]
            if oldest.parent_id is None and lost and lost[0] is not None:
                # SQLite's rows name a parent by its cp_seq (see _sqlite_sql)
                raise CheckpointError(
                    f"thread {thread_id!r}: the parent of checkpoint {oldest.checkpoint_id!r} "
                    f"(row {lost[0]}), needed to read {target.checkpoint_id!r}, is missing"
                )
            if oldest.parent_id is None:
                raise CheckpointError(
                    f"thread {thread_id!r}: checkpoint {target.checkpoint_id!r} has no snapshot "
                    "in its ancestry; storage is corrupt"
                )
            raise CheckpointError(
                f"thread {thread_id!r}: checkpoint {oldest.parent_id!r}, needed to read "
                f"{target.checkpoint_id!r}, is missing"
            )
        pending = tuple(
            self.pending_write(
                thread_id, checkpoint_ns, target.checkpoint_id, task_id, channel, data
            )
            for _, task_id, channel, data in writes
        )
        return CheckpointTuple(target, tuple(chain), pending, is_head=target.checkpoint_id == head)

    def _checkpoint(
        self, thread_id: str, ns: str, row: Sequence[Any], channel_rows: Iterable[Sequence[Any]]
    ) -> Checkpoint:
        # Hot path (a read decodes up to max_depth of these): messages are only built on error.
        (_, _, _, cid, parent_id, source, version, next_nodes, frontier, metadata) = row[:10]
        step, created_at, depth, delta_bytes, snapshot_bytes, has_snapshot = row[10:16]
        cid, parent_id, version = id_text(cid), id_text(parent_id), version_text(version)
        key = (thread_id, ns, cid)

        def where() -> str:
            return f"thread {thread_id!r}, checkpoint {cid!r}"

        if not self.encrypted and looks_encrypted(metadata):
            # msgpack metadata never starts with the envelope byte: this row was encrypted.
            raise DeserializationError(
                f"metadata of {where()} is encrypted; open the checkpointer with the "
                "encryption= keys it was written with",
                channel="__metadata__",
            )
        channel_rows = list(channel_rows)
        if self.encrypted:
            structure: tuple[Any, ...] = (parent_id, step, source, version, next_nodes)
            structure += (created_at, depth, delta_bytes, snapshot_bytes, has_snapshot)
            manifest = ((r[3], r[4], r[5]) for r in channel_rows)  # STRUCTURE's order ^
            context = self.metadata_context(key, structure, manifest)
        else:
            context = (*key, "metadata")
        meta_bytes = self._open(metadata, context, lambda: f"metadata of {where()}")
        meta = self.unpack_metadata(meta_bytes, source, step, where)
        deltas: dict[str, ChannelDelta] = {}
        snapshot: dict[str, bytes] | None = {} if has_snapshot else None
        same: list[str] = []
        for r in channel_rows:
            role, channel, op, data = r[3], r[4], r[5], r[8]
            if role == "s":
                if snapshot is None:
                    raise CheckpointError(f"{where()}: snapshot rows on a checkpoint without one")
                value = self._open(
                    data, (*key, "s", channel, op), _describe("snapshot", channel, where)
                )
                if op == "same":
                    same.append(channel)
                else:
                    snapshot[channel] = value
                continue
            raw = self._open(data, (*key, "d", channel, op), _describe("delta", channel, where))
            if op == "set":
                deltas[channel] = ChannelDelta("set", (raw,))
            else:
                deltas[channel] = ChannelDelta("fold", _unpack_blobs(raw, channel, where))
        for channel in same:
            delta = deltas.get(channel)
            if snapshot is None or delta is None or delta.op != "set":
                raise CheckpointError(
                    f"{where()}: snapshot of channel {channel!r} refers to a 'set' delta that is "
                    "missing; storage is corrupt"
                )
            snapshot[channel] = delta.blobs[0]
        return Checkpoint(
            thread_id=thread_id,
            checkpoint_ns=ns,
            checkpoint_id=cid,
            parent_id=parent_id,
            step=step,
            source=source,
            created_at=from_micros(created_at),
            graph_version=version,
            deltas=deltas,
            snapshot=snapshot,
            frontier=self._open(frontier, (*key, "frontier"), lambda: f"frontier of {where()}"),
            next_nodes=json_tuple(next_nodes),
            metadata=meta,
            delta_depth=depth,
            delta_bytes=delta_bytes,
            snapshot_bytes=snapshot_bytes,
        )

    def _open(self, data: Any, context: tuple[Any, ...], what: Callable[[], str]) -> bytes:
        if type(data) is not bytes:
            raise DeserializationError(
                f"{what()}: stored value is {type(data).__name__}, not bytes"
            )
        return self.blobs.open(data, context, what)

    # -- pending writes

    def write_rows(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[str, bytes]],
    ) -> list[tuple[str, bytes]]:
        """``(channel, stored data)`` for each write of one task."""
        key = (thread_id, checkpoint_ns, checkpoint_id, "w", task_id)
        return [
            (channel, self.blobs.seal(bytes(data), (*key, channel))) for channel, data in writes
        ]

    def pending_write(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        task_id: str,
        channel: str,
        data: Any,
    ) -> PendingWrite:
        """Decode one stored pending write."""
        key = (thread_id, checkpoint_ns, checkpoint_id, "w", task_id, channel)

        def what() -> str:
            return (
                f"pending write {channel!r} of task {task_id!r} (thread {thread_id!r}, "
                f"checkpoint {checkpoint_id!r})"
            )

        return PendingWrite(task_id, channel, self._open(data, key, what))


def _describe(kind: str, channel: str, where: Callable[[], str]) -> Callable[[], str]:
    return lambda: f"{kind} of channel {channel!r} of {where()}"


def _unpack_blobs(raw: bytes, channel: str, where: Callable[[], str]) -> tuple[bytes, ...]:
    try:
        blobs = msgpack.unpackb(raw, raw=False)
    except Exception as e:
        raise DeserializationError(
            f"fold delta of channel {channel!r} of {where()} is corrupt", channel=channel
        ) from e
    if type(blobs) is not list or not all(type(b) is bytes for b in blobs):
        raise DeserializationError(
            f"fold delta of channel {channel!r} of {where()} is not a list of blobs",
            channel=channel,
        )
    return tuple(blobs)


@functools.lru_cache(maxsize=1024)
def json_tuple(value: str) -> tuple[str, ...]:
    """Decode a ``next_nodes`` column (few distinct values: cached)."""
    return tuple(json.loads(value))


@functools.lru_cache(maxsize=1024)
def json_list(nodes: tuple[str, ...]) -> str:
    """Encode a ``next_nodes`` column: the inverse of :func:`json_tuple` (cached too)."""
    return json.dumps(list(nodes), ensure_ascii=False)


def lease_row(row: Sequence[Any] | None) -> tuple[str, int, float] | None:
    """``(owner, epoch, expires_at)`` of a held lease, or ``None`` (no row, or released)."""
    if row is None or row[0] is None:
        return None
    return str(row[0]), int(row[1]), float(row[2])
