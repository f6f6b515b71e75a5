"""The reference backend passes the checkpointer contract."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from graphexec._checkpoint import BaseCheckpointer
from graphexec._inmemory import InMemoryCheckpointer
from graphexec.testing import CheckpointerContract


class TestInMemory(CheckpointerContract):
    @pytest.fixture
    async def checkpointer(self) -> AsyncIterator[BaseCheckpointer]:
        yield InMemoryCheckpointer()
