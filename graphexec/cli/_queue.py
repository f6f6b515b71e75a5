"""Commands of the PostgreSQL run queue: worker, enqueue, runs.

Run inputs are encrypted at rest with ``$GRAPHEXEC_ENCRYPTION_KEYS`` when it is set (the same
keys as the checkpoints), so ``enqueue`` and ``worker`` must be given the same keys.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from graphexec.cli._common import (
    DSN_VARIABLE,
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    _encryption,
    json_arg,
    load_graph,
    table,
)

__all__ = ["cmd_enqueue", "cmd_runs", "cmd_worker"]


def _dsn(args: argparse.Namespace) -> str:
    if not args.dsn:
        raise CliError(
            f"{args.command} needs the queue's PostgreSQL database: pass --dsn postgresql://... "
            f"or set ${DSN_VARIABLE}"
        )
    dsn: str = args.dsn
    return dsn


async def cmd_worker(args: argparse.Namespace) -> int:
    from checkpointers.queue import Worker

    graphs = dict(load_graph(spec) for spec in args.graphs)
    worker = Worker(
        _dsn(args),
        graphs,
        concurrency=args.concurrency,
        lease_ttl=args.lease_ttl,
        grace=args.grace,
        worker_id=args.worker_id,
        max_attempts=args.max_attempts,
        retry_delay=args.retry_delay,
        encryption=_encryption(),
    )
    print(f"worker {worker.worker_id} serving {', '.join(graphs)}", file=sys.stderr, flush=True)
    await worker.run(max_runs=args.max_runs, install_signals=True)
    print(f"worker {worker.worker_id} stopped after {worker.completed} run(s)", file=sys.stderr)
    return EXIT_OK


async def cmd_enqueue(args: argparse.Namespace) -> int:
    from checkpointers.queue import RunQueue

    queue = RunQueue(_dsn(args), encryption=_encryption())
    try:
        payload = None if args.input is None else json_arg(args.input)
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


async def cmd_runs(args: argparse.Namespace) -> int:
    from checkpointers.queue import RunQueue

    queue = RunQueue(_dsn(args))
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
        print(table(rows, ["run", "graph", "thread", "status", "tries", "worker", "error"]))
    return EXIT_FAILED if any(r.status == "failed" for r in runs) and args.wait else EXIT_OK
