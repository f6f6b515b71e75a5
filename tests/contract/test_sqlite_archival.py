"""The SQLite archival store passes the archival contract, on a file and in memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

# Plain asserts in the suite should report values as they do in test files.
pytest.register_assert_rewrite("graphexec.testing.archival_contract")

from graphexec.testing.archival_contract import ArchivalContract  # noqa: E402
from memory._base import ArchivalStore, Namespace  # noqa: E402
from memory._sqlite_archival import SqliteArchivalStore  # noqa: E402


class TestSqliteArchival(ArchivalContract):
    @pytest.fixture(params=["file", "memory"])
    async def archival(
        self, tmp_path: Path, request: pytest.FixtureRequest
    ) -> AsyncIterator[SqliteArchivalStore]:
        path = tmp_path / "memory.db" if request.param == "file" else None
        async with SqliteArchivalStore.open(path, namespace=("contract",)) as store:
            yield store

    @pytest.fixture
    def archival_factory(
        self, archival: SqliteArchivalStore
    ) -> Callable[[Namespace], ArchivalStore]:
        return archival.for_namespace
