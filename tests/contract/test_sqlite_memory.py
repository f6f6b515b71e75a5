"""The SQLite memory tiers pass the memory contract suites, on a file and in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

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
    RecallStore,
    SqliteMemory,
    SqliteSession,
)


class Harness:
    """One SqliteMemory under test, reopenable when it lives in a file."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.mem = SqliteMemory(path)
        self.others: list[SqliteMemory] = []

    async def reopen(self) -> SqliteMemory:
        await self.mem.aclose()
        self.mem = SqliteMemory(self.path)
        await self.mem.setup()
        return self.mem

    def reopener(self, pick: Callable[[SqliteMemory], object]) -> Reopen | None:
        if self.path is None:
            return None

        async def reopen() -> object:
            return pick(await self.reopen())

        return reopen

    def another(self) -> SqliteMemory:
        """A second SqliteMemory on the same file (its own connections)."""
        other = SqliteMemory(self.path)
        self.others.append(other)
        return other

    async def aclose(self) -> None:
        for other in self.others:
            await other.aclose()
        await self.mem.aclose()


@pytest.fixture(params=["file", "in-memory"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "memory.db" if request.param == "file" else None)
    await h.mem.setup()
    try:
        yield h
    finally:
        await h.aclose()


class TestSqliteSession(SessionContract):
    @pytest.fixture
    def session_factory(self, harness: Harness) -> SessionFactory:
        return lambda sid: harness.mem.session(sid)

    @pytest.fixture
    def reopen_sessions(self, harness: Harness) -> Reopen | None:
        return harness.reopener(lambda mem: mem.session)


class TestStandaloneSqliteSession(SessionContract):
    """``SqliteSession(session_id, path)`` objects, each with its own connections."""

    @pytest.fixture
    async def opened(self) -> AsyncIterator[list[SqliteSession]]:
        sessions: list[SqliteSession] = []
        try:
            yield sessions
        finally:
            for session in sessions:
                await session.aclose()

    @pytest.fixture
    def session_factory(self, tmp_path: Path, opened: list[SqliteSession]) -> SessionFactory:
        def make(sid: str) -> SqliteSession:
            session = SqliteSession(sid, tmp_path / "sessions.db")
            opened.append(session)
            return session

        return make

    @pytest.fixture
    def reopen_sessions(
        self, session_factory: SessionFactory, opened: list[SqliteSession]
    ) -> Reopen:
        async def reopen() -> SessionFactory:
            for session in opened:
                await session.aclose()
            opened.clear()
            return session_factory

        return reopen


class TestSqliteFactStore(FactStoreContract):
    @pytest.fixture
    def facts(self, harness: Harness) -> FactStore:
        return harness.mem.facts

    @pytest.fixture
    def reopen_facts(self, harness: Harness) -> Reopen | None:
        return harness.reopener(lambda mem: mem.facts)


class TestSqliteBlockStore(BlockStoreContract):
    @pytest.fixture
    def blocks(self, harness: Harness) -> BlockStore:
        return harness.mem.blocks

    @pytest.fixture
    def blocks_view(self, harness: Harness) -> BlockStore:
        if harness.path is None:
            return harness.mem.blocks_for(())
        return harness.another().blocks

    @pytest.fixture
    def blocks_for(self, harness: Harness) -> BlockStoreFactory:
        return harness.mem.blocks_for

    @pytest.fixture
    def reopen_blocks(self, harness: Harness) -> Reopen | None:
        return harness.reopener(lambda mem: mem.blocks)


class TestSqliteRecall(RecallContract):
    @pytest.fixture
    def recall(self, harness: Harness) -> RecallStore:
        return harness.mem.recall

    @pytest.fixture
    def session_factory(self, harness: Harness) -> SessionFactory:
        return lambda sid: harness.mem.session(sid)
