"""The PostgreSQL memory backend: every tier in one schema of one database.

:class:`PostgresMemory` is the entry point: one object per database (and schema), holding the
session, fact, block, archival and recall tiers on one set of psycopg pools (one per event
loop, as the PostgreSQL checkpointer). Any number of processes may share the schema: every
write is one transaction, writers of one session, fact, block or archival namespace are
serialised by row or advisory locks, and readers see committed data only.

Needs the ``postgres`` extra (``pip install "graphexec[postgres]"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

from graphexec.errors import StorageError
from memory._base import Namespace
from memory._pg_archival import PostgresArchivalStore
from memory._pg_common import open_database, pg_namespace
from memory._pg_session import PostgresRecallStore, PostgresSession
from memory._pg_stores import PostgresBlockStore, PostgresFactStore
from memory.embedders import Embedder

__all__ = [
    "PostgresArchivalStore",
    "PostgresBlockStore",
    "PostgresFactStore",
    "PostgresMemory",
    "PostgresRecallStore",
    "PostgresSession",
]


class PostgresMemory:
    """Every memory tier in one PostgreSQL schema.

    ::

        async with PostgresMemory.open("postgresql://app@db/app", schema="agent_memory") as mem:
            session = mem.session("user-42")
            await session.add_items([{"role": "user", "content": "I'm vegetarian."}])
            await mem.facts.put(("user", "42"), "diet", "vegetarian", source="chat")
            await mem.blocks.create(Block("human", "Name: Ada", limit=2000))
            hits = await mem.recall.search("vegetarian")

    Without ``async with``, call :meth:`setup` (optional: the schema is created on first use)
    and :meth:`aclose`. A memory garbage-collected with open connections emits a
    :class:`ResourceWarning`.

    Args:
        dsn: A libpq connection string or URI.
        schema: Keep every table in this schema (created if missing) instead of the first
            schema of the connection's ``search_path``. An SQL identifier (letters, digits,
            ``_``); it is quoted, never interpolated raw.
        embedder: The archival tier's embedder (:class:`~memory.HashingEmbedder` when
            ``None``).
        pool_min: Connections each event loop's pool keeps open.
        pool_max: Most connections each event loop's pool opens.
        pool_timeout: Seconds an operation waits for a free connection before failing.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str | None = None,
        embedder: Embedder | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
    ) -> None:
        self._db = open_database(
            dsn,
            owner=f"PostgresMemory(schema={schema!r})",
            schema=schema,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
        )
        self._embedder = embedder
        self._facts = PostgresFactStore._attach(self._db)
        self._recall = PostgresRecallStore._attach(self._db)
        self._blocks: dict[Namespace, PostgresBlockStore] = {}
        self._archival: dict[Namespace, PostgresArchivalStore] = {}
        self._closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        dsn: str,
        *,
        schema: str | None = None,
        embedder: Embedder | None = None,
        pool_min: int = 1,
        pool_max: int = 10,
        pool_timeout: float = 30.0,
    ) -> AsyncIterator[Self]:
        """Open the pool (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor.
        """
        mem = cls(
            dsn,
            schema=schema,
            embedder=embedder,
            pool_min=pool_min,
            pool_max=pool_max,
            pool_timeout=pool_timeout,
        )
        try:
            await mem.setup()
            yield mem
        finally:
            await mem.aclose()

    async def __aenter__(self) -> Self:
        await self.setup()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.where!r})"

    @property
    def schema(self) -> str | None:
        """The schema holding the tables (``None``: the connection's ``search_path``)."""
        return self._db.schema

    async def setup(self) -> None:
        """Open this event loop's pool and create or migrate the schema. Idempotent.

        Raises:
            StorageError: The server cannot be reached, or a newer graphexec wrote the schema.
        """
        self._check_open()
        await self._db.open()

    async def aclose(self) -> None:
        """Close every pool of every tier, in every event loop. Final."""
        self._closed = True
        for store in self._archival.values():
            store._shared.caches.clear()
        self._archival = {}
        await self._db.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self!r} is closed; open a new one")

    def session(self, session_id: str) -> PostgresSession:
        """The session with this id (the same history for every call with the same id).

        The session shares this memory's pool; closing it does nothing, closing the memory
        closes it.

        Raises:
            MemoryStoreError: ``session_id`` is not a non-empty str.
        """
        self._check_open()
        return PostgresSession._attach(session_id, self._db)

    @property
    def facts(self) -> PostgresFactStore:
        """Long-term key-value facts."""
        return self._facts

    @property
    def recall(self) -> PostgresRecallStore:
        """Search over every session item of this schema, evicted ones included."""
        return self._recall

    @property
    def blocks(self) -> PostgresBlockStore:
        """Core-memory blocks of the default namespace ``()``."""
        return self.blocks_for(())

    def blocks_for(self, namespace: Namespace) -> PostgresBlockStore:
        """Core-memory blocks scoped to ``namespace`` (e.g. ``("agent", "planner")``).

        Raises:
            MemoryStoreError: ``namespace`` is not a tuple of non-empty strings.
        """
        ns = pg_namespace(namespace)
        store = self._blocks.get(ns)
        if store is None:
            store = self._blocks.setdefault(ns, PostgresBlockStore._attach(self._db, ns))
        return store

    @property
    def archival(self) -> PostgresArchivalStore:
        """Archival passages of the default namespace ``()``."""
        return self.archival_for(())

    def archival_for(self, namespace: Namespace) -> PostgresArchivalStore:
        """Archival passages scoped to ``namespace``, on this memory's pool.

        Every namespace's view shares one embedder and one set of vector caches.

        Raises:
            MemoryStoreError: ``namespace`` is not a tuple of non-empty strings.
            StorageError: The memory is closed.
        """
        self._check_open()
        ns = pg_namespace(namespace)
        store = self._archival.get(ns)
        if store is None:
            base = self._archival.get(())
            if base is None:
                base = PostgresArchivalStore._attach(
                    self._db, namespace=(), embedder=self._embedder
                )
                self._archival[()] = base
            store = base if not ns else self._archival.setdefault(ns, base.for_namespace(ns))
        return store
