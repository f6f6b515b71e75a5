"""Durable checkpoint backends for graphexec.

``SqliteCheckpointer`` keeps checkpoints in one SQLite file that several processes can share;
``PostgresCheckpointer`` keeps them in PostgreSQL for many workers on many machines (it needs the
``postgres`` extra, and is imported only when first used); ``Encryption`` adds AES-GCM encryption
at rest to either::

    from checkpointers import SqliteCheckpointer

    async with SqliteCheckpointer.open("runs.db") as cp:
        graph = builder.compile(checkpointer=cp)
        await graph.ainvoke(inputs, thread_id="ticket-42")

Every backend passes :class:`graphexec.testing.CheckpointerContract` unmodified.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from checkpointers._crypto import Encryption
from checkpointers.sqlite import SqliteCheckpointer

if TYPE_CHECKING:
    from checkpointers.postgres import PostgresCheckpointer

__all__ = [
    # backends
    "PostgresCheckpointer",
    "SqliteCheckpointer",
    # encryption at rest
    "Encryption",
]


def __getattr__(name: str) -> Any:
    # psycopg is an optional dependency: import the PostgreSQL backend on first use only.
    if name == "PostgresCheckpointer":
        try:
            from checkpointers.postgres import PostgresCheckpointer
        except ModuleNotFoundError as e:
            if e.name is None or e.name.split(".")[0] not in ("psycopg", "psycopg_pool"):
                raise
            raise ModuleNotFoundError(
                "PostgresCheckpointer needs psycopg 3 with its pool: "
                "pip install 'graphexec[postgres]'",
                name=e.name,
            ) from e
        return PostgresCheckpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
