"""Where a batch keeps its checkpoints: a fresh store per measured batch, and its size on disk.

- ``memory``: nothing on disk; each system gets a new in-memory saver.
- ``sqlite``: a new file in the run's temporary folder, deleted (with its ``-wal`` and ``-shm``)
  after the batch. Size on disk is the file plus its WAL after ``PRAGMA
  wal_checkpoint(TRUNCATE)`` (run from a separate connection while the store is open and idle).
- ``postgres``: a new database (``CREATE DATABASE bench_...``, so the DSN's role needs the
  CREATEDB privilege), dropped after the batch. Size on disk is ``pg_total_relation_size``
  (table, indexes and TOAST) summed over every table in it, so whatever tables a checkpointer
  creates are counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks._systems import Durability, Location

__all__ = ["NO_BACKEND", "Env", "Storage", "sqlite_bytes"]

NO_BACKEND = "none"
"""The backend of a workload that runs without a checkpointer."""

_PG_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p', 'm')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%'
"""


def sqlite_bytes(path: Path) -> int:
    """Bytes of ``path`` and its ``-wal`` after ``wal_checkpoint(TRUNCATE)``.

    The ``-shm`` file (the WAL's shared-memory index, 32 KiB here for both systems, removed when
    the last connection closes) is not data and is left out.
    """
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    files = [path, path.with_name(path.name + "-wal")]
    return sum(f.stat().st_size for f in files if f.exists())


def remove_sqlite(path: Path) -> None:
    """Delete a SQLite file and its companions."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


async def _pg_admin(dsn: str, statement: Any) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(statement)


async def pg_bytes(dsn: str) -> int:
    """Total size of every user table (with indexes and TOAST) in the database of ``dsn``."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(_PG_SIZE)
        row = await cur.fetchone()
    return int(row[0]) if row else 0


@dataclass(slots=True)
class Storage:
    """A fresh place for one batch's checkpoints."""

    where: Location

    async def bytes_on_disk(self) -> int | None:
        """Bytes the backend uses now (``None`` for memory)."""
        if self.where.backend == "sqlite":
            assert self.where.path is not None
            return await asyncio.to_thread(sqlite_bytes, self.where.path)
        if self.where.backend == "postgres":
            assert self.where.dsn is not None
            return await pg_bytes(self.where.dsn)
        return None


@dataclass(frozen=True, slots=True)
class Env:
    """One case of a workload: its backend and durability, and where batches put their data.

    Attributes:
        backend: ``memory``, ``sqlite``, ``postgres`` or ``none`` (no checkpointer).
        durability: The mode every run of the case uses.
        tmp: Folder for SQLite files (one per batch, deleted after it).
        dsn: PostgreSQL server to create a database per batch in.
        synchronous: SQLite ``synchronous`` forced on both systems (``None``: their defaults).
        prepare: graphexec's PostgreSQL store prepares its statements (``prepare=True``).
        label_durability: Show the durability in the case's label.
    """

    backend: str
    durability: Durability
    tmp: Path
    dsn: str | None = None
    synchronous: str | None = None
    prepare: bool = False
    label_durability: bool = False

    @property
    def label(self) -> str:
        """``backend`` or ``backend/durability``, as shown in the table."""
        if self.backend == NO_BACKEND:
            return "-"
        return f"{self.backend}/{self.durability}" if self.label_durability else self.backend

    def with_backend(self, backend: str) -> Env:
        return replace(self, backend=backend)

    @contextlib.asynccontextmanager
    async def storage(self, tag: str = "batch") -> AsyncIterator[Storage]:
        """A fresh, empty location for one batch; removed afterwards."""
        name = f"{tag}-{uuid.uuid4().hex[:10]}"
        if self.backend == "sqlite":
            path = self.tmp / f"{name}.db"
            try:
                yield Storage(Location("sqlite", path=path, synchronous=self.synchronous))
            finally:
                remove_sqlite(path)
        elif self.backend == "postgres":
            if self.dsn is None:
                raise ValueError("the postgres backend needs --dsn")
            import psycopg
            from psycopg import sql

            db = "bench_" + name.replace("-", "_")
            await _pg_admin(self.dsn, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db)))
            try:
                dsn = psycopg.conninfo.make_conninfo(self.dsn, dbname=db)
                yield Storage(Location("postgres", dsn=dsn, prepare=self.prepare))
            finally:
                await _pg_admin(
                    self.dsn,
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(db)),
                )
        else:
            yield Storage(Location(self.backend))
