"""Backend factory of the reliability battery: a SQLite file or a PostgreSQL schema (not a test).

A :class:`Backend` names one fresh store. The parent opens it with :meth:`Backend.open`; a worker
process gets :attr:`Backend.spec` (JSON) and opens the same store with :func:`open_spec`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import BaseCheckpointer

KINDS = ("sqlite", "postgres")


@dataclass
class Backend:
    kind: str
    spec: dict[str, Any]

    @contextlib.asynccontextmanager
    async def open(self, **options: Any) -> AsyncIterator[BaseCheckpointer]:
        async with open_spec(self.spec, **options) as cp:
            yield cp

    def integrity_problems(self) -> list[str]:
        if self.kind == "sqlite":
            db = Path(self.spec["db"])
            if not db.exists():
                return []
            with contextlib.closing(sqlite3.connect(db)) as conn:
                result = str(conn.execute("PRAGMA integrity_check").fetchone()[0])
            return [] if result == "ok" else [f"integrity_check: {result}"]
        import pg_worker

        return list(pg_worker.integrity_problems(self.spec["dsn"], self.spec["schema"]))

    def raw_sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run SQL behind the store's back (tests tamper with rows this way); tables unqualified."""
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.spec["db"], isolation_level=None)) as c:
                return [tuple(r) for r in c.execute(query.replace("%s", "?"), params).fetchall()]
        import psycopg

        with psycopg.connect(self.spec["dsn"], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.spec["schema"]}"')
            cur = conn.execute(query, params)  # type: ignore[call-overload]
            return [tuple(r) for r in cur.fetchall()] if cur.description else []

    def tables(self) -> list[str]:
        if self.kind == "sqlite":
            rows = self.raw_sql("SELECT name FROM sqlite_master WHERE type = 'table'")
        else:
            rows = self.raw_sql(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (self.spec["schema"],),
            )
        return sorted(str(r[0]) for r in rows)


@contextlib.asynccontextmanager
async def open_spec(
    spec: dict[str, Any], *, encryption: Encryption | None = None, **options: Any
) -> AsyncIterator[BaseCheckpointer]:
    if spec["kind"] == "sqlite":
        async with SqliteCheckpointer.open(spec["db"], encryption=encryption, **options) as cp:
            yield cp
        return
    from checkpointers import PostgresCheckpointer

    async with PostgresCheckpointer.open(
        spec["dsn"], schema=spec["schema"], encryption=encryption, **options
    ) as cp:
        yield cp


@contextlib.asynccontextmanager
async def make_backend(kind: str, folder: Path, name: str = "store") -> AsyncIterator[Backend]:
    """A fresh store of ``kind``: a new SQLite file, or a new PostgreSQL schema (dropped after)."""
    if kind == "sqlite":
        folder.mkdir(parents=True, exist_ok=True)
        yield Backend("sqlite", {"kind": "sqlite", "db": str(folder / f"{name}.db")})
        return
    from pg import fresh_schema, postgres_dsn

    async with fresh_schema() as schema:
        yield Backend("postgres", {"kind": "postgres", "dsn": postgres_dsn(), "schema": schema})


def backend_params() -> list[Any]:
    import pytest

    return [
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]


# -- memory stores ----


@contextlib.asynccontextmanager
async def _sqlite_memory(folder: Path) -> AsyncIterator[Any]:
    from memory import SqliteMemory

    folder.mkdir(parents=True, exist_ok=True)
    async with SqliteMemory.open(folder / "memory.db") as mem:
        yield mem


_PG_MEMORY_SCHEMAS: set[str] = set()


@contextlib.asynccontextmanager
async def _postgres_memory(folder: Path) -> AsyncIterator[Any]:
    """PostgresMemory on a schema named after ``folder``: opening the same folder twice (two
    writers, or a reopen) reaches the same store, as two opens of one SQLite file do."""
    from pg import SCHEMA_PREFIX, postgres_dsn

    from memory.postgres import PostgresMemory

    digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:12]
    schema = f"{SCHEMA_PREFIX}{os.getpid()}_mem_{digest}"
    _PG_MEMORY_SCHEMAS.add(schema)
    async with PostgresMemory.open(postgres_dsn(), schema=schema) as mem:
        yield mem


def drop_memory_schemas() -> None:
    """Drop the schemas :func:`_postgres_memory` created (at the end of the session)."""
    if not _PG_MEMORY_SCHEMAS:
        return
    from pg import admin_connection
    from psycopg import sql

    with admin_connection() as conn:
        for schema in sorted(_PG_MEMORY_SCHEMAS):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    _PG_MEMORY_SCHEMAS.clear()


MEMORY_FACTORIES: dict[str, Callable[[Path], contextlib.AbstractAsyncContextManager[Any]]] = {
    "sqlite-memory": _sqlite_memory,
    "postgres-memory": _postgres_memory,
}


def memory_params() -> list[Any]:
    """The memory factories as pytest params (the PostgreSQL one marked ``postgres``)."""
    import pytest

    return [
        pytest.param(name, id=name, marks=[pytest.mark.postgres] if "postgres" in name else [])
        for name in sorted(MEMORY_FACTORIES)
    ]
