"""The PostgreSQL backend passes the checkpointer contract, plain and with encryption at rest."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pg import fresh_schema, postgres_dsn

from checkpointers import Encryption, PostgresCheckpointer
from graphexec import BaseCheckpointer
from graphexec.testing import CheckpointerContract

pytestmark = pytest.mark.postgres


class TestPostgres(CheckpointerContract):
    @pytest.fixture(params=["plain", "encrypted"])
    async def checkpointer(self, request: pytest.FixtureRequest) -> AsyncIterator[BaseCheckpointer]:
        encryption = None
        if request.param == "encrypted":
            encryption = Encryption(keys={"k1": bytes(range(32))}, active="k1")
        async with (
            fresh_schema() as schema,
            PostgresCheckpointer.open(postgres_dsn(), schema=schema, encryption=encryption) as cp,
        ):
            yield cp
