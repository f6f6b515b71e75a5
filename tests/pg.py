"""Shared helpers for tests against a real PostgreSQL server (not a test module).

The server comes from ``GRAPHEXEC_TEST_POSTGRES_DSN`` (``eval "$(scripts/pg-test-env)"`` starts
the local one and prints it). Without it, or when it does not answer, Postgres tests skip with
the reason -- unless ``GRAPHEXEC_REQUIRE_POSTGRES=1`` (set by the test command in CI), where they
fail instead, so they can never skip silently there.

Isolation: every test gets its own schema (:func:`fresh_schema`, a unique name, dropped
afterwards) and passes it as ``schema=`` to the store under test, so tests, test modules and
concurrent test runs against the same database never see each other's rows. Use them from a
test module like this (mark the module with ``pytestmark = pytest.mark.postgres``)::

    from pg import fresh_schema, postgres_dsn

    @pytest.fixture
    async def schema() -> AsyncIterator[str]:
        async with fresh_schema() as name:
            yield name
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

__all__ = [
    "DSN_VARIABLE",
    "REQUIRE_VARIABLE",
    "SCHEMA_PREFIX",
    "admin_connection",
    "fresh_schema",
    "postgres_dsn",
    "schema_dsn",
]

DSN_VARIABLE = "GRAPHEXEC_TEST_POSTGRES_DSN"
REQUIRE_VARIABLE = "GRAPHEXEC_REQUIRE_POSTGRES"
SCHEMA_PREFIX = "gxtest_"

_checked: dict[str, str | None] = {}  # dsn -> why it cannot be used (None: it can)


def _unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(f"{REQUIRE_VARIABLE}=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def postgres_dsn() -> str:
    """The test server's DSN; skips (or fails, when required) if there is none or it is down."""
    dsn = os.environ.get(DSN_VARIABLE, "").strip()
    if not dsn:
        _unavailable(f'{DSN_VARIABLE} is not set (run: eval "$(scripts/pg-test-env)")')
    if dsn not in _checked:
        try:
            with psycopg.connect(dsn, connect_timeout=5, autocommit=True) as conn:
                conn.execute("SELECT 1")
            _checked[dsn] = None
        except psycopg.Error as e:
            _checked[dsn] = f"the PostgreSQL server of {DSN_VARIABLE} does not answer: {e}"
    reason = _checked[dsn]
    if reason is not None:
        _unavailable(reason)
    return dsn


@contextlib.contextmanager
def admin_connection() -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A plain autocommit connection to the test server, to look behind a store's back."""
    with psycopg.connect(postgres_dsn(), autocommit=True) as conn:
        yield conn


@contextlib.asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    """A unique schema name for one test (not created: the store creates it); dropped after."""
    dsn = postgres_dsn()
    name = f"{SCHEMA_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def schema_dsn(schema: str) -> str:
    """The test DSN with ``schema`` as its ``search_path`` (for code that takes only a DSN)."""
    dsn = postgres_dsn()
    if "://" in dsn:
        option = urllib.parse.quote(f"-csearch_path={schema}")
        return dsn + ("&" if "?" in dsn else "?") + f"options={option}"
    return f"{dsn} options=-csearch_path={schema}"
