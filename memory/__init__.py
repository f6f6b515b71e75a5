"""Agent memory for graphexec: sessions, facts, blocks, archival and recall search.

One object per database holds every tier::

    from memory import SqliteMemory

    async with SqliteMemory.open("memory.db") as mem:
        session = mem.session("user-42")  # short-term: the conversation (Session)
        await session.add_items([{"role": "user", "content": "Book a flight to Lisbon"}])
        await mem.facts.put(("user", "42"), "home_airport", "LHR")  # long-term facts
        print(await mem.blocks.render())  # core-memory blocks for the prompt
        hits = await mem.recall.search("Lisbon")  # every past session item

``SqliteSession(session_id, path=None)`` also works on its own, as in the OpenAI Agents SDK.
``PostgresMemory(dsn, schema=...)`` / ``PostgresSession(session_id, dsn)`` are the same tiers on
PostgreSQL (the ``postgres`` extra). A session's every stored item, recall copies included, is
erased with ``mem.recall.purge(session_id)``.
The interfaces (:class:`Session`, :class:`FactStore`, :class:`BlockStore`,
:class:`ArchivalStore`, :class:`RecallStore`) are what every backend implements; the contract
suites in :mod:`graphexec.testing.memory_contracts` check them.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphexec.errors import MemoryConflictError, MemoryStoreError
from memory._base import (
    ArchivalHit,
    ArchivalStore,
    BlockStore,
    Fact,
    FactStore,
    FactVersion,
    Namespace,
    Passage,
    RecallHit,
    RecallStore,
    SearchPage,
    Session,
)
from memory._blocks import Block
from memory._text import (
    EstimatingTokenCounter,
    TokenCounter,
    estimate_tokens,
    extractive_summary,
)
from memory.embedders import Embedder, HashingEmbedder, MiniLMEmbedder
from memory.sqlite import (
    SqliteBlockStore,
    SqliteFactStore,
    SqliteMemory,
    SqliteRecallStore,
    SqliteSession,
)

__all__ = [
    # interfaces
    "Session",
    "FactStore",
    "BlockStore",
    "ArchivalStore",
    "RecallStore",
    "Namespace",
    # records
    "Block",
    "Fact",
    "FactVersion",
    "Passage",
    "ArchivalHit",
    "SearchPage",
    "RecallHit",
    # SQLite backend
    "SqliteMemory",
    "SqliteSession",
    "SqliteFactStore",
    "SqliteBlockStore",
    "SqliteRecallStore",
    "SqliteArchivalStore",
    "NewPassage",
    # PostgreSQL backend (the ``postgres`` extra; imported on first use)
    "PostgresMemory",
    "PostgresSession",
    "PostgresFactStore",
    "PostgresBlockStore",
    "PostgresRecallStore",
    "PostgresArchivalStore",
    # errors
    "MemoryStoreError",
    "MemoryConflictError",
    # text helpers (pluggable token counting and summarising, used by memory.nodes.compact)
    "TokenCounter",
    "EstimatingTokenCounter",
    "estimate_tokens",
    "extractive_summary",
    # embedders
    "Embedder",
    "HashingEmbedder",
    "MiniLMEmbedder",
]

_LAZY = {
    "SqliteArchivalStore": "memory._sqlite_archival",
    "NewPassage": "memory._archival_common",
    "PostgresMemory": "memory.postgres",
    "PostgresSession": "memory.postgres",
    "PostgresFactStore": "memory.postgres",
    "PostgresBlockStore": "memory.postgres",
    "PostgresRecallStore": "memory.postgres",
    "PostgresArchivalStore": "memory.postgres",
}


def __getattr__(name: str) -> Any:
    # The archival store pulls in the embedders, the PostgreSQL backend psycopg (an optional
    # extra): import them only when someone asks for them.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
