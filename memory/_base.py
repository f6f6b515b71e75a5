"""The memory tiers' interfaces: what every backend (SQLite, PostgreSQL) implements.

- :class:`Session`: short-term memory, the OpenAI Agents SDK session contract.
- :class:`FactStore`: long-term key-value facts in exact-match namespaces, with history.
- :class:`BlockStore`: Letta-style core-memory blocks, version-checked.
- :class:`ArchivalStore`: passages searched by meaning and keywords (hybrid), with filters.
- :class:`RecallStore`: search over every session item ever stored, evicted ones included.

Conventions shared by all tiers:

- Namespaces are tuples of non-empty strings, matched exactly (never by prefix).
- ``op_key`` makes a write idempotent: a second write with the same key (for example a graph
  step re-run after a crash, which passes ``ctx.idempotency_key``) changes nothing and returns
  the first write's result.
- Bad input raises :class:`~graphexec.errors.MemoryStoreError` naming the tier, key or id,
  before anything is written. Lookups of missing things return ``None``.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from memory._blocks import Block

__all__ = [
    "ArchivalHit",
    "ArchivalStore",
    "Block",
    "BlockStore",
    "Fact",
    "FactStore",
    "FactVersion",
    "Namespace",
    "Passage",
    "RecallHit",
    "RecallStore",
    "SearchPage",
    "Session",
]

Namespace = tuple[str, ...]
Item = dict[str, Any]


class Session(ABC):
    """Conversation history of one session id (the Agents SDK ``Session`` protocol).

    Items are JSON-compatible dicts (``{"role": ..., "content": ...}`` or tool items). The same
    session id always reaches the same history; different ids are isolated.
    """

    session_id: str

    @abstractmethod
    async def get_items(self, limit: int | None = None) -> list[Item]:
        """The latest ``limit`` items (all when ``None``), oldest first."""

    @abstractmethod
    async def add_items(
        self, items: Sequence[Mapping[str, Any]], *, op_key: str | None = None
    ) -> None:
        """Append items, atomically. A non-JSON-compatible item is refused before any write."""

    @abstractmethod
    async def pop_item(self) -> Item | None:
        """Remove and return the newest item (``None`` when empty)."""

    @abstractmethod
    async def clear_session(self) -> None:
        """Remove every item of this session (they stay searchable through recall)."""

    @abstractmethod
    async def branch_from(self, turn: int, new_session_id: str) -> Session:
        """Copy items ``[0, turn)`` into a new session and return it (``turn`` is 0-based)."""

    @abstractmethod
    async def evict_oldest(self, count: int, summary: Mapping[str, Any] | None = None) -> list[str]:
        """Move the ``count`` oldest items out of the context (compaction).

        Evicted items stay searchable through recall. With ``summary``, that item takes their
        place as the oldest item, with the evicted ids under ``summary["replaces"]``. Done in one
        transaction. Returns the evicted items' ids.
        """


@dataclass(frozen=True, slots=True)
class Fact:
    """The current value of a fact.

    Attributes:
        namespace: Exact-match namespace, e.g. ``("user", "42")``.
        key: The fact's key within the namespace.
        value: JSON-compatible value.
        source: Where it came from (free text: a node, a run id, "user said").
        updated_at: When it was last written.
        version: 1 for the first write, +1 for every write since.
    """

    namespace: Namespace
    key: str
    value: Any
    source: str | None
    updated_at: datetime
    version: int


@dataclass(frozen=True, slots=True)
class FactVersion:
    """One past (or the current) value of a fact, for :meth:`FactStore.history`.

    Attributes:
        value: The value (``None`` with ``deleted=True`` for a deletion).
        source: Where it came from.
        at: When it was written.
        version: Its version number.
        deleted: Whether this entry records a deletion.
    """

    value: Any
    source: str | None
    at: datetime
    version: int
    deleted: bool = False


class FactStore(ABC):
    """Long-term key-value facts. Last write wins; every write is kept in the history."""

    @abstractmethod
    async def put(
        self,
        namespace: Namespace,
        key: str,
        value: Any,
        *,
        source: str | None = None,
        op_key: str | None = None,
    ) -> Fact:
        """Set a fact (creating or replacing it) and return it."""

    @abstractmethod
    async def get(self, namespace: Namespace, key: str) -> Fact | None:
        """The fact, or ``None``."""

    @abstractmethod
    async def delete(self, namespace: Namespace, key: str, *, source: str | None = None) -> bool:
        """Delete a fact (its history keeps a deletion entry). Whether it existed."""

    @abstractmethod
    async def list(self, namespace: Namespace) -> list[Fact]:
        """Every fact of exactly this namespace, most recently updated first."""

    @abstractmethod
    async def search(
        self, namespace: Namespace, query: str, *, limit: int = 10
    ) -> builtins.list[Fact]:
        """Facts of this namespace whose key or value matches ``query``, best first."""

    @abstractmethod
    async def history(self, namespace: Namespace, key: str) -> builtins.list[FactVersion]:
        """Every value the fact had, oldest first (deletions included)."""

    @abstractmethod
    async def summary(self, namespace: Namespace, max_chars: int) -> str:
        """``- key: value`` lines, most recently updated first, within ``max_chars``."""


class BlockStore(ABC):
    """Core-memory blocks, one record per label, shared by every graph that uses this store.

    Agent-facing edits (:meth:`append`, :meth:`replace`) enforce ``limit`` and ``read_only``;
    the developer API (:meth:`update` with ``force=True``) may override both. Every write bumps
    ``version``; passing ``expected_version`` turns a concurrent update into an error instead of
    a lost write.
    """

    @abstractmethod
    async def create(self, block: Block) -> Block:
        """Create a block; an existing label is an error."""

    @abstractmethod
    async def get(self, label: str) -> Block | None:
        """The block, or ``None``."""

    @abstractmethod
    async def list(self) -> list[Block]:
        """Every block, by label."""

    @abstractmethod
    async def update(
        self, label: str, value: str, *, force: bool = False, expected_version: int | None = None
    ) -> Block:
        """Replace a block's value (developer API; ``force`` bypasses ``read_only`` and limit)."""

    @abstractmethod
    async def append(self, label: str, text: str, *, expected_version: int | None = None) -> Block:
        """Agent tool: append ``text`` (on a new line)."""

    @abstractmethod
    async def replace(
        self, label: str, old: str, new: str, *, expected_version: int | None = None
    ) -> Block:
        """Agent tool: replace ``old``, which must occur exactly once, with ``new``."""

    @abstractmethod
    async def delete(self, label: str) -> bool:
        """Delete a block. Whether it existed."""

    @abstractmethod
    async def render(self, labels: Sequence[str] | None = None) -> str:
        """The ``<memory_blocks>`` XML for these blocks (all when ``None``)."""


@dataclass(frozen=True, slots=True)
class Passage:
    """A stored archival passage.

    Attributes:
        id: Its id.
        text: The passage.
        tags: Its tags.
        metadata: JSON-compatible metadata.
        created_at: When it was inserted (filters ``after``/``before`` use this).
    """

    id: str
    text: str
    tags: tuple[str, ...]
    metadata: Mapping[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ArchivalHit:
    """A search result.

    Attributes:
        passage: The passage.
        score: Fused relevance (higher is better; comparable within one search only).
    """

    passage: Passage
    score: float


@dataclass(frozen=True, slots=True)
class SearchPage:
    """One page of search results.

    Attributes:
        hits: Best first.
        cursor: Pass to the same search to get the next page; ``None`` when there is none.
    """

    hits: list[ArchivalHit] = field(default_factory=list)
    cursor: str | None = None


class ArchivalStore(ABC):
    """Long-term passages searched by meaning (vectors) and keywords (full text), fused.

    Filters (tags, dates) apply inside the query, before ``top_k``, so a filtered search finds
    matches whenever they exist. Agents get :meth:`insert` and :meth:`search`; developers also
    :meth:`get`, :meth:`list`, :meth:`update` and :meth:`delete`.
    """

    namespace: Namespace

    @abstractmethod
    async def insert(
        self,
        text: str,
        *,
        tags: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        op_key: str | None = None,
    ) -> str:
        """Store a passage and return its id."""

    @abstractmethod
    async def search(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        tag_mode: Literal["any", "all"] = "any",
        top_k: int = 10,
        cursor: str | None = None,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> SearchPage:
        """Hybrid search, best first."""

    @abstractmethod
    async def get(self, passage_id: str) -> Passage | None:
        """A passage by id, or ``None``."""

    @abstractmethod
    async def list(
        self, *, tags: Sequence[str] | None = None, limit: int = 100, cursor: str | None = None
    ) -> SearchPage:
        """Passages newest first (scores are 0), paged."""

    @abstractmethod
    async def update(
        self,
        passage_id: str,
        *,
        text: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Passage:
        """Change a passage (re-embedding it when the text changes)."""

    @abstractmethod
    async def delete(self, passage_id: str) -> bool:
        """Delete a passage. Whether it existed."""


@dataclass(frozen=True, slots=True)
class RecallHit:
    """A past session item found by recall search.

    Attributes:
        session_id: The session it belongs (or belonged) to.
        item: The item.
        position: Its position in that session's history (0-based).
        at: When it was added.
        evicted: Whether compaction removed it from the session's context.
        score: Relevance (higher is better).
    """

    session_id: str
    item: Item
    position: int
    at: datetime
    evicted: bool
    score: float


class RecallStore(ABC):
    """Search over every session item ever added, including items evicted by compaction."""

    @abstractmethod
    async def search(
        self,
        query: str,
        *,
        session_id: str | None = None,
        top_k: int = 10,
        after: datetime | None = None,
        before: datetime | None = None,
    ) -> list[RecallHit]:
        """Items matching ``query``, best first; ``session_id`` restricts to one session."""

    @abstractmethod
    async def purge(self, session_id: str) -> int:
        """Delete every stored item of ``session_id`` (privacy erasure); how many were deleted.

        Unlike ``clear_session``, nothing stays searchable: items in the context, items evicted
        by compaction or ``clear_session``, and the session's op keys all go, in one
        transaction.
        """
