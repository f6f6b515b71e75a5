"""Durable checkpoint backends for graphexec.

``SqliteCheckpointer`` keeps checkpoints in one SQLite file that several processes can share;
``Encryption`` adds AES-GCM encryption at rest to it::

    from checkpointers import SqliteCheckpointer

    async with SqliteCheckpointer.open("runs.db") as cp:
        graph = builder.compile(checkpointer=cp)
        await graph.ainvoke(inputs, thread_id="ticket-42")

Every backend passes :class:`graphexec.testing.CheckpointerContract` unmodified.
"""

from __future__ import annotations

from checkpointers._crypto import Encryption
from checkpointers.sqlite import SqliteCheckpointer

__all__ = [
    # backends
    "SqliteCheckpointer",
    # encryption at rest
    "Encryption",
]
