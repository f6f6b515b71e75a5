"""The ``graphexec`` command line: run, inspect, time-travel, approve and serve graphs.

Storage is ``--db PATH`` (SQLite; default ``$GRAPHEXEC_DB`` or ``./graphexec.db``) or
``--dsn postgresql://...`` (default ``$GRAPHEXEC_DSN``). Commands that fold state or run nodes
need the graph: ``--graph MODULE:ATTRIBUTE`` (or ``$GRAPHEXEC_GRAPH``); graphs are never
imported from names stored in the database. Every read command takes ``--json``.

Exit status: 0 done; 1 a run failed; 2 a user mistake (one line on stderr, nothing written);
3 a run is waiting for a human; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Sequence

from graphexec.cli._common import (
    DSN_VARIABLE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    GRAPH_VARIABLE,
    CliError,
    SafeStream,
    add_store_options,
    load_graph,
    terminal_safe,
)
from graphexec.errors import GraphExecError, ThreadBusyError, ThreadInterruptedError

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "load_graph",
    "main",
]


def _count(text: str) -> int:
    """An argparse type: a whole number of at least 1 (limits, counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _cli_words(e: BaseException) -> str:
    """The message of ``e`` in the command line's words rather than the Python API's."""
    if isinstance(e, ThreadBusyError):
        owner = f" (run {e.owner})" if e.owner else ""
        return (
            f"thread {e.thread_id!r} is busy: another run holds it{owner}; run the command again "
            "when it has finished, or add --wait to wait for it (a crashed owner's lease ends "
            "on its own)"
        )
    if isinstance(e, ThreadInterruptedError):
        ids = ", ".join(e.pending)
        return (
            f"thread {e.thread_id!r} is waiting for a human ({ids}); answer first with "
            f"graphexec approve/reject {e.thread_id} ID, or graphexec resume {e.thread_id} ID "
            "--value JSON, then send new input"
        )
    return str(e) or type(e).__name__


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors and our exit status for them."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _graph_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph",
        metavar="MODULE:ATTR",
        default=None,
        help=f"the graph that wrote the thread (default: ${GRAPH_VARIABLE})",
    )


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--durability", choices=("sync", "async", "exit"), default="sync")
    p.add_argument("--recursion-limit", type=_count, default=None, metavar="N")
    p.add_argument(
        "--wait", action="store_true", help="if another run owns the thread, wait for it"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


def _parser() -> argparse.ArgumentParser:
    from graphexec.cli import _demo, _queue, _runs, _threads

    parser = _Parser(
        prog="graphexec",
        description="Durable agent workflows: run, inspect, time-travel, approve and serve graphs.",
        epilog="exit status: 0 done, 1 run failed, 2 usage error, 3 waiting for a human",
    )
    from graphexec import __version__

    parser.add_argument("--version", action="version", version=f"graphexec {__version__}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help)

    d = command("demo", "the support-ticket scenario end to end: crash, resume, approve, replay")
    d.add_argument("--dir", default="graphexec-demo", help="where to keep its files")
    d.set_defaults(handler=_demo.cmd_demo)

    r = command("run", "start a thread (or continue it) with an input")
    r.add_argument("target", metavar="MODULE:GRAPH")
    r.add_argument("--thread", required=True, metavar="T")
    r.add_argument("--input", metavar="JSON|@FILE", default=None, help="state keys, as JSON")
    add_store_options(r)
    _run_options(r)
    r.set_defaults(handler=_runs.cmd_run)

    rs = command("resume", "continue a thread from its last checkpoint (or answer an interrupt)")
    rs.add_argument("thread", metavar="T")
    rs.add_argument("interrupt_id", nargs="?", metavar="ID", help="the interrupt --value answers")
    rs.add_argument("--value", metavar="JSON|@FILE", default=None, help="answer to interrupt()")
    _graph_option(rs)
    add_store_options(rs)
    _run_options(rs)
    rs.set_defaults(handler=_runs.cmd_resume)

    t = command("threads", "list threads, most recently updated first")
    t.add_argument("--limit", type=_count, default=None, metavar="N")
    t.add_argument("--json", action="store_true")
    add_store_options(t)
    t.set_defaults(handler=_threads.cmd_threads)

    h = command("history", "a thread's checkpoints, newest first")
    h.add_argument("thread", metavar="T")
    h.add_argument("--limit", type=_count, default=None, metavar="N")
    h.add_argument("--checkpoint", metavar="C", help="start at C (e.g. another branch's tip)")
    h.add_argument("--branches", action="store_true", help="list the tip of every branch")
    h.add_argument("--json", action="store_true")
    add_store_options(h)
    h.set_defaults(handler=_threads.cmd_history)

    s = command("show", "a thread's state at its head or a checkpoint; --diff: what it changed")
    s.add_argument("thread", metavar="T")
    s.add_argument("--checkpoint", metavar="C")
    s.add_argument("--diff", action="store_true", help="changes from the parent checkpoint")
    s.add_argument("--json", action="store_true")
    _graph_option(s)
    add_store_options(s)
    s.set_defaults(handler=_threads.cmd_show)

    rp = command("replay", "re-execute a thread from checkpoint C, on a new branch")
    rp.add_argument("thread", metavar="T")
    rp.add_argument("checkpoint", metavar="C")
    _graph_option(rp)
    add_store_options(rp)
    _run_options(rp)
    rp.set_defaults(handler=_runs.cmd_replay)

    f = command("fork", "copy thread T at checkpoint C into a new thread NEW")
    f.add_argument("thread", metavar="T")
    f.add_argument("checkpoint", metavar="C")
    f.add_argument("new_thread", metavar="NEW")
    f.add_argument("--json", action="store_true")
    _graph_option(f)
    add_store_options(f)
    f.set_defaults(handler=_runs.cmd_fork)

    for name, help in (
        ("approve", "approve a pending approval (or release a breakpoint) and continue"),
        ("reject", "reject a pending approval: the node is skipped, its on_reject followed"),
    ):
        a = command(name, help)
        a.add_argument("thread", metavar="T")
        a.add_argument("interrupt_id", nargs="?", metavar="ID", help="which one, when several")
        a.add_argument("--by", metavar="NAME", default=None, help="who decides (recorded)")
        a.add_argument("--reason", metavar="R", default=None, help="why (for a rejection)")
        if name == "approve":
            a.add_argument("--edit", metavar="JSON|@FILE", help="state changes to apply first")
            a.add_argument("--reject", action="store_true", help="reject instead of approving")
            a.set_defaults(handler=_runs.cmd_approve)
        else:
            a.set_defaults(handler=_runs.cmd_reject)
        _graph_option(a)
        add_store_options(a)
        _run_options(a)

    dr = command("draw", "the graph as Mermaid text, or an image with -o FILE.svg|.png|.mmd")
    dr.add_argument("target", metavar="MODULE:GRAPH")
    dr.add_argument("--output", "-o", metavar="FILE", default=None)
    dr.set_defaults(handler=_runs.cmd_draw)

    p = command("prune", "keep the last N checkpoints of a thread (or of all threads)")
    p.add_argument("thread", nargs="?", metavar="T")
    p.add_argument("--all", action="store_true", help="every thread")
    p.add_argument("--keep-last", type=int, required=True, metavar="N")
    p.add_argument("--json", action="store_true")
    _graph_option(p)
    add_store_options(p)
    p.set_defaults(handler=_threads.cmd_prune)

    e = command("expire", "delete threads past their time-to-live, or set one with --ttl")
    e.add_argument("--thread", metavar="T", default=None)
    e.add_argument("--ttl", metavar="SECONDS|none", default=None)
    e.add_argument("--json", action="store_true")
    add_store_options(e)
    e.set_defaults(handler=_threads.cmd_expire)

    dsn_default = os.environ.get(DSN_VARIABLE)

    def dsn_option(p: argparse.ArgumentParser) -> None:
        # Not required by argparse: $GRAPHEXEC_DSN may give it; the command says when neither.
        p.add_argument(
            "--dsn",
            default=dsn_default,
            metavar="postgresql://...",
            help=f"the PostgreSQL database of the queue (default: ${DSN_VARIABLE})",
        )

    w = command("worker", "serve queued runs from PostgreSQL")
    w.add_argument("graphs", nargs="+", metavar="[NAME=]MODULE:GRAPH")
    dsn_option(w)
    w.add_argument(
        "--concurrency", type=_count, default=4, metavar="N", help="runs executed at once (4)"
    )
    w.add_argument(
        "--lease-ttl",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="seconds before a silent worker's runs are taken over (30)",
    )
    w.add_argument("--grace", type=_seconds, default=30.0, help="seconds to finish on SIGTERM")
    w.add_argument("--worker-id", default=None)
    w.add_argument("--max-runs", type=_count, default=None, help="exit after this many runs")
    w.add_argument(
        "--max-attempts",
        type=int,
        default=5,
        metavar="N",
        help="claims a run gets before it ends failed, when its worker dies or the database "
        "fails (5)",
    )
    w.add_argument(
        "--retry-delay",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="wait before a retry, doubled on each further one (1)",
    )
    w.set_defaults(handler=_queue.cmd_worker)

    q = command("enqueue", "add a run to the PostgreSQL queue")
    q.add_argument("graph", help="graph name a worker serves")
    dsn_option(q)
    q.add_argument("--input", default=None, help="JSON, or @file with JSON; omit to resume")
    q.add_argument("--thread", default=None)
    q.add_argument("--run-id", default=None)
    q.add_argument("--wait", action="store_true", help="wait until the run ends")
    q.add_argument("--timeout", type=_seconds, default=None)
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=_queue.cmd_enqueue)

    rn = command("runs", "list, cancel or wait for queued runs")
    dsn_option(rn)
    rn.add_argument("--status", default=None)
    rn.add_argument("--thread", default=None)
    rn.add_argument("--limit", type=_count, default=50)
    rn.add_argument("--cancel", metavar="RUN_ID", default=None)
    rn.add_argument("--wait", metavar="RUN_ID", default=None)
    rn.add_argument("--timeout", type=_seconds, default=None)
    rn.add_argument("--json", action="store_true")
    rn.set_defaults(handler=_queue.cmd_runs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``graphexec`` console script; returns the exit status."""
    # Human output escapes control characters wherever it is printed from: stored thread ids,
    # node names and values must not drive the terminal (see _common.terminal_safe), nor may
    # an argument the parser quotes in a usage error.
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = SafeStream(out), SafeStream(err)
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as e:  # --help, or a usage error already printed by the parser
            return e.code if isinstance(e.code, int) else EXIT_USAGE
        status: int = asyncio.run(args.handler(args))
    except (CliError, GraphExecError, TimeoutError) as e:
        message = " ".join(_cli_words(e).split())
        print(f"graphexec {args.command}: {terminal_safe(message)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout, sys.stderr = out, err
    return status
