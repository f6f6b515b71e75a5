"""The workloads. Each builds the same graph on every system through its adapter.

Threads run one after another (one ``ainvoke`` at a time) so the figures are per-run latency,
not throughput under concurrency (the ``concurrency`` workload measures that). Every batch gets
a fresh store (a new file, a new database) from :meth:`Env.storage`; setting it up, building the
graph and generating content are not timed.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
import os
import random
import statistics
import string
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, TypedDict

from benchmarks._backends import NO_BACKEND, Env, Storage
from benchmarks._core import BenchmarkError, Metric, Sample, Timer, Workload, register
from benchmarks._systems import (
    BACKENDS,
    DURABILITIES,
    GRAPHEXEC,
    Adapter,
    Durability,
    error_text,
)

if TYPE_CHECKING:
    from graphexec import Checkpoint

__all__ = [
    "ChainAsyncNodes",
    "ChainNoCheckpointer",
    "ChainWorkload",
    "ChatLongWorkload",
    "ChatWorkload",
    "CrashWorkload",
    "FanoutWorkload",
    "FloorWorkload",
    "HistoryWorkload",
    "InterruptWorkload",
    "LoopWorkload",
    "build_chain",
    "build_loop",
    "opened",
    "run_chain",
]

PERSISTENT = ("sqlite", "postgres")


def thread_ids(count: int) -> list[str]:
    # Fresh ids per batch, although every batch also gets a fresh store.
    prefix = uuid.uuid4().hex[:8]
    return [f"{prefix}-{i}" for i in range(count)]


def check(system: Adapter, ok: bool, what: str) -> None:
    if not ok:
        raise BenchmarkError(f"{system.name}: {what}")


@contextlib.asynccontextmanager
async def opened(system: Adapter, env: Env, tag: str) -> AsyncIterator[tuple[Storage, Any]]:
    """A fresh location for the batch and ``system``'s store opened on it (``None`` without)."""
    async with env.storage(tag) as storage:
        if env.backend == NO_BACKEND:
            yield storage, None
            return
        async with system.open_store(storage.where) as store:
            yield storage, store


async def _disk(storage: Storage, raw: int, sample: Sample) -> None:
    """Add ``disk_kib`` and ``disk_ratio`` (bytes on disk / raw content bytes) on disk backends."""
    size = await storage.bytes_on_disk()
    if size is not None:
        sample.metrics["disk_kib"] = size / 1024
        sample.metrics["disk_ratio"] = size / raw
        sample.info["raw content KiB"] = round(raw / 1024)


DISK_METRICS = (
    Metric("disk_kib", "KiB on disk", digits=0),
    Metric("disk_ratio", "bytes on disk / raw content", digits=2),
)


async def median_ms(call: Callable[[], Awaitable[Any]], times: int) -> float:
    """Median milliseconds of ``times`` calls."""
    out = []
    for _ in range(times):
        start = time.perf_counter()
        await call()
        out.append((time.perf_counter() - start) * 1000)
    return statistics.median(out)


# -- chain ----------------------------------------------------------------------------------


class ChainState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def _chain_node(label: str) -> Callable[[ChainState], dict[str, Any]]:
    def node(state: ChainState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [label]}

    return node


def _async_chain_node(label: str) -> Callable[[ChainState], Awaitable[dict[str, Any]]]:
    async def node(state: ChainState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [label]}

    return node


def build_chain(system: Adapter, store: Any, nodes: int = 10, *, async_nodes: bool = False) -> Any:
    """A linear chain of ``nodes`` nodes, each incrementing ``n`` and appending to ``log``.

    With ``async_nodes`` the nodes are ``async def``: both engines then run them on the event
    loop, without the thread-pool hop a sync node costs.
    """
    builder = system.StateGraph(ChainState)
    names = [f"step_{i}" for i in range(nodes)]
    make = _async_chain_node if async_nodes else _chain_node
    for name in names:
        builder.add_node(name, make(name))
    builder.add_edge(system.START, names[0])
    for a, b in itertools.pairwise(names):
        builder.add_edge(a, b)
    builder.add_edge(names[-1], system.END)
    return system.compile(builder, store)


async def run_chain(
    system: Adapter,
    graph: Any,
    ids: Sequence[str | None],
    durability: Durability,
    nodes: int = 10,
) -> float:
    """Run the chain once per thread id; return the seconds it took (checked)."""
    out: dict[str, Any] = {}
    with Timer() as timer:
        for thread_id in ids:
            out = await system.ainvoke(
                graph, {"n": 0, "log": []}, thread_id=thread_id, durability=durability
            )
    check(
        system,
        out.get("n") == nodes and len(out.get("log", ())) == nodes,
        f"chain ended with n={out.get('n')!r}, {len(out.get('log', ()))} log entries",
    )
    return timer.seconds


@register
class ChainWorkload(Workload):
    name = "chain"
    summary = "10-node linear chain, one invoke per fresh thread"
    metrics = (Metric("ms_per_step", "ms / node step"),)
    durabilities = DURABILITIES
    nodes = 10
    async_nodes = False

    def params(self) -> dict[str, Any]:
        return {
            "threads": 20 if self.quick else 200,
            "nodes": self.nodes,
            "node functions": "async def" if self.async_nodes else "def (thread pool)",
        }

    async def measure(self, system: Adapter, env: Env) -> Sample:
        threads = self.params()["threads"]
        async with opened(system, env, self.name) as (_, store):
            graph = build_chain(system, store, self.nodes, async_nodes=self.async_nodes)
            ids: list[str | None] = [None] * threads
            if store is not None:
                ids = list(thread_ids(threads))
            seconds = await run_chain(system, graph, ids, env.durability, self.nodes)
            sample = Sample({"ms_per_step": seconds * 1000 / (threads * self.nodes)})
            if store is not None:
                last = ids[-1]
                assert last is not None
                sample.info["checkpoints / run"] = await system.checkpoint_count(graph, last)
        return sample


@register
class ChainNoCheckpointer(ChainWorkload):
    name = "chain-nockpt"
    summary = "the chain workload without a checkpointer: engine overhead plus the node hop"
    backends = (NO_BACKEND,)
    durabilities = ("sync",)


@register
class ChainAsyncNodes(ChainWorkload):
    name = "chain-async"
    summary = (
        "the chain workload with async def nodes (no thread-pool hop per node, so the engines' "
        "own per-step overhead shows); with and without a checkpointer"
    )
    backends = (NO_BACKEND, *BACKENDS)
    durabilities = ("sync",)
    async_nodes = True


# -- loop -----------------------------------------------------------------------------------


class LoopState(TypedDict):
    msgs: Annotated[list[str], operator.add]


def message(k: int, size: int = 200) -> str:
    """The ``k``-th loop message, ``size`` ASCII bytes."""
    return f"message {k:06d} ".ljust(size, ".")


def build_loop(
    system: Adapter, store: Any, steps: int, *, every: int | None = None, size: int = 200
) -> tuple[Any, list[float]]:
    """One node looping on itself, appending a ``size``-byte message per step, until ``steps``
    messages (or, with ``every``, until the count is a multiple of ``every``: the run stops
    there and a new invoke with ``{"msgs": []}`` continues it).

    Returns:
        The graph and the list the node appends its start time to.
    """
    stamps: list[float] = []

    # Each step's time is the gap between consecutive node starts: the node, the engine's step
    # and checkpoint, and the dispatch of the next node. Recorded outside the state so both
    # systems see identical graphs.
    def step(state: LoopState) -> dict[str, Any]:
        stamps.append(time.perf_counter())
        return {"msgs": [message(len(state["msgs"]), size)]}

    def route(state: LoopState) -> str:
        n = len(state["msgs"])
        if n >= steps or (every is not None and n % every == 0):
            return str(system.END)
        return "step"

    builder = system.StateGraph(LoopState)
    builder.add_node("step", step)
    builder.add_edge(system.START, "step")
    builder.add_conditional_edges("step", route, ["step", system.END])
    return system.compile(builder, store), stamps


def check_loop(system: Adapter, out: dict[str, Any], steps: int, size: int = 200) -> None:
    msgs = out.get("msgs", [])
    check(
        system,
        len(msgs) == steps and msgs[-1] == message(steps - 1, size),
        f"the loop kept {len(msgs)} messages, expected {steps}",
    )


@register
class LoopWorkload(Workload):
    name = "loop"
    summary = (
        "one thread, one node looping on itself via a conditional edge, appending a "
        "~200-byte message per step to an operator.add list"
    )
    metrics = (
        Metric("total_ms", "total ms", digits=1),
        Metric("first_decile_ms", "ms / step, first decile"),
        Metric("last_decile_ms", "ms / step, last decile"),
        Metric("growth", "growth (last / first decile)", compare=False, digits=2),
        Metric("growth_median", "growth of decile medians", compare=False, digits=2),
        *DISK_METRICS,
    )
    durabilities = DURABILITIES
    payload = 200

    def params(self) -> dict[str, Any]:
        return {"steps": 200 if self.quick else 1000, "message_bytes": self.payload}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        steps = self.params()["steps"]
        async with opened(system, env, self.name) as (storage, store):
            graph, stamps = build_loop(system, store, steps, size=self.payload)
            (thread_id,) = thread_ids(1)
            with Timer() as timer:
                out = await system.ainvoke(
                    graph,
                    {"msgs": []},
                    thread_id=thread_id,
                    durability=env.durability,
                    recursion_limit=steps + 10,
                )
            check_loop(system, out, steps, self.payload)
            check(system, len(stamps) == steps, f"the loop ran {len(stamps)} steps")
            gaps = [b - a for a, b in itertools.pairwise(stamps)]
            decile = max(1, len(gaps) // 10)
            first = sum(gaps[:decile]) / decile * 1000
            last = sum(gaps[-decile:]) / decile * 1000
            # Means count rare slow steps, such as SQLite's WAL checkpoint (3-5 ms about every
            # 190th commit): whether one falls in a decile swings its mean by ~0.04 ms. The
            # medians show the trend alone.
            median_growth = statistics.median(gaps[-decile:]) / statistics.median(gaps[:decile])
            sample = Sample(
                {
                    "total_ms": timer.seconds * 1000,
                    "first_decile_ms": first,
                    "last_decile_ms": last,
                    "growth": last / first,
                    "growth_median": median_growth,
                },
                {"checkpoints / run": await system.checkpoint_count(graph, thread_id)},
            )
            await _disk(storage, steps * self.payload, sample)
        return sample


# -- fanout ---------------------------------------------------------------------------------


class FanState(TypedDict):
    results: Annotated[list[int], operator.add]


def _fan(state: FanState) -> dict[str, Any]:
    return {}


def _worker(i: int) -> dict[str, Any]:
    return {"results": [i * i]}


def _join(state: FanState) -> dict[str, Any]:
    return {}


@register
class FanoutWorkload(Workload):
    name = "fanout"
    summary = (
        "a conditional edge returns 64 Send('worker', i); workers append i*i to an "
        "operator.add list; then a join node"
    )
    metrics = (Metric("ms_per_run", "ms / run"),)
    durabilities = DURABILITIES
    sends = 64

    def params(self) -> dict[str, Any]:
        return {"threads": 10 if self.quick else 50, "sends": self.sends}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        threads = self.params()["threads"]
        sends = self.sends
        send = system.Send

        def scatter(state: FanState) -> list[Any]:
            return [send("worker", i) for i in range(sends)]

        async with opened(system, env, self.name) as (_, store):
            builder = system.StateGraph(FanState)
            builder.add_node("fan", _fan)
            builder.add_node("worker", _worker)
            builder.add_node("join", _join)
            builder.add_edge(system.START, "fan")
            builder.add_conditional_edges("fan", scatter, ["worker"])
            builder.add_edge("worker", "join")
            builder.add_edge("join", system.END)
            graph = system.compile(builder, store)
            ids = thread_ids(threads)
            outs: list[dict[str, Any]] = []
            with Timer() as timer:
                for thread_id in ids:
                    outs.append(
                        await system.ainvoke(
                            graph, {"results": []}, thread_id=thread_id, durability=env.durability
                        )
                    )
            expected = [i * i for i in range(sends)]
            results = [out.get("results", []) for out in outs]
            check(
                system,
                all(sorted(r) == expected for r in results),
                "fanout lost or duplicated worker results",
            )
            in_order = sum(r == expected for r in results)
            # graphexec promises Send order whatever order workers finish in; LangGraph's order
            # is reported, not required.
            if system.name == GRAPHEXEC:
                check(
                    system,
                    in_order == threads,
                    f"results were out of Send order in {threads - in_order} of {threads} runs",
                )
            return Sample(
                {"ms_per_run": timer.seconds * 1000 / threads},
                {
                    "results in Send order": f"{in_order}/{threads} runs",
                    "checkpoints / run": await system.checkpoint_count(graph, ids[-1]),
                },
            )


# -- chat -----------------------------------------------------------------------------------

_ALPHABET = string.ascii_letters + string.digits + " " * 10


def _texts(count: int, size: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(_ALPHABET, k=size)) for _ in range(count)]


@register
class ChatWorkload(Workload):
    name = "chat"
    summary = (
        "one thread, one invoke per turn: the input adds a ~1 KB user message and the node a "
        "~1 KB assistant message to an add_messages list (dict messages)"
    )
    metrics = (
        Metric("turn_early_ms", "ms / turn, turns 6-15"),
        Metric("turn_late_ms", "ms / turn, last 10 turns"),
        Metric("turn_growth", "turn growth (last / turns 6-15)", compare=False, digits=2),
        Metric("read_early_ms", "aget_state ms at turn 10"),
        Metric("read_late_ms", "aget_state ms at last turn"),
        Metric("read_growth", "read growth (last / turn 10)", compare=False, digits=2),
        Metric("total_ms", "total ms (all turns)", digits=1),
        *DISK_METRICS,
    )
    durabilities = DURABILITIES
    message_bytes = 1000

    def turns(self) -> int:
        return 50 if self.quick else 200

    def params(self) -> dict[str, Any]:
        return {"turns": self.turns(), "bytes_per_turn": 2 * self.message_bytes}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        turns = self.turns()
        size = self.message_bytes
        users = _texts(turns, size, seed=1)
        replies = _texts(turns, size, seed=2)
        raw = sum(len(t.encode()) for t in users + replies)
        # Functional form: each system has its own reducer, and class syntax would leave the
        # annotation a string naming a local variable (from __future__ import annotations).
        ChatState = TypedDict(  # noqa: UP013
            "ChatState", {"messages": Annotated[list[Any], system.add_messages]}
        )

        def assistant(state: Any) -> dict[str, Any]:
            turn = len(state["messages"]) // 2
            return {"messages": [{"role": "assistant", "content": replies[turn]}]}

        early = range(5, 15)  # turns 6-15 (0-based)
        late = range(turns - 10, turns)
        async with opened(system, env, self.name) as (storage, store):
            builder = system.StateGraph(ChatState)
            builder.add_node("assistant", assistant)
            builder.add_edge(system.START, "assistant")
            builder.add_edge("assistant", system.END)
            graph = system.compile(builder, store)
            (thread_id,) = thread_ids(1)
            times: list[float] = []
            reads: dict[str, float] = {}

            async def read() -> None:
                await system.get_state(graph, thread_id)

            out: dict[str, Any] = {}
            gc.collect()
            for turn in range(turns):
                start = time.perf_counter()
                out = await system.ainvoke(
                    graph,
                    {"messages": [{"role": "user", "content": users[turn]}]},
                    thread_id=thread_id,
                    durability=env.durability,
                )
                times.append((time.perf_counter() - start) * 1000)
                if turn + 1 == 10:
                    reads["early"] = await median_ms(read, 11)
            reads["late"] = await median_ms(read, 11)
            msgs = out.get("messages", [])
            check(
                system,
                len(msgs) == 2 * turns
                and system.content(msgs[-1]) == replies[-1]
                and system.content(msgs[-2]) == users[-1],
                f"chat kept {len(msgs)} messages, expected {2 * turns}",
            )
            state = await system.get_state(graph, thread_id)
            check(system, len(state["messages"]) == 2 * turns, "aget_state lost messages")
            turn_early = statistics.median(times[i] for i in early)
            turn_late = statistics.median(times[i] for i in late)
            sample = Sample(
                {
                    "turn_early_ms": turn_early,
                    "turn_late_ms": turn_late,
                    "turn_growth": turn_late / turn_early,
                    "read_early_ms": reads["early"],
                    "read_late_ms": reads["late"],
                    "read_growth": reads["late"] / reads["early"],
                    "total_ms": sum(times),
                },
                {"checkpoints": await system.checkpoint_count(graph, thread_id)},
            )
            await _disk(storage, raw, sample)
        return sample


@register
class ChatLongWorkload(ChatWorkload):
    name = "chat-long"
    summary = "the chat workload over 500 turns (not part of --quick)"
    durabilities = ("sync",)
    max_rounds = 3
    in_quick = False

    def turns(self) -> int:
        return 500


# -- history --------------------------------------------------------------------------------


@register
class HistoryWorkload(Workload):
    name = "history"
    summary = (
        "after the loop workload's run (untimed): read the latest state, list the full "
        "history, and resume the finished thread (invoke with no input)"
    )
    metrics = (
        Metric("read_ms", "aget_state ms"),
        Metric("history_ms", "full history ms", digits=1),
        Metric("resume_ms", "resume at the end ms"),
    )

    def params(self) -> dict[str, Any]:
        return {"steps": 200 if self.quick else 1000, "message_bytes": 200}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        steps = self.params()["steps"]
        async with opened(system, env, self.name) as (_, store):
            graph, _ = build_loop(system, store, steps)
            (thread_id,) = thread_ids(1)
            await system.ainvoke(
                graph, {"msgs": []}, thread_id=thread_id, recursion_limit=steps + 10
            )
            states: list[Any] = []
            outs: list[dict[str, Any]] = []

            async def read() -> None:
                check_loop(system, await system.get_state(graph, thread_id), steps)

            async def history() -> None:
                states[:] = await system.history(graph, thread_id)

            async def resume() -> None:
                outs.append(await system.ainvoke(graph, None, thread_id=thread_id))

            read_ms = await median_ms(read, 11)
            history_ms = await median_ms(history, 3)
            resume_ms = await median_ms(resume, 3)
            for out in outs:
                check_loop(system, out, steps)
            check(system, len(states) >= steps, f"history has {len(states)} states")
            return Sample(
                {"read_ms": read_ms, "history_ms": history_ms, "resume_ms": resume_ms},
                {"states in history": len(states)},
            )


# -- interrupt ------------------------------------------------------------------------------


class AskState(TypedDict):
    question: str
    answer: str


@register
class InterruptWorkload(Workload):
    name = "interrupt"
    summary = (
        "one node calls interrupt(); the round trip is the invoke that stops there plus the "
        "invoke with Command(resume=...) that finishes the thread; one fresh thread each"
    )
    metrics = (Metric("ms_per_round_trip", "ms / round trip"),)
    durabilities = DURABILITIES

    def params(self) -> dict[str, Any]:
        return {"threads": 20 if self.quick else 100}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        threads = self.params()["threads"]
        ask_human = system.interrupt

        def ask(state: AskState) -> dict[str, Any]:
            return {"answer": ask_human(state["question"])}

        async with opened(system, env, self.name) as (_, store):
            builder = system.StateGraph(AskState)
            builder.add_node("ask", ask)
            builder.add_edge(system.START, "ask")
            builder.add_edge("ask", system.END)
            graph = system.compile(builder, store)
            ids = thread_ids(threads)
            paused: list[dict[str, Any]] = []
            done: list[dict[str, Any]] = []
            with Timer() as timer:
                for i, thread_id in enumerate(ids):
                    paused.append(
                        await system.ainvoke(
                            graph,
                            {"question": f"q{i}", "answer": ""},
                            thread_id=thread_id,
                            durability=env.durability,
                        )
                    )
                    done.append(
                        await system.ainvoke(
                            graph,
                            system.Command(resume=f"a{i}"),
                            thread_id=thread_id,
                            durability=env.durability,
                        )
                    )
            check(system, all(p.get("answer") == "" for p in paused), "a run did not pause")
            check(
                system,
                [d.get("answer") for d in done] == [f"a{i}" for i in range(threads)],
                "a resumed run did not get its answer",
            )
            return Sample(
                {"ms_per_round_trip": timer.seconds * 1000 / threads},
                {"checkpoints / thread": await system.checkpoint_count(graph, ids[-1])},
            )


# -- crash ----------------------------------------------------------------------------------


class CrashState(TypedDict):
    tid: str
    n: int
    log: Annotated[list[str], operator.add]


class PlannedFailure(RuntimeError):
    """Raised by the crash workload's failing node on its first call."""


@register
class CrashWorkload(Workload):
    name = "crash"
    summary = (
        "10-node chain whose 6th node raises on its first call; after the failed invoke, the "
        "time to resume (invoke with no input) and finish; one fresh thread each"
    )
    metrics = (Metric("resume_ms", "ms / resume-and-finish"),)
    nodes = 10
    failing = 5

    def params(self) -> dict[str, Any]:
        return {"threads": 10 if self.quick else 50, "nodes": self.nodes, "fails": "step_5"}

    async def measure(self, system: Adapter, env: Env) -> Sample:
        threads = self.params()["threads"]
        calls: dict[tuple[str, str], int] = {}

        def node(label: str) -> Callable[[CrashState], dict[str, Any]]:
            fails = label == f"step_{self.failing}"

            def run(state: CrashState) -> dict[str, Any]:
                key = (state["tid"], label)
                calls[key] = calls.get(key, 0) + 1
                if fails and calls[key] == 1:
                    raise PlannedFailure(f"planned failure in {label}")
                return {"n": state["n"] + 1, "log": [label]}

            return run

        async with opened(system, env, self.name) as (_, store):
            builder = system.StateGraph(CrashState)
            names = [f"step_{i}" for i in range(self.nodes)]
            for name in names:
                builder.add_node(name, node(name))
            builder.add_edge(system.START, names[0])
            for a, b in itertools.pairwise(names):
                builder.add_edge(a, b)
            builder.add_edge(names[-1], system.END)
            graph = system.compile(builder, store)
            ids = thread_ids(threads)
            for thread_id in ids:  # untimed: run until the failure
                try:
                    await system.ainvoke(
                        graph, {"tid": thread_id, "n": 0, "log": []}, thread_id=thread_id
                    )
                except Exception as e:
                    if "planned failure" not in error_text(e):
                        raise
                else:
                    raise BenchmarkError(f"{system.name}: the failing node did not fail")
            outs: list[dict[str, Any]] = []
            with Timer() as timer:
                for thread_id in ids:
                    outs.append(await system.ainvoke(graph, None, thread_id=thread_id))
            check(
                system,
                all(o.get("n") == self.nodes and o.get("log") == names for o in outs),
                "a resumed run did not finish with every node applied once",
            )
            rerun = sum(c - 1 for (_, label), c in calls.items() if label != names[self.failing])
            return Sample(
                {"resume_ms": timer.seconds * 1000 / threads},
                {"nodes re-run on resume (expected 0)": rerun},
            )


# -- floor ----------------------------------------------------------------------------------


def checkpoint_bytes(cp: Checkpoint) -> int:
    """The bytes graphexec hands its store for one checkpoint: ids, values, frontier, metadata."""
    import msgpack  # type: ignore[import-untyped]

    metadata: bytes = msgpack.packb(dict(cp.metadata), default=str)
    size = len(cp.frontier) + len(metadata)
    size += sum(len(s) for s in (cp.thread_id, cp.checkpoint_id, cp.parent_id or ""))
    size += len(cp.graph_version) + sum(d.nbytes for d in cp.deltas.values())
    if cp.snapshot is not None:
        size += sum(len(b) for b in cp.snapshot.values())
    return size


async def chain_checkpoint_bytes() -> int:
    """Mean bytes per checkpoint of graphexec's 10-node chain (see :func:`checkpoint_bytes`)."""
    from benchmarks._systems import GraphexecAdapter
    from graphexec import InMemoryCheckpointer

    sizes: list[int] = []

    class Recording(InMemoryCheckpointer):
        async def put(self, checkpoint: Any, *, expected_head: Any, lease: Any = None) -> None:
            sizes.append(checkpoint_bytes(checkpoint))
            await super().put(checkpoint, expected_head=expected_head, lease=lease)

    system = GraphexecAdapter()
    graph = build_chain(system, Recording())
    await run_chain(system, graph, thread_ids(5), "sync")
    return round(statistics.mean(sizes))


async def _sqlite_floor(env: Env, payload: bytes, count: int) -> dict[str, float]:
    """Milliseconds per transaction: one hop, three awaits through aiosqlite; on the loop."""
    import sqlite3

    import aiosqlite

    def one_hop(db: sqlite3.Connection) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO floor (data) VALUES (?)", (payload,))
        db.execute("COMMIT")

    async with env.storage("floor") as storage:
        path = storage.where.path
        assert path is not None
        async with aiosqlite.connect(path, isolation_level=None) as db:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={env.synchronous or 'NORMAL'}")
            await db.execute("CREATE TABLE floor (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")

            async def hop() -> None:
                # aiosqlite has no public way to run a function on the connection's thread;
                # graphexec's SqliteDatabase uses this same private call for its transactions.
                await db._execute(one_hop, db._conn)  # type: ignore[no-untyped-call]

            async def awaits() -> None:
                await db.execute("BEGIN IMMEDIATE")
                await db.execute("INSERT INTO floor (data) VALUES (?)", (payload,))
                await db.execute("COMMIT")

            floors = {"floor_ms": await _per_call(hop, count)}
            floors["floor_alt_ms"] = await _per_call(awaits, count)
        # The transaction alone, on the event loop's own thread: what graphexec's small
        # commits cost in synchronous=NORMAL (SqliteDatabase.write), no thread hop.
        direct = sqlite3.connect(path, isolation_level=None)
        try:
            direct.execute(f"PRAGMA synchronous={env.synchronous or 'NORMAL'}")

            async def on_loop() -> None:
                one_hop(direct)

            floors["floor_loop_ms"] = await _per_call(on_loop, count)
        finally:
            direct.close()
        return floors


async def _postgres_floor(env: Env, payload: bytes, count: int) -> dict[str, float]:
    """Milliseconds per transaction: (one autocommit INSERT, BEGIN + INSERT + COMMIT)."""
    import psycopg

    async with env.storage("floor") as storage:
        assert storage.where.dsn is not None
        async with await psycopg.AsyncConnection.connect(storage.where.dsn, autocommit=True) as db:
            await db.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, data bytea NOT NULL)")

            async def single() -> None:
                await db.execute("INSERT INTO floor (data) VALUES (%s)", (payload,))

            async def explicit() -> None:
                async with db.transaction():
                    await db.execute("INSERT INTO floor (data) VALUES (%s)", (payload,))

            floors = {"floor_ms": await _per_call(single, count)}
            floors["floor_alt_ms"] = await _per_call(explicit, count)
            return floors


async def _per_call(call: Callable[[], Awaitable[None]], count: int) -> float:
    for _ in range(max(10, count // 10)):  # warm up
        await call()
    with Timer() as timer:
        for _ in range(count):
            await call()
    return timer.seconds * 1000 / count


@register
class FloorWorkload(Workload):
    name = "floor"
    summary = (
        "the bare storage operation a step needs, with the bytes of one graphexec chain "
        "checkpoint: SQLite BEGIN IMMEDIATE + INSERT + COMMIT through aiosqlite (one hop to its "
        "thread, and as three awaits) and on the event loop's thread (as graphexec's small "
        "commits run); PostgreSQL one autocommit INSERT "
        "round trip (and BEGIN/INSERT/COMMIT); next to each system's chain step in sync mode"
    )
    metrics = (
        Metric("floor_ms", "floor ms / transaction", compare=False, digits=4),
        Metric("floor_alt_ms", "floor ms, 3 awaits / explicit txn", compare=False, digits=4),
        Metric("floor_loop_ms", "floor ms, on the loop's thread", compare=False, digits=4),
        Metric("step_ms", "chain ms / node step (sync)"),
        Metric("multiple", "step / floor (x)", compare=False, digits=1),
    )
    backends = PERSISTENT
    _payload: int | None = None

    def params(self) -> dict[str, Any]:
        return {
            "transactions": 300 if self.quick else 2000,
            "chain_threads": 10 if self.quick else 50,
            "payload_bytes": self._payload,
        }

    async def measure(self, system: Adapter, env: Env) -> Sample:
        if self._payload is None:
            self._payload = await chain_checkpoint_bytes()
        params = self.params()
        payload = os.urandom(self._payload)
        floor = _sqlite_floor if env.backend == "sqlite" else _postgres_floor
        floors = await floor(env, payload, params["transactions"])
        async with opened(system, env, "floor-chain") as (_, store):
            graph = build_chain(system, store)
            threads = params["chain_threads"]
            seconds = await run_chain(system, graph, thread_ids(threads), "sync")
        step_ms = seconds * 1000 / (threads * 10)
        return Sample(
            {**floors, "step_ms": step_ms, "multiple": step_ms / floors["floor_ms"]},
            {"payload bytes / transaction": self._payload},
        )
