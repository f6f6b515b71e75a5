"""The workloads. Each builds the same graph on every system through its adapter.

Threads run one after another (one ``ainvoke`` at a time) so the figures are per-run latency,
not throughput under concurrency.
"""

from __future__ import annotations

import itertools
import operator
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from benchmarks._core import BenchmarkError, Metric, Sample, Timer, Workload, register
from benchmarks._systems import GRAPHEXEC, Adapter

__all__ = ["ChainNoCheckpointer", "ChainWorkload", "FanoutWorkload", "LoopWorkload"]


def _thread_ids(count: int) -> list[str]:
    # Fresh ids per batch, although every batch also gets a fresh checkpointer.
    prefix = uuid.uuid4().hex[:8]
    return [f"{prefix}-{i}" for i in range(count)]


def _check(system: Adapter, ok: bool, what: str) -> None:
    if not ok:
        raise BenchmarkError(f"{system.name}: {what}")


# -- chain ----------------------------------------------------------------------------------


class ChainState(TypedDict):
    n: int
    log: Annotated[list[str], operator.add]


def _chain_node(label: str) -> Callable[[ChainState], dict[str, Any]]:
    def node(state: ChainState) -> dict[str, Any]:
        return {"n": state["n"] + 1, "log": [label]}

    return node


@register
class ChainWorkload(Workload):
    name = "chain"
    summary = "10-node linear chain, one invoke per fresh thread, in-memory checkpointer"
    metrics = (Metric("ms_per_step", "ms / node step"),)
    checkpointed = True
    nodes = 10

    def params(self) -> dict[str, Any]:
        return {
            "threads": 20 if self.quick else 200,
            "nodes": self.nodes,
            "checkpointer": "in-memory" if self.checkpointed else "none",
        }

    def build(self, system: Adapter) -> Any:
        builder = system.StateGraph(ChainState)
        names = [f"step_{i}" for i in range(self.nodes)]
        for name in names:
            builder.add_node(name, _chain_node(name))
        builder.add_edge(system.START, names[0])
        for a, b in itertools.pairwise(names):
            builder.add_edge(a, b)
        builder.add_edge(names[-1], system.END)
        return system.compile(builder, checkpointed=self.checkpointed)

    async def measure(self, system: Adapter) -> Sample:
        threads = self.params()["threads"]
        graph = self.build(system)
        ids = _thread_ids(threads) if self.checkpointed else [None] * threads
        out: dict[str, Any] = {}
        with Timer() as timer:
            for thread_id in ids:
                out = await system.ainvoke(
                    graph, {"n": 0, "log": []}, thread_id=thread_id, recursion_limit=50
                )
        _check(
            system,
            out.get("n") == self.nodes and len(out.get("log", ())) == self.nodes,
            f"chain ended with n={out.get('n')!r}, {len(out.get('log', ()))} log entries",
        )
        sample = Sample({"ms_per_step": timer.seconds * 1000 / (threads * self.nodes)})
        if self.checkpointed:
            last = ids[-1]
            assert last is not None
            sample.info["checkpoints / run"] = await system.checkpoint_count(graph, last)
        return sample


@register
class ChainNoCheckpointer(ChainWorkload):
    name = "chain-nockpt"
    summary = "the chain workload without a checkpointer: pure engine overhead"
    checkpointed = False


# -- loop -----------------------------------------------------------------------------------


class LoopState(TypedDict):
    msgs: Annotated[list[str], operator.add]


def _message(k: int, size: int) -> str:
    return f"message {k:06d} ".ljust(size, ".")


@register
class LoopWorkload(Workload):
    name = "loop"
    summary = (
        "one thread, one node looping on itself via a conditional edge, appending a "
        "~200-byte message per step to an operator.add list; in-memory checkpointer"
    )
    metrics = (
        Metric("total_ms", "total ms", digits=1),
        Metric("first_decile_ms", "ms / step, first decile"),
        Metric("last_decile_ms", "ms / step, last decile"),
        Metric("growth", "growth (last / first decile)", compare=False, digits=2),
    )
    payload = 200

    def params(self) -> dict[str, Any]:
        return {"steps": 200 if self.quick else 1000, "message_bytes": self.payload}

    async def measure(self, system: Adapter) -> Sample:
        steps = self.params()["steps"]
        size = self.payload
        stamps: list[float] = []

        # Each step's time is the gap between consecutive node starts: the node, the engine's
        # step and checkpoint, and the dispatch of the next node. Recorded outside the state
        # so both systems see identical graphs.
        def step(state: LoopState) -> dict[str, Any]:
            stamps.append(time.perf_counter())
            return {"msgs": [_message(len(state["msgs"]), size)]}

        def route(state: LoopState) -> str:
            return "step" if len(state["msgs"]) < steps else system.END

        builder = system.StateGraph(LoopState)
        builder.add_node("step", step)
        builder.add_edge(system.START, "step")
        builder.add_conditional_edges("step", route, ["step", system.END])
        graph = system.compile(builder, checkpointed=True)
        (thread_id,) = _thread_ids(1)
        with Timer() as timer:
            out = await system.ainvoke(
                graph, {"msgs": []}, thread_id=thread_id, recursion_limit=steps + 10
            )
        msgs = out.get("msgs", [])
        _check(
            system,
            len(msgs) == steps and len(stamps) == steps and msgs[-1] == _message(steps - 1, size),
            f"loop ran {len(stamps)} steps and kept {len(msgs)} messages, expected {steps}",
        )
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        decile = max(1, len(gaps) // 10)
        first = sum(gaps[:decile]) / decile * 1000
        last = sum(gaps[-decile:]) / decile * 1000
        return Sample(
            {
                "total_ms": timer.seconds * 1000,
                "first_decile_ms": first,
                "last_decile_ms": last,
                "growth": last / first,
            },
            {"checkpoints / run": await system.checkpoint_count(graph, thread_id)},
        )


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
        "operator.add list; then a join node; in-memory checkpointer"
    )
    metrics = (Metric("ms_per_run", "ms / run"),)
    sends = 64

    def params(self) -> dict[str, Any]:
        return {"threads": 10 if self.quick else 50, "sends": self.sends}

    async def measure(self, system: Adapter) -> Sample:
        threads = self.params()["threads"]
        sends = self.sends
        send = system.Send

        def scatter(state: FanState) -> list[Any]:
            return [send("worker", i) for i in range(sends)]

        builder = system.StateGraph(FanState)
        builder.add_node("fan", _fan)
        builder.add_node("worker", _worker)
        builder.add_node("join", _join)
        builder.add_edge(system.START, "fan")
        builder.add_conditional_edges("fan", scatter, ["worker"])
        builder.add_edge("worker", "join")
        builder.add_edge("join", system.END)
        graph = system.compile(builder, checkpointed=True)
        ids = _thread_ids(threads)
        outs: list[dict[str, Any]] = []
        with Timer() as timer:
            for thread_id in ids:
                outs.append(
                    await system.ainvoke(
                        graph, {"results": []}, thread_id=thread_id, recursion_limit=50
                    )
                )
        expected = [i * i for i in range(sends)]
        results = [out.get("results", []) for out in outs]
        _check(
            system,
            all(sorted(r) == expected for r in results),
            "fanout lost or duplicated worker results",
        )
        in_order = sum(r == expected for r in results)
        # graphexec promises Send order whatever order workers finish in; LangGraph's order
        # is reported, not required.
        if system.name == GRAPHEXEC:
            _check(
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
