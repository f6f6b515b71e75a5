"""The ``graphexec`` command line.

Commands so far: ``worker`` (serve queued runs from PostgreSQL), ``enqueue`` (add a run) and
``runs`` (list, show, cancel, wait). Errors a user can cause (a bad ``module:graph``, a missing
server, an unknown run) print one line and exit with status 2; a failed run exits with 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

from graphexec._graph import CompiledGraph
from graphexec.errors import GraphExecError

__all__ = ["load_graph", "main"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A user mistake: reported as one line, exit status 2."""


def load_graph(spec: str) -> tuple[str, CompiledGraph[Any]]:
    """Import ``[name=]module:attribute`` and return ``(name, graph)``.

    The attribute may be a compiled graph, a ``StateGraph`` (compiled here) or a zero-argument
    function returning either. The name defaults to the graph's ``name``.
    """
    from graphexec._builder import StateGraph

    name, _, target = spec.rpartition("=")
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{spec!r}: expected module:attribute, e.g. myapp.flows:graph")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise CliError(f"cannot import module {module_name!r}: {e}") from e
    try:
        obj: Any = getattr(module, attr)
    except AttributeError as e:
        raise CliError(f"module {module_name!r} has no attribute {attr!r}") from e
    if callable(obj) and not isinstance(obj, CompiledGraph | StateGraph):
        obj = obj()
    if isinstance(obj, StateGraph):
        obj = obj.compile(name=attr)
    if not isinstance(obj, CompiledGraph):
        raise CliError(f"{target} is a {type(obj).__name__}, not a graph")
    return (name or obj.name), obj


def _json_arg(text: str) -> Any:
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise CliError(f"cannot read {text[1:]!r}: {e.strerror}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"input is not valid JSON: {e}") from e


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


async def _worker(args: argparse.Namespace) -> int:
    from checkpointers.queue import Worker

    graphs = dict(load_graph(spec) for spec in args.graphs)
    worker = Worker(
        args.dsn,
        graphs,
        concurrency=args.concurrency,
        lease_ttl=args.lease_ttl,
        grace=args.grace,
        worker_id=args.worker_id,
    )
    print(f"worker {worker.worker_id} serving {', '.join(graphs)}", file=sys.stderr, flush=True)
    await worker.run(max_runs=args.max_runs, install_signals=True)
    print(f"worker {worker.worker_id} stopped after {worker.completed} run(s)", file=sys.stderr)
    return EXIT_OK


async def _enqueue(args: argparse.Namespace) -> int:
    from checkpointers.queue import RunQueue

    queue = RunQueue(args.dsn)
    try:
        payload = None if args.input is None else _json_arg(args.input)
        run_id = await queue.enqueue(args.graph, payload, thread_id=args.thread, run_id=args.run_id)
        run = (
            await queue.wait(run_id, timeout=args.timeout) if args.wait else await queue.get(run_id)
        )
    finally:
        await queue.aclose()
    assert run is not None
    if args.json:
        print(json.dumps(_run_dict(run)))
    else:
        print(f"{run.run_id}  {run.status}  thread {run.thread_id}")
    return EXIT_FAILED if run.status == "failed" else EXIT_OK


def _run_dict(run: Any) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "graph": run.graph_name,
        "thread_id": run.thread_id,
        "status": run.status,
        "worker": run.worker_id,
        "attempts": run.attempts,
        "enqueued_at": run.enqueued_at.isoformat(),
        "finished_at": None if run.finished_at is None else run.finished_at.isoformat(),
        "error": run.error,
        "checkpoint_id": run.checkpoint_id,
    }


async def _runs(args: argparse.Namespace) -> int:
    from checkpointers.queue import RunQueue

    queue = RunQueue(args.dsn)
    try:
        if args.cancel:
            runs = [await queue.cancel(args.cancel)]
        elif args.wait:
            runs = [await queue.wait(args.wait, timeout=args.timeout)]
        else:
            runs = await queue.list(status=args.status, thread_id=args.thread, limit=args.limit)
    finally:
        await queue.aclose()
    if args.json:
        print(json.dumps([_run_dict(r) for r in runs]))
    else:
        rows = [
            (r.run_id, r.graph_name, r.thread_id, r.status, r.attempts, r.worker_id, r.error)
            for r in runs
        ]
        print(_table(rows, ["run", "graph", "thread", "status", "tries", "worker", "error"]))
    return EXIT_FAILED if any(r.status == "failed" for r in runs) and args.wait else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphexec", description="Durable agent workflows: run, inspect and serve graphs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", help="serve queued runs from PostgreSQL")
    w.add_argument("graphs", nargs="+", metavar="[NAME=]MODULE:GRAPH")
    w.add_argument("--dsn", required=True, help="postgresql://...")
    w.add_argument("--concurrency", type=int, default=4)
    w.add_argument("--lease-ttl", type=float, default=30.0)
    w.add_argument("--grace", type=float, default=30.0, help="seconds to finish on SIGTERM")
    w.add_argument("--worker-id", default=None)
    w.add_argument("--max-runs", type=int, default=None, help="exit after this many runs")
    w.set_defaults(handler=_worker)

    e = sub.add_parser("enqueue", help="add a run to the queue")
    e.add_argument("graph", help="graph name a worker serves")
    e.add_argument("--dsn", required=True)
    e.add_argument("--input", default=None, help="JSON, or @file with JSON; omit to resume")
    e.add_argument("--thread", default=None)
    e.add_argument("--run-id", default=None)
    e.add_argument("--wait", action="store_true", help="wait until the run ends")
    e.add_argument("--timeout", type=float, default=None)
    e.add_argument("--json", action="store_true")
    e.set_defaults(handler=_enqueue)

    r = sub.add_parser("runs", help="list, cancel or wait for queued runs")
    r.add_argument("--dsn", required=True)
    r.add_argument("--status", default=None)
    r.add_argument("--thread", default=None)
    r.add_argument("--limit", type=int, default=50)
    r.add_argument("--cancel", metavar="RUN_ID", default=None)
    r.add_argument("--wait", metavar="RUN_ID", default=None)
    r.add_argument("--timeout", type=float, default=None)
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=_runs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphexec`` console script; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        status: int = asyncio.run(args.handler(args))
    except (CliError, GraphExecError, TimeoutError) as e:
        message = str(e) or type(e).__name__
        print(f"graphexec {args.command}: {message}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    return status


if __name__ == "__main__":
    sys.exit(main())
