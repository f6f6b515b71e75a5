"""The PostgreSQL archival store passes the archival contract (one fresh schema per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from pg import fresh_schema, postgres_dsn

pytest.register_assert_rewrite("graphexec.testing.archival_contract")

from graphexec.testing.archival_contract import ArchivalContract  # noqa: E402
from memory import PostgresArchivalStore, PostgresMemory  # noqa: E402
from memory._base import ArchivalStore, Namespace  # noqa: E402

pytestmark = pytest.mark.postgres


class TestPostgresArchival(ArchivalContract):
    @pytest.fixture(params=["standalone", "memory"])
    async def archival(self, request: pytest.FixtureRequest) -> AsyncIterator[ArchivalStore]:
        async with fresh_schema() as schema:
            if request.param == "standalone":
                async with PostgresArchivalStore.open(
                    postgres_dsn(), namespace=("contract",), schema=schema
                ) as store:
                    yield store
            else:
                async with PostgresMemory.open(postgres_dsn(), schema=schema) as mem:
                    yield mem.archival_for(("contract",))

    @pytest.fixture
    def archival_factory(
        self, archival: PostgresArchivalStore
    ) -> Callable[[Namespace], ArchivalStore]:
        return archival.for_namespace
