"""What both archival stores (SQLite and PostgreSQL) share, apart from vector scoring.

Search limits, the values that pass between a store and its statements (:class:`NewPassage`,
:class:`PassageRow`, :class:`NamespaceState`), argument validation, search and list cursors,
and turning a passage row into a :class:`~memory.Passage`. Nothing here knows SQL; vector
caching and scoring are in :mod:`memory._vectors`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from graphexec.errors import MemoryStoreError
from memory._base import Namespace, Passage

__all__ = [
    "DEPTH_FACTOR",
    "MAX_QUERY_TERMS",
    "MAX_TOP_K",
    "MIN_DEPTH",
    "RRF_K",
    "NamespaceState",
    "NewPassage",
    "PassageRow",
    "Seqs",
    "check_embedder",
    "check_limit",
    "check_metadata",
    "check_namespace",
    "check_passage",
    "check_str",
    "check_tags",
    "check_time",
    "cursor_digest",
    "decode_cursor",
    "encode_cursor",
    "now_us",
    "passage_of",
    "state_of",
]

MAX_TOP_K = 1000
"""Largest ``top_k`` (and ``list`` limit) accepted."""
MIN_DEPTH = 50
"""Candidates taken from each list before fusion: ``max(MIN_DEPTH, DEPTH_FACTOR * top_k)``."""
DEPTH_FACTOR = 5
RRF_K = 60
MAX_QUERY_TERMS = 32
"""Distinct query words considered for keyword search; the rest of a longer query is ignored."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)

Seqs = list[int]
"""Passage ``seq`` numbers, best first."""


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewPassage:
    """One passage for an archival store's ``insert_many``.

    Attributes:
        text: The passage (non-empty).
        tags: Its tags (non-empty strings).
        metadata: JSON-compatible metadata.
        op_key: Makes this insert idempotent, as the ``op_key`` of the store's ``insert``.
    """

    text: str
    tags: Sequence[str] = ()
    metadata: Mapping[str, Any] | None = None
    op_key: str | None = None


class NamespaceState(NamedTuple):
    """A namespace's row: its id, embedder, passage count and change counters."""

    nsid: int
    embedder: str | None
    dim: int | None
    passages: int
    version: int
    epoch: int
    file_passages: int = -1
    """Passages of every namespace in the file (SQLite search only; -1 when not read)."""
    file_version: int = -1
    """Sum of every namespace's version: changes with any write to the file (search only)."""


@dataclass(frozen=True, slots=True)
class PassageRow:
    """A validated passage ready to write (the vector comes later)."""

    id: str
    text: str
    tags: tuple[str, ...]
    metadata: str
    op_key: str | None


# -- validation ------------------------------------------------------------------------------


def check_str(value: object, what: str, *, blank_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise MemoryStoreError(f"archival {what} must be a str, got {type(value).__name__}")
    if not blank_ok and not value.strip():
        raise MemoryStoreError(f"archival {what} must not be empty or blank")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MemoryStoreError(f"archival {what} is not valid Unicode text ({e.reason})") from e
    return value


def check_namespace(namespace: object) -> Namespace:
    if not isinstance(namespace, tuple):
        raise MemoryStoreError(
            f"archival namespace must be a tuple of strings, got {namespace!r}; e.g. ('user', '42')"
        )
    for part in namespace:
        if not isinstance(part, str) or not part:
            raise MemoryStoreError(
                f"archival namespace {namespace!r}: every part must be a non-empty str"
            )
        check_str(part, "namespace part")
    return namespace


def check_tags(tags: object, what: str = "tags") -> tuple[str, ...]:
    if isinstance(tags, str | bytes) or not isinstance(tags, Iterable):
        raise MemoryStoreError(
            f"archival {what} must be a sequence of strings, got {tags!r}; for one tag write "
            f"[{tags!r}]"
        )
    out: dict[str, None] = {}
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise MemoryStoreError(
                f"archival {what}: every tag must be a non-empty str, got {tag!r}"
            )
        out[check_str(tag, "tag", blank_ok=True)] = None
    return tuple(out)


def _check_json(value: object, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        if isinstance(value, str):
            check_str(value, f"metadata value at {path}", blank_ok=True)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise MemoryStoreError(f"archival metadata at {path} is {value}: JSON has no NaN/inf")
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise MemoryStoreError(f"archival metadata at {path}: key {key!r} is not a str")
            _check_json(item, f"{path}[{key!r}]")
        return
    raise MemoryStoreError(
        f"archival metadata at {path} is a {type(value).__name__}, which is not JSON-compatible "
        "(use dicts, lists, str, int, float, bool or None)"
    )


def check_metadata(metadata: object) -> str:
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping):
        raise MemoryStoreError(f"archival metadata must be a mapping, got {metadata!r}")
    _check_json(metadata, "metadata")
    return json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _check_op_key(op_key: object) -> str | None:
    return None if op_key is None else check_str(op_key, "op_key")


def check_time(value: object, name: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise MemoryStoreError(
            f"archival search {name}= must be a timezone-aware datetime (e.g. "
            f"datetime.now(UTC)), got {value!r}"
        )
    return (value - _EPOCH) // _US


def check_limit(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TOP_K:
        raise MemoryStoreError(
            f"archival {name} must be an int from 1 to {MAX_TOP_K}, got {value!r}"
        )
    return value


def check_passage(passage: NewPassage | str) -> PassageRow:
    """A validated row for an ``insert_many`` item, with a fresh id."""
    if isinstance(passage, str):
        passage = NewPassage(passage)
    elif not isinstance(passage, NewPassage):
        raise MemoryStoreError(f"insert_many takes str or NewPassage items, got {passage!r}")
    return PassageRow(
        id=str(uuid.uuid4()),
        text=check_str(passage.text, "passage text"),
        tags=check_tags(passage.tags),
        metadata=check_metadata(passage.metadata),
        op_key=_check_op_key(passage.op_key),
    )


# -- cursors ---------------------------------------------------------------------------------


def cursor_digest(*parts: object) -> str:
    """A short hash of a call's arguments: a cursor is only valid for the call it came from."""
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def encode_cursor(payload: Mapping[str, Any]) -> str:
    raw = json.dumps(payload, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: object, kind: str, digest: str, fields: Sequence[str]) -> list[int]:
    if not isinstance(cursor, str):
        raise MemoryStoreError(f"archival cursor must be a str, got {cursor!r}")
    try:
        payload = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, UnicodeDecodeError) as e:
        raise MemoryStoreError(
            "invalid archival cursor: pass back the cursor a previous page returned"
        ) from e
    values = [payload.get(f) for f in fields] if isinstance(payload, dict) else []
    if (
        not isinstance(payload, dict)
        or payload.get("k") != kind
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)
    ):
        raise MemoryStoreError(
            f"invalid archival cursor for {kind}(): pass back the cursor a previous page returned"
        )
    if payload.get("h") != digest:
        raise MemoryStoreError(
            f"this cursor belongs to a different {kind}(): the query, filters or namespace "
            "changed; repeat the first call without a cursor"
        )
    return [int(v) for v in values if isinstance(v, int)]


# -- rows ------------------------------------------------------------------------------------

_clock_lock = threading.Lock()
_last_us = 0


def now_us() -> int:
    """Microseconds since the epoch, strictly increasing within this process."""
    global _last_us
    with _clock_lock:
        _last_us = max(time.time_ns() // 1000, _last_us + 1)
        return _last_us


def passage_of(row: Sequence[Any]) -> Passage:
    """The passage of a ``(seq, id, text, metadata, created_at, tags JSON)`` row."""
    _, pid, text, metadata, created_at, tags = row
    return Passage(
        id=pid,
        text=text,
        tags=tuple(json.loads(tags)),
        metadata=json.loads(metadata),
        created_at=_EPOCH + int(created_at) * _US,
    )


def state_of(rows: Sequence[Sequence[Any]]) -> NamespaceState | None:
    return NamespaceState(*rows[0]) if rows else None


def check_embedder(
    state: NamespaceState | None, embedder: str, dim: int, namespace: Namespace
) -> None:
    """Refuse an embedder other than the one whose vectors the namespace holds."""
    if state is None or state.passages == 0 or state.embedder is None:
        return
    if (state.embedder, state.dim) != (embedder, dim):
        raise MemoryStoreError(
            f"archival namespace {namespace!r} holds vectors from embedder {state.embedder!r} "
            f"(dim {state.dim}), but this store uses {embedder!r} (dim {dim}); vectors of "
            "different models cannot be compared. Open the store with the same embedder, or "
            "call reembed() to recompute every vector with this one"
        )
