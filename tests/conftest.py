"""Shared fixtures: every checkpointer backend available on this machine."""

from __future__ import annotations

import importlib.util
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
    return names


@pytest.fixture(params=_backends())
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseCheckpointer]:
    """A fresh checkpointer of each available backend."""
    if request.param == "memory":
        yield InMemoryCheckpointer()
        return
    from checkpointers import SqliteCheckpointer

    cp = SqliteCheckpointer(tmp_path / "store.db")
    await cp.setup()
    try:
        yield cp
    finally:
        await cp.aclose()
