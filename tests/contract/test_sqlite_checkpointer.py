"""The SQLite backend passes the checkpointer contract, plain and with encryption at rest."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import BaseCheckpointer
from graphexec.testing import CheckpointerContract


class TestSqlite(CheckpointerContract):
    @pytest.fixture(params=["plain", "encrypted"])
    async def checkpointer(
        self, tmp_path: Path, request: pytest.FixtureRequest
    ) -> AsyncIterator[BaseCheckpointer]:
        encryption = None
        if request.param == "encrypted":
            encryption = Encryption(keys={"k1": bytes(range(32))}, active="k1")
        async with SqliteCheckpointer.open(tmp_path / "cp.db", encryption=encryption) as cp:
            yield cp
