"""The SQLite memory backend: every tier in one file (or one private in-memory database).

:class:`SqliteMemory` is the entry point: one object per database, holding the session,
fact, block and recall tiers on one set of connections (one writer and one reader per event
loop; WAL, retried ``BEGIN IMMEDIATE`` transactions, as the SQLite checkpointer). The archival
tier keeps its own connections to the same file.

Several processes may share the file: every write is one transaction, every read sees a
committed snapshot, and an object in one process sees the others' writes on its next read.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self

from graphexec.errors import StorageError
from memory._base import Namespace
from memory._sqlite_common import Synchronous, check_namespace, open_database
from memory._sqlite_session import SqliteRecallStore, SqliteSession
from memory._sqlite_stores import SqliteBlockStore, SqliteFactStore

if TYPE_CHECKING:
    from memory._sqlite_archival import SqliteArchivalStore
    from memory.embedders import Embedder

__all__ = [
    "SqliteBlockStore",
    "SqliteFactStore",
    "SqliteMemory",
    "SqliteRecallStore",
    "SqliteSession",
]


class SqliteMemory:
    """Every memory tier on one SQLite database.

    ::

        async with SqliteMemory.open("memory.db") as mem:
            session = mem.session("user-42")
            await session.add_items([{"role": "user", "content": "I'm vegetarian."}])
            await mem.facts.put(("user", "42"), "diet", "vegetarian", source="chat")
            await mem.blocks.create(Block("human", "Name: Ada", limit=2000))
            hits = await mem.recall.search("vegetarian")

    Without ``async with``, call :meth:`setup` (optional: the schema is created on first use)
    and :meth:`aclose`. A memory garbage-collected with open connections emits a
    :class:`ResourceWarning`.

    Args:
        path: The database file (created if missing); ``None`` for a private in-memory
            database, gone on :meth:`aclose` (the archival tier then has its own).
        synchronous: SQLite's ``synchronous`` pragma: ``"NORMAL"`` (safe against process
            crashes) or ``"FULL"`` (also against power loss; one fsync per write).
        busy_timeout: Seconds a write waits for another connection's lock before retrying.
        loop_writes: Small writes (new session items, facts and blocks) run on the event loop's
            thread in ``synchronous="NORMAL"`` (see :class:`~checkpointers.SqliteCheckpointer`);
            ``False`` keeps every statement on the connection's thread.
        embedder: The archival tier's embedder (its default when ``None``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
        embedder: Embedder | None = None,
    ) -> None:
        self._path = path
        self._db = open_database(
            path,
            owner=f"SqliteMemory({None if path is None else os.fspath(path)!r})",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
        )
        self._embedder = embedder
        self._facts = SqliteFactStore._attach(self._db)
        self._recall = SqliteRecallStore._attach(self._db)
        self._blocks: dict[Namespace, SqliteBlockStore] = {}
        self._archival: dict[Namespace, SqliteArchivalStore] = {}
        self._closed = False

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
        embedder: Embedder | None = None,
    ) -> AsyncIterator[Self]:
        """Open the database (creating or migrating the schema), yield, and close on exit.

        Takes the same arguments as the constructor.
        """
        mem = cls(
            path,
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
            embedder=embedder,
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
    def path(self) -> Path | None:
        """The database file, or ``None`` for a private in-memory database."""
        return None if self._db.memory else Path(self._db.where)

    # -- lifecycle --------------------------------------------------------------------------

    async def setup(self) -> None:
        """Open this event loop's connections and create or migrate the schema. Idempotent.

        Also sets up the archival store if it was made already.

        Raises:
            StorageError: The file cannot be opened, or a newer graphexec wrote its schema.
        """
        await self._db.open()
        archival = self._archival.get(())
        if archival is not None:
            await archival.setup()

    async def aclose(self) -> None:
        """Close every connection of every tier, in every event loop. Final."""
        self._closed = True
        archival = self._archival.get(())
        self._archival = {}
        try:
            if archival is not None:  # its namespace views share its connections
                await archival.aclose()
        finally:
            await self._db.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self!r} is closed; open a new one")

    # -- tiers ------------------------------------------------------------------------------

    def session(self, session_id: str) -> SqliteSession:
        """The session with this id (the same history for every call with the same id).

        The session shares this memory's connections; closing it does nothing, closing the
        memory closes it.

        Raises:
            MemoryStoreError: ``session_id`` is not a non-empty str.
        """
        self._check_open()
        return SqliteSession._attach(session_id, self._db)

    @property
    def facts(self) -> SqliteFactStore:
        """Long-term key-value facts."""
        return self._facts

    @property
    def recall(self) -> SqliteRecallStore:
        """Search over every session item of this database, evicted ones included."""
        return self._recall

    @property
    def blocks(self) -> SqliteBlockStore:
        """Core-memory blocks of the default namespace ``()``."""
        return self.blocks_for(())

    def blocks_for(self, namespace: Namespace) -> SqliteBlockStore:
        """Core-memory blocks scoped to ``namespace`` (e.g. ``("agent", "planner")``).

        Raises:
            MemoryStoreError: ``namespace`` is not a tuple of non-empty strings.
        """
        ns = check_namespace(namespace)
        store = self._blocks.get(ns)
        if store is None:
            store = self._blocks.setdefault(ns, SqliteBlockStore._attach(self._db, ns))
        return store

    @property
    def archival(self) -> SqliteArchivalStore:
        """Archival passages of the default namespace ``()``."""
        return self.archival_for(())

    def archival_for(self, namespace: Namespace) -> SqliteArchivalStore:
        """Archival passages scoped to ``namespace``.

        The archival store is made on first use, on this memory's file (or its own private
        in-memory database when ``path`` is ``None``) with its own connections, which every
        namespace's view shares; :meth:`aclose` closes it.

        Raises:
            MemoryStoreError: ``namespace`` is not a tuple of non-empty strings.
            StorageError: The memory is closed.
        """
        self._check_open()
        ns = check_namespace(namespace)
        store = self._archival.get(ns)
        if store is None:
            base = self._archival.get(())
            if base is None:
                # Imported on first use: sessions, facts and blocks never need it.
                module = importlib.import_module("memory._sqlite_archival")
                base = module.SqliteArchivalStore(self._path, embedder=self._embedder)
                self._archival[()] = base
            store = base if not ns else self._archival.setdefault(ns, base.for_namespace(ns))
        return store
