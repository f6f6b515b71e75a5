"""Row mapping and encryption shared by the SQL backends (no database involved)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from checkpointers import Encryption
from checkpointers._crypto import ENVELOPE_VERSION, blob_context
from checkpointers._rows import RowCodec, from_micros, id_key, id_text, to_micros
from graphexec import ChannelDelta, Checkpoint, CheckpointError, DeserializationError
from graphexec.testing import make_checkpoint

KEY = bytes(range(32))


def encryption(active: str = "k1", **more: bytes) -> Encryption:
    return Encryption(keys={"k1": KEY, **more}, active=active)


def as_rows(codec: RowCodec, cp: Checkpoint, seq: int = 1) -> list[tuple[Any, ...]]:
    """The union-query rows a backend would read back for ``cp``."""
    p, channel_rows = codec.encode(cp)
    checkpoint_row = (
        "c",
        seq,
        0,
        p["checkpoint_id"],
        p["parent_id"],
        p["source"],
        p["graph_version"],
        p["next_nodes"],
        p["frontier"],
        p["metadata"],
        p["step"],
        p["created_at"],
        p["delta_depth"],
        p["delta_bytes"],
        p["snapshot_bytes"],
        p["has_snapshot"],
        p["checkpoint_id"],
    )
    blob_rows = [
        ("b", seq, 0, role, ch, op, None, None, data, *([None] * 8))
        for role, ch, op, data in channel_rows
    ]
    return [checkpoint_row, *blob_rows]


def round_trip(codec: RowCodec, cp: Checkpoint) -> Checkpoint:
    [(pos, got)], writes = codec.checkpoints_from_rows(
        cp.thread_id, cp.checkpoint_ns, as_rows(codec, cp)
    )
    assert pos == 0 and writes == []
    return got


blobs = st.binary(max_size=64)
deltas = st.dictionaries(
    st.text(min_size=1, max_size=8),
    st.one_of(
        st.builds(lambda b: ChannelDelta("set", (b,)), blobs),
        st.builds(lambda bs: ChannelDelta("fold", tuple(bs)), st.lists(blobs, max_size=4)),
    ),
    max_size=4,
)
metadata = st.dictionaries(
    st.text(max_size=8),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=8,
    ),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(
    deltas=deltas,
    snapshot=st.none() | st.dictionaries(st.text(min_size=1, max_size=8), blobs, max_size=4),
    metadata=metadata,
    ns=st.sampled_from(["", "sub", "sub|x:1"]),
    encrypted=st.booleans(),
)
def test_checkpoints_round_trip(
    deltas: dict[str, ChannelDelta],
    snapshot: dict[str, bytes] | None,
    metadata: dict[str, Any],
    ns: str,
    encrypted: bool,
) -> None:
    codec = RowCodec(encryption() if encrypted else None)
    cp = make_checkpoint(
        "thread ✓", ns=ns, deltas=deltas, snapshot=snapshot or True, metadata=metadata
    )
    if snapshot is None:
        cp = make_checkpoint("thread ✓", ns=ns, parent=cp, deltas=deltas, metadata=metadata)
    assert round_trip(codec, cp) == cp


@settings(max_examples=80, deadline=None)
@given(
    user=metadata,
    tail=st.sampled_from(["engine", "engine-upper", "other-step", "no-run", "reordered", "none"]),
    encrypted=st.booleans(),
)
def test_compact_metadata_round_trips_every_mapping_in_order(
    user: dict[str, Any], tail: str, encrypted: bool
) -> None:
    run_id = "0123456789abcdef" * 2
    meta: dict[str, Any] = dict(user)
    if tail == "engine":  # what the engine writes: stored without source and step
        meta.update(source="loop", step=1, run_id=run_id)
    elif tail == "engine-upper":
        meta.update(source="loop", step=1, run_id=run_id.upper())
    elif tail == "other-step":
        meta.update(source="loop", step=True, run_id=run_id)
    elif tail == "no-run":
        meta.update(source="loop", step=1)
    elif tail == "reordered":
        meta.update(step=1, source="loop", run_id=run_id)
    parent = make_checkpoint("t")
    cp = make_checkpoint("t", parent=parent, metadata=meta)
    compact = RowCodec(encryption() if encrypted else None, compact_metadata=True)
    got = round_trip(compact, cp)
    assert list(got.metadata.items()) == list(meta.items())
    assert got == cp
    # either codec reads what the other wrote
    plain = RowCodec(encryption() if encrypted else None)
    assert round_trip(plain, cp) == cp
    rows = as_rows(compact, cp)
    [(_, got_plain)], _ = plain.checkpoints_from_rows("t", "", rows)
    assert list(got_plain.metadata.items()) == list(meta.items())
    packed = compact.pack_metadata(cp)
    if tail == "engine" and not ({"source", "step", "run_id"} & user.keys()):
        assert packed[0] == 0x92
        assert len(packed) <= len(plain.pack_metadata(cp)) - 30
    else:
        assert packed == plain.pack_metadata(cp)


def test_checkpoint_ids_map_one_to_one() -> None:
    canonical = "01a22ac4-fb18-7001-b9ef-40cb1dc16e14"
    assert id_key(canonical) == bytes.fromhex(canonical.replace("-", ""))
    assert id_text(id_key(canonical)) == canonical
    for other in ("", "first", canonical.upper(), canonical.replace("-", ""), canonical + " "):
        assert id_key(other) == other
        assert id_text(other) == other
    assert id_text(None) is None


def test_a_snapshot_equal_to_a_set_delta_is_stored_once() -> None:
    codec = RowCodec()
    cp = make_checkpoint(
        "t",
        deltas={"x": ChannelDelta("set", (b"same",)), "y": ChannelDelta("set", (b"new",))},
        snapshot={"x": b"same", "y": b"old"},
    )
    rows = {(role, ch): (op, data) for role, ch, op, data in codec.channel_rows(cp)}
    assert rows[("s", "x")] == ("same", b"")
    assert rows[("s", "y")] == ("set", b"old")
    assert round_trip(codec, cp) == cp


def test_a_set_delta_carries_one_blob() -> None:
    cp = make_checkpoint("t", deltas={"x": ChannelDelta("set", (b"a", b"b"))})
    with pytest.raises(CheckpointError, match="exactly one blob"):
        RowCodec().channel_rows(cp)


def test_times_are_stored_as_utc_microseconds() -> None:
    moment = datetime(2024, 5, 17, 12, 34, 56, 789012, tzinfo=UTC)
    assert from_micros(to_micros(moment)) == moment
    cest = moment.astimezone(timezone(timedelta(hours=2)))
    assert from_micros(to_micros(cest)) == moment
    assert from_micros(to_micros(moment.replace(tzinfo=None))) == moment
    assert to_micros(moment) + 1 == to_micros(moment + timedelta(microseconds=1))


# -- encryption -----------------------------------------------------------------------------------


def test_envelope_names_its_version_and_key() -> None:
    enc = encryption()
    sealed = enc.encrypt(b"secret", context=blob_context("t", "", "c", "d", "x"))
    assert sealed[0] == ENVELOPE_VERSION
    assert sealed[1:4] == b"\x02k1"
    assert b"secret" not in sealed
    assert len(sealed) == 4 + 12 + len(b"secret") + 16
    again = enc.encrypt(b"secret", context=blob_context("t", "", "c", "d", "x"))
    assert again != sealed  # fresh nonce every time


def test_the_context_binds_a_blob_to_its_row() -> None:
    enc = encryption()
    sealed = enc.encrypt(b"v", context=blob_context("t", "", "c", "d", "x"))
    assert enc.decrypt(sealed, context=blob_context("t", "", "c", "d", "x"), what="v") == b"v"
    for other in [("t", "", "c", "d", "y"), ("t", "", "c2", "d", "x"), ("u", "", "c", "d", "x")]:
        with pytest.raises(DeserializationError, match="failed authentication"):
            enc.decrypt(sealed, context=blob_context(*other), what="v")
    # parts are delimited: moving a separator changes the context
    assert blob_context("a|b", "c") != blob_context("a", "b|c")


def test_decrypt_refuses_plaintext_truncated_and_unknown_keys() -> None:
    enc = encryption()
    ctx = blob_context("t")
    with pytest.raises(DeserializationError, match="not encrypted"):
        enc.decrypt(b'{"plain": 1}', context=ctx, what="blob")
    sealed = enc.encrypt(b"value", context=ctx)
    with pytest.raises(DeserializationError, match="truncated"):
        enc.decrypt(sealed[:10], context=ctx, what="blob")
    other = Encryption(keys={"k9": bytes(32)}, active="k9")
    with pytest.raises(DeserializationError, match="key id 'k1'"):
        other.decrypt(sealed, context=ctx, what="blob")


def test_rotation_decrypts_with_any_known_key() -> None:
    old = encryption()
    new = encryption(active="k2", k2=bytes(range(1, 33)))
    ctx = blob_context("t")
    assert new.decrypt(old.encrypt(b"x", context=ctx), context=ctx, what="x") == b"x"
    assert new.encrypt(b"x", context=ctx)[2:4] == b"k2"
    assert new.key_ids == ("k1", "k2") and new.active == "k2"


def test_keys_are_validated_and_never_shown() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        Encryption(keys={"k": b"short"}, active="k")
    with pytest.raises(ValueError, match="active key id"):
        Encryption(keys={"k": KEY}, active="other")
    with pytest.raises(ValueError, match="at least one key"):
        Encryption(keys={}, active="k")
    with pytest.raises(ValueError, match="key id"):
        Encryption(keys={"x" * 300: KEY}, active="x" * 300)
    assert KEY.hex() not in repr(encryption()) and "k1" in repr(encryption())


def test_encrypted_rows_are_bound_to_checkpoint_role_and_channel() -> None:
    codec = RowCodec(encryption())
    cp = make_checkpoint("t", snapshot=True)
    rows = as_rows(codec, cp)
    # move the snapshot's "notes" value into the "messages" row: authentication fails
    blob = {r[4]: i for i, r in enumerate(rows) if r[0] == "b" and r[3] == "s"}
    a, b = blob["notes"], blob["messages"]
    swapped = list(rows)
    swapped[a] = (*rows[a][:8], rows[b][8], *rows[a][9:])
    with pytest.raises(DeserializationError, match="failed authentication"):
        codec.checkpoints_from_rows("t", "", swapped)
    plain_reader = RowCodec()
    with pytest.raises(DeserializationError, match="is encrypted"):
        plain_reader.checkpoints_from_rows("t", "", rows)
