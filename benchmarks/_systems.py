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

Durability is ``"sync"`` on both (graphexec's default; LangGraph's default is ``"async"``), so
both commit each step's checkpoint before the next step starts.
"""

from __future__ import annotations

import importlib.metadata
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

__all__ = [
    "GRAPHEXEC",
    "LANGGRAPH",
    "API_STYLE",
    "Adapter",
    "GraphexecAdapter",
    "LangGraphAdapter",
    "load_systems",
    "package_version",
]

GRAPHEXEC = "graphexec"
LANGGRAPH = "langgraph"
API_STYLE = (
    "async API (ainvoke) on both sides, one asyncio.run per measured batch; sync node "
    "functions (run in the default thread pool by both); durability='sync' on both"
)


def package_version(name: str) -> str | None:
    """The installed distribution version of ``name``, or ``None``."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class Adapter(ABC):
    """What a workload needs from a library: its builder types, running and history."""

    name: ClassVar[str]
    StateGraph: Any
    START: str
    END: str
    Send: Callable[[str, Any], Any]

    @abstractmethod
    def compile(self, builder: Any, *, checkpointed: bool) -> Any:
        """Compile ``builder``, with a fresh in-memory checkpointer when ``checkpointed``."""

    @abstractmethod
    async def ainvoke(
        self, graph: Any, state: dict[str, Any], *, thread_id: str | None, recursion_limit: int
    ) -> dict[str, Any]:
        """Run ``graph`` once on ``thread_id`` (``None`` for a graph without checkpointer)."""

    @abstractmethod
    async def checkpoint_count(self, graph: Any, thread_id: str) -> int:
        """How many checkpoints the thread's history holds."""

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

    def compile(self, builder: Any, *, checkpointed: bool) -> Any:
        checkpointer = self._mod.InMemoryCheckpointer() if checkpointed else None
        return builder.compile(checkpointer=checkpointer)

    async def ainvoke(
        self, graph: Any, state: dict[str, Any], *, thread_id: str | None, recursion_limit: int
    ) -> dict[str, Any]:
        result: dict[str, Any] = await graph.ainvoke(
            state, thread_id=thread_id, durability="sync", recursion_limit=recursion_limit
        )
        return result

    async def checkpoint_count(self, graph: Any, thread_id: str) -> int:
        return len(await graph.aget_state_history(thread_id))

    def versions(self) -> dict[str, str | None]:
        return {"graphexec": str(self._mod.__version__)}


class LangGraphAdapter(Adapter):
    name = LANGGRAPH

    def __init__(self) -> None:
        # Raises ImportError when LangGraph is not installed; load_systems() handles that.
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send

        self._saver = InMemorySaver
        self.StateGraph = StateGraph
        self.START = START
        self.END = END
        self.Send = Send

    def compile(self, builder: Any, *, checkpointed: bool) -> Any:
        return builder.compile(checkpointer=self._saver() if checkpointed else None)

    async def ainvoke(
        self, graph: Any, state: dict[str, Any], *, thread_id: str | None, recursion_limit: int
    ) -> dict[str, Any]:
        config: dict[str, Any] = {"recursion_limit": recursion_limit}
        if thread_id is None:
            # Without a checkpointer LangGraph warns about durability= and, in 1.2.24,
            # then fails on it (AsyncPregelLoop has no _put_checkpoint_fut); leave it out.
            result: dict[str, Any] = await graph.ainvoke(state, config)
            return result
        config["configurable"] = {"thread_id": thread_id}
        result = await graph.ainvoke(state, config, durability="sync")
        return result

    async def checkpoint_count(self, graph: Any, thread_id: str) -> int:
        config = {"configurable": {"thread_id": thread_id}}
        return len([s async for s in graph.aget_state_history(config)])

    def versions(self) -> dict[str, str | None]:
        return {
            name: package_version(name)
            for name in ("langgraph", "langgraph-checkpoint", "langchain-core")
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
