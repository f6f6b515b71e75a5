"""The systems under test, behind one small adapter so each workload is written once.

Both sides are driven through their async API (``ainvoke``), with node functions written as
plain sync functions. That is the like-for-like choice:

- graphexec's core is async; its sync ``invoke`` is a wrapper that hops to a private
  background event loop on every call. LangGraph has two native loops, and its sync loop runs a
  lone task inline in the caller's thread. Comparing sync APIs would mostly measure that
  difference in plumbing, not the engines.
- In async mode both engines run a sync node in the event loop's default thread pool
  (graphexec ``asyncio.to_thread``, LangGraph ``run_in_executor``), so node dispatch costs the
  same kind of thread hop on both sides.

Both run every case in the same durability mode (``sync`` unless the case says otherwise;
graphexec's default is ``sync``, LangGraph's ``async``).

Stores, per backend (a fresh one for every measured batch):

========  ==============================  =============================================
backend   graphexec                       LangGraph
========  ==============================  =============================================
memory    ``InMemoryCheckpointer``        ``InMemorySaver``
sqlite    ``SqliteCheckpointer(path)``    ``AsyncSqliteSaver`` (langgraph-checkpoint-sqlite)
postgres  ``PostgresCheckpointer(dsn)``   ``AsyncPostgresSaver`` (langgraph-checkpoint-postgres)
========  ==============================  =============================================

Each library keeps its own SQLite settings unless ``--sqlite-synchronous`` forces one: both use
WAL, but graphexec defaults to ``synchronous=NORMAL`` and LangGraph's saver to SQLite's default
``FULL`` (an fsync of the WAL at every commit).

On PostgreSQL, LangGraph's ``AsyncPostgresSaver.from_conn_string`` prepares every statement
(``prepare_threshold=0``), while ``PostgresCheckpointer`` defaults to ``prepare=False``, the
setting that works through any transaction-mode pooler. ``--postgres-prepare`` measures
graphexec with ``prepare=True``, like for like.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

__all__ = [
    "API_STYLE",
    "BACKENDS",
    "DURABILITIES",
    "GRAPHEXEC",
    "LANGGRAPH",
    "Adapter",
    "Durability",
    "GraphexecAdapter",
    "LangGraphAdapter",
    "Location",
    "adapter_by_name",
    "load_systems",
    "package_version",
]

GRAPHEXEC = "graphexec"
LANGGRAPH = "langgraph"
BACKENDS: tuple[str, ...] = ("memory", "sqlite", "postgres")
DURABILITIES: tuple[str, ...] = ("sync", "async", "exit")
Durability = Literal["sync", "async", "exit"]
API_STYLE = (
    "async API (ainvoke) on both sides, one asyncio.run per measured batch; sync node "
    "functions (run in the default thread pool by both; chain-async: async def nodes); the "
    "same durability mode on both"
)


def package_version(name: str) -> str | None:
    """The installed distribution version of ``name``, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True, slots=True)
class Location:
    """Where one batch keeps its checkpoints.

    Attributes:
        backend: ``memory``, ``sqlite`` or ``postgres``.
        path: The SQLite file (``sqlite``).
        dsn: The PostgreSQL connection string (``postgres``).
        synchronous: SQLite ``synchronous`` to force on both systems; ``None`` keeps each
            library's default.
        prepare: Open graphexec's ``PostgresCheckpointer`` with ``prepare=True`` (LangGraph's
            saver always prepares its statements).
    """

    backend: str
    path: Path | None = None
    dsn: str | None = None
    synchronous: str | None = None
    prepare: bool = False


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def error_text(error: BaseException) -> str:
    """``Type: message`` of an error and everything that caused it, joined."""
    return " <- ".join(f"{type(e).__name__}: {e}" for e in _chain(error))


def _postgres_checkpointer() -> Any:
    # Looked up by name: the PostgreSQL checkpointer may not exist in this checkout yet.
    return importlib.import_module("checkpointers").PostgresCheckpointer


class Adapter(ABC):
    """What a workload needs from a library: builder types, stores, running and reading."""

    name: ClassVar[str]
    StateGraph: Any
    START: str
    END: str
    Send: Callable[[str, Any], Any]
    Command: Callable[..., Any]
    interrupt: Callable[[Any], Any]
    add_messages: Any

    @abstractmethod
    def unavailable(self, backend: str) -> str | None:
        """Why this system cannot run on ``backend`` here, or ``None`` if it can."""

    @abstractmethod
    def open_store(self, where: Location) -> contextlib.AbstractAsyncContextManager[Any]:
        """Open (and set up) this system's checkpointer at ``where``; close it on exit."""

    @abstractmethod
    def compile(self, builder: Any, store: Any) -> Any:
        """Compile ``builder`` with ``store`` as checkpointer (``None``: no checkpointer)."""

    @abstractmethod
    async def ainvoke(
        self,
        graph: Any,
        state: Any,
        *,
        thread_id: str | None,
        durability: Durability = "sync",
        recursion_limit: int = 50,
    ) -> dict[str, Any]:
        """Run ``graph`` once on ``thread_id`` (``None`` for a graph without checkpointer).

        ``state`` is an input dict, ``None`` (resume) or a ``Command``.
        """

    @abstractmethod
    async def get_state(self, graph: Any, thread_id: str) -> dict[str, Any]:
        """The thread's latest state values (``aget_state``)."""

    @abstractmethod
    async def history(self, graph: Any, thread_id: str) -> list[Any]:
        """The thread's full history, newest first (``aget_state_history``)."""

    async def checkpoint_count(self, graph: Any, thread_id: str) -> int:
        """How many checkpoints the thread's history holds."""
        return len(await self.history(graph, thread_id))

    @staticmethod
    def content(message: Any) -> str:
        """The text of a chat message, dict or message object."""
        if isinstance(message, Mapping):
            return str(message["content"])
        return str(message.content)

    @abstractmethod
    def versions(self) -> dict[str, str | None]:
        """Installed versions of the packages that make up this system."""


class GraphexecAdapter(Adapter):
    name = GRAPHEXEC

    def __init__(self) -> None:
        import graphexec

        self._mod = graphexec
        self.StateGraph = graphexec.StateGraph
        self.START = graphexec.START
        self.END = graphexec.END
        self.Send = graphexec.Send
        self.Command = graphexec.Command
        self.interrupt = graphexec.interrupt
        self.add_messages = graphexec.add_messages

    def unavailable(self, backend: str) -> str | None:
        if backend == "postgres":
            try:
                _postgres_checkpointer()
            except (ImportError, AttributeError) as e:
                return f"unavailable: checkpointers.PostgresCheckpointer does not import ({e})"
        return None

    @contextlib.asynccontextmanager
    async def open_store(self, where: Location) -> AsyncIterator[Any]:
        if where.backend == "memory":
            yield self._mod.InMemoryCheckpointer()
        elif where.backend == "sqlite":
            from checkpointers import SqliteCheckpointer

            assert where.path is not None
            sync: Any = where.synchronous or "NORMAL"
            async with SqliteCheckpointer.open(where.path, synchronous=sync) as cp:
                yield cp
        elif where.backend == "postgres":
            cp = _postgres_checkpointer()(where.dsn, prepare=where.prepare)
            await cp.setup()
            try:
                yield cp
            finally:
                await cp.aclose()
        else:
            raise ValueError(f"unknown backend {where.backend!r}")

    def compile(self, builder: Any, store: Any) -> Any:
        return builder.compile(checkpointer=store)

    async def ainvoke(
        self,
        graph: Any,
        state: Any,
        *,
        thread_id: str | None,
        durability: Durability = "sync",
        recursion_limit: int = 50,
    ) -> dict[str, Any]:
        result: dict[str, Any] = await graph.ainvoke(
            state, thread_id=thread_id, durability=durability, recursion_limit=recursion_limit
        )
        return result

    async def get_state(self, graph: Any, thread_id: str) -> dict[str, Any]:
        snapshot = await graph.aget_state(thread_id)
        values: dict[str, Any] = snapshot.values
        return values

    async def history(self, graph: Any, thread_id: str) -> list[Any]:
        return list(await graph.aget_state_history(thread_id))

    def versions(self) -> dict[str, str | None]:
        return {
            "graphexec": str(self._mod.__version__),
            "aiosqlite": package_version("aiosqlite"),
            "psycopg": package_version("psycopg"),
        }


class LangGraphAdapter(Adapter):
    name = LANGGRAPH

    def __init__(self) -> None:
        # Raises ImportError when LangGraph is not installed; load_systems() handles that.
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages
        from langgraph.types import Command, Send, interrupt

        self._memory_saver = InMemorySaver
        self.StateGraph = StateGraph
        self.START = START
        self.END = END
        self.Send = Send
        self.Command = Command
        self.interrupt = interrupt
        self.add_messages = add_messages

    def unavailable(self, backend: str) -> str | None:
        module, dist = {
            "memory": ("langgraph.checkpoint.memory", "langgraph"),
            "sqlite": ("langgraph.checkpoint.sqlite.aio", "langgraph-checkpoint-sqlite"),
            "postgres": ("langgraph.checkpoint.postgres.aio", "langgraph-checkpoint-postgres"),
        }[backend]
        try:
            importlib.import_module(module)
        except ImportError as e:
            return f"unavailable: {module} does not import ({e}); pip install {dist}"
        return None

    @contextlib.asynccontextmanager
    async def open_store(self, where: Location) -> AsyncIterator[Any]:
        if where.backend == "memory":
            yield self._memory_saver()
        elif where.backend == "sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(str(where.path)) as saver:
                await saver.setup()
                if where.synchronous is not None:
                    await saver.conn.execute(f"PRAGMA synchronous={where.synchronous}")
                yield saver
        elif where.backend == "postgres":
            aio = importlib.import_module("langgraph.checkpoint.postgres.aio")
            async with aio.AsyncPostgresSaver.from_conn_string(where.dsn) as saver:
                await saver.setup()
                yield saver
        else:
            raise ValueError(f"unknown backend {where.backend!r}")

    def compile(self, builder: Any, store: Any) -> Any:
        return builder.compile(checkpointer=store)

    async def ainvoke(
        self,
        graph: Any,
        state: Any,
        *,
        thread_id: str | None,
        durability: Durability = "sync",
        recursion_limit: int = 50,
    ) -> dict[str, Any]:
        config: dict[str, Any] = {"recursion_limit": recursion_limit}
        if thread_id is None:
            # Without a checkpointer LangGraph warns about durability= and, in 1.2.24,
            # then fails on it (AsyncPregelLoop has no _put_checkpoint_fut); leave it out.
            result: dict[str, Any] = await graph.ainvoke(state, config)
            return result
        config["configurable"] = {"thread_id": thread_id}
        result = await graph.ainvoke(state, config, durability=durability)
        return result

    async def get_state(self, graph: Any, thread_id: str) -> dict[str, Any]:
        snapshot = await graph.aget_state({"configurable": {"thread_id": thread_id}})
        values: dict[str, Any] = snapshot.values
        return values

    async def history(self, graph: Any, thread_id: str) -> list[Any]:
        config = {"configurable": {"thread_id": thread_id}}
        return [s async for s in graph.aget_state_history(config)]

    def versions(self) -> dict[str, str | None]:
        return {
            name: package_version(name)
            for name in (
                "langgraph",
                "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite",
                "langgraph-checkpoint-postgres",
                "langchain-core",
            )
        }


def load_systems(*, compare: bool = True) -> tuple[list[Adapter], str | None]:
    """graphexec, plus LangGraph when wanted and importable.

    Returns:
        The adapters, and why the LangGraph comparison is skipped (``None`` if it runs).
    """
    systems: list[Adapter] = [GraphexecAdapter()]
    if not compare:
        return systems, "disabled with --no-langgraph"
    try:
        systems.append(LangGraphAdapter())
    except ImportError as e:
        return systems, f"langgraph is not importable ({e}); pip install -e '.[bench]'"
    return systems, None


def adapter_by_name(name: str) -> Adapter:
    """A fresh adapter for ``name`` (used by worker processes)."""
    if name == GRAPHEXEC:
        return GraphexecAdapter()
    if name == LANGGRAPH:
        return LangGraphAdapter()
    raise ValueError(f"unknown system {name!r}")
