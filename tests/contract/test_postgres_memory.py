"""The PostgreSQL memory tiers pass the memory contract suites (one fresh schema per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
from pg import fresh_schema, postgres_dsn

pytest.register_assert_rewrite("graphexec.testing.memory_contracts")

from graphexec.testing.memory_contracts import (  # noqa: E402 - after register_assert_rewrite
    BlockStoreContract,
    BlockStoreFactory,
    FactStoreContract,
    RecallContract,
    Reopen,
    SessionContract,
    SessionFactory,
)
from memory import (  # noqa: E402
    BlockStore,
    FactStore,
    PostgresMemory,
    PostgresSession,
    RecallStore,
)

pytestmark = pytest.mark.postgres


class Harness:
    """One PostgresMemory under test on its own schema, reopenable."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.mem = PostgresMemory(postgres_dsn(), schema=schema)
        self.others: list[PostgresMemory] = []

    async def reopen(self) -> PostgresMemory:
        await self.mem.aclose()
        self.mem = PostgresMemory(postgres_dsn(), schema=self.schema)
        await self.mem.setup()
        return self.mem

    def reopener(self, pick: Callable[[PostgresMemory], object]) -> Reopen:
        async def reopen() -> object:
            return pick(await self.reopen())

        return reopen

    def another(self) -> PostgresMemory:
        """A second PostgresMemory on the same schema (its own pool)."""
        other = PostgresMemory(postgres_dsn(), schema=self.schema)
        self.others.append(other)
        return other

    async def aclose(self) -> None:
        for other in self.others:
            await other.aclose()
        await self.mem.aclose()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with fresh_schema() as schema:
        h = Harness(schema)
        await h.mem.setup()
        try:
            yield h
        finally:
            await h.aclose()


class TestPostgresSession(SessionContract):
    @pytest.fixture
    def session_factory(self, harness: Harness) -> SessionFactory:
        return lambda sid: harness.mem.session(sid)

    @pytest.fixture
    def reopen_sessions(self, harness: Harness) -> Reopen:
        return harness.reopener(lambda mem: mem.session)


class TestStandalonePostgresSession(SessionContract):
    """``PostgresSession(session_id, dsn)`` objects, each with its own pool."""

    @pytest.fixture
    async def opened(self) -> AsyncIterator[tuple[str, list[PostgresSession]]]:
        sessions: list[PostgresSession] = []
        async with fresh_schema() as schema:
            try:
                yield schema, sessions
            finally:
                for session in sessions:
                    await session.aclose()

    @pytest.fixture
    def session_factory(self, opened: tuple[str, list[PostgresSession]]) -> SessionFactory:
        schema, sessions = opened

        def make(sid: str) -> PostgresSession:
            session = PostgresSession(sid, postgres_dsn(), schema=schema, pool_max=2)
            sessions.append(session)
            return session

        return make

    @pytest.fixture
    def reopen_sessions(
        self, session_factory: SessionFactory, opened: tuple[str, list[PostgresSession]]
    ) -> Reopen:
        async def reopen() -> SessionFactory:
            for session in opened[1]:
                await session.aclose()
            opened[1].clear()
            return session_factory

        return reopen


class TestPostgresFactStore(FactStoreContract):
    @pytest.fixture
    def facts(self, harness: Harness) -> FactStore:
        return harness.mem.facts

    @pytest.fixture
    def reopen_facts(self, harness: Harness) -> Reopen:
        return harness.reopener(lambda mem: mem.facts)


class TestPostgresBlockStore(BlockStoreContract):
    @pytest.fixture
    def blocks(self, harness: Harness) -> BlockStore:
        return harness.mem.blocks

    @pytest.fixture
    def blocks_view(self, harness: Harness) -> BlockStore:
        return harness.another().blocks

    @pytest.fixture
    def blocks_for(self, harness: Harness) -> BlockStoreFactory:
        return harness.mem.blocks_for

    @pytest.fixture
    def reopen_blocks(self, harness: Harness) -> Reopen:
        return harness.reopener(lambda mem: mem.blocks)


class TestPostgresRecall(RecallContract):
    @pytest.fixture
    def recall(self, harness: Harness) -> RecallStore:
        return harness.mem.recall

    @pytest.fixture
    def session_factory(self, harness: Harness) -> SessionFactory:
        return lambda sid: harness.mem.session(sid)
