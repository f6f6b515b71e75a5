"""Backend factory of the reliability battery: a SQLite file or a PostgreSQL schema (not a test).

A :class:`Backend` names one fresh store. The parent opens it with :meth:`Backend.open`; a worker
process gets :attr:`Backend.spec` (JSON) and opens the same store with :func:`open_spec`.
"""

from __future__ import annotations

import contextlib
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


MEMORY_FACTORIES: dict[str, Callable[[Path], contextlib.AbstractAsyncContextManager[Any]]] = {
    "sqlite-memory": _sqlite_memory,
    # TODO(merge): add "postgres-memory": _postgres_memory (memory.postgres.PostgresMemory on a
    # fresh schema, marked postgres) once the PostgresMemory branch is merged.
}
