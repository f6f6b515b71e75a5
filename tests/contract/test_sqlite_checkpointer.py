"""The SQLite backend passes the checkpointer contract, plain and with encryption at rest.

The plain store runs its small writes on the event loop's thread (the default); the encrypted
one with ``loop_writes=False``, so every write path runs the whole contract too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from checkpointers import Encryption, SqliteCheckpointer
from graphexec import BaseCheckpointer
from graphexec.testing import CheckpointerContract


class TestSqlite(CheckpointerContract):
    @pytest.fixture(params=["plain", "encrypted-threads"])
    async def checkpointer(
        self, tmp_path: Path, request: pytest.FixtureRequest
    ) -> AsyncIterator[BaseCheckpointer]:
        encryption = None
        if request.param == "encrypted-threads":
            encryption = Encryption(keys={"k1": bytes(range(32))}, active="k1")
        async with SqliteCheckpointer.open(
            tmp_path / "cp.db", encryption=encryption, loop_writes=encryption is None
        ) as cp:
            yield cp
