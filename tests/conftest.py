"""Shared fixtures: every checkpointer backend available on this machine."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from graphexec import BaseCheckpointer, InMemoryCheckpointer


def _backends() -> list[str]:
    names = ["memory"]
    if importlib.util.find_spec("checkpointers") and importlib.util.find_spec(
        "checkpointers.sqlite"
    ):
        names.append("sqlite")
    if (
        os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN")
        or os.environ.get("GRAPHEXEC_REQUIRE_POSTGRES") == "1"
    ):
        names.append("postgres")
    return names


@pytest.fixture(
    params=[
        pytest.param(n, marks=pytest.mark.postgres) if n == "postgres" else n for n in _backends()
    ]
)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseCheckpointer]:
    """A fresh checkpointer of each available backend."""
    if request.param == "memory":
        yield InMemoryCheckpointer()
        return
    if request.param == "postgres":
        from pg import fresh_schema, postgres_dsn

        from checkpointers.postgres import PostgresCheckpointer

        async with fresh_schema() as schema:
            pg = PostgresCheckpointer(postgres_dsn(), schema=schema)
            await pg.setup()
            try:
                yield pg
            finally:
                await pg.aclose()
        return
    from checkpointers import SqliteCheckpointer

    cp = SqliteCheckpointer(tmp_path / "store.db")
    await cp.setup()
    try:
        yield cp
    finally:
        await cp.aclose()
