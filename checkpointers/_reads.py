"""The read side both SQL checkpointers share: the same statements, the same decoding.

SQLite and PostgreSQL run the statements of :mod:`checkpointers._sql` (one per read, whatever
the chain length) and decode them with one :class:`~checkpointers._rows.RowCodec`; they differ
only in how a read statement reaches the database, which each supplies as :meth:`_read`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from checkpointers import _rows
from checkpointers import _sql as sql
from graphexec._checkpoint import Checkpoint, CheckpointTuple, ThreadInfo

__all__ = ["SqlReads"]

_NO_LIMIT = 2**62


class SqlReads:
    """``get``, ``get_since``, ``list``, ``list_tips`` and ``list_threads`` over :meth:`_read`.

    A backend whose rows differ (SQLite's compact ids and parents) overrides the statements and
    :meth:`_key`, keeping the row layout of :mod:`checkpointers._sql`.
    """

    _codec: _rows.RowCodec
    _get_sql: str = sql.GET_CHECKPOINT
    _list_sql: str = sql.LIST_CHECKPOINTS
    _tips_sql: str = sql.LIST_TIPS

    @staticmethod
    def _key(checkpoint_id: str | None) -> Any:
        """A checkpoint id as the backend's statements expect it (here: unchanged)."""
        return checkpoint_id

    @abstractmethod
    async def _read(
        self, op: str, query: str, params: Mapping[str, Any]
    ) -> Sequence[Sequence[Any]]:
        """Run one read statement (``op`` names it in errors) and return its rows."""

    async def get(
        self, thread_id: str, checkpoint_ns: str = "", checkpoint_id: str | None = None
    ) -> CheckpointTuple | None:
        """See :meth:`BaseCheckpointer.get`. One statement, whatever the chain length."""
        return await self._get(thread_id, checkpoint_ns, checkpoint_id, None)

    async def get_since(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, *, known: str
    ) -> CheckpointTuple | None:
        """See :meth:`BaseCheckpointer.get_since`. The same single statement as :meth:`get`."""
        return await self._get(thread_id, checkpoint_ns, checkpoint_id, known)

    async def _get(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str | None, known: str | None
    ) -> CheckpointTuple | None:
        rows = await self._read(
            "get",
            self._get_sql,
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": self._key(checkpoint_id),
                "known": self._key(known),
            },
        )
        return self._codec.checkpoint_tuple(thread_id, checkpoint_ns, rows, known)

    async def list(
        self,
        thread_id: str,
        checkpoint_ns: str = "",
        *,
        limit: int | None = None,
        before: str | None = None,
    ) -> Sequence[Checkpoint]:
        """See :meth:`BaseCheckpointer.list`. One statement (a recursive walk of the branch)."""
        if limit is not None and limit < 1:
            return []
        rows = await self._read(
            "list",
            self._list_sql,
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "before": self._key(before),
                "limit": _NO_LIMIT if limit is None else limit,
            },
        )
        found, _ = self._codec.checkpoints_from_rows(thread_id, checkpoint_ns, rows)
        return [cp for _, cp in found]

    async def list_tips(self, thread_id: str, checkpoint_ns: str = "") -> Sequence[Checkpoint]:
        """See :meth:`BaseCheckpointer.list_tips`."""
        rows = await self._read(
            "list_tips", self._tips_sql, {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns}
        )
        found, _ = self._codec.checkpoints_from_rows(thread_id, checkpoint_ns, rows)
        tips = [cp for _, cp in found]
        return sorted(tips, key=lambda c: (c.created_at, c.checkpoint_id), reverse=True)

    async def list_threads(self) -> Sequence[ThreadInfo]:
        """See :meth:`BaseCheckpointer.list_threads`."""
        rows = await self._read("list_threads", sql.LIST_THREADS, {})
        return [
            ThreadInfo(
                thread_id=thread_id,
                head_id=_rows.id_text(head_id),
                step=step,
                updated_at=_rows.from_micros(created_at),
                next_nodes=_rows.json_tuple(next_nodes),
                checkpoints=count,
            )
            for thread_id, head_id, step, created_at, next_nodes, count in rows
        ]
