"""``python -m benchmarks``: run workloads on graphexec and LangGraph, interleaved."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._core import REGISTRY, WorkloadResult, cases, run_workload
from benchmarks._growth import write_growth
from benchmarks._report import dumps, losses, markdown, problems, table, to_json, write
from benchmarks._systems import (
    API_STYLE,
    BACKENDS,
    DURABILITIES,
    LANGGRAPH,
    load_systems,
    package_version,
)

__all__ = ["RESULTS_DIR", "main"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _csv(allowed: Sequence[str]) -> Any:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"choose from {', '.join(allowed)} (comma-separated), got {text!r}"
            )
        return list(dict.fromkeys(items))

    return parse


def _parser() -> argparse.ArgumentParser:
    names = ", ".join(REGISTRY)
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Run graphexec workloads and, when langgraph imports, the same workloads on "
            "LangGraph, interleaved: a warm-up of each, then A B A B ... for --repeat rounds, "
            "on every selected backend (and durability mode, where the workload is measured "
            "in several). Prints medians and the ratio langgraph/graphexec (above 1: graphexec "
            "is faster)."
        ),
    )
    p.add_argument(
        "workloads",
        nargs="*",
        metavar="workload",
        help=f"workloads to run (default: all; with --quick, all but the long-only ones): {names}",
    )
    p.add_argument(
        "--backend",
        type=_csv(BACKENDS),
        default=None,
        help="comma-separated backends: memory,sqlite,postgres (default memory,sqlite, plus "
        "postgres when --dsn is given)",
    )
    p.add_argument(
        "--durability",
        type=_csv(DURABILITIES),
        default=["sync"],
        help="comma-separated durability modes for the workloads measured in several "
        "(chain, loop, fanout, chat, interrupt) on persistent backends (default sync); "
        "in-memory stores and the other workloads run sync",
    )
    p.add_argument(
        "--dsn",
        default=None,
        help="PostgreSQL server for the postgres backend; each batch creates and drops its own "
        "database there, so the role needs CREATEDB",
    )
    p.add_argument(
        "--sqlite-synchronous",
        choices=("NORMAL", "FULL"),
        default=None,
        help="force PRAGMA synchronous on both systems' SQLite files and the floor (default: "
        "each library's own: graphexec NORMAL, LangGraph's saver FULL)",
    )
    p.add_argument(
        "--postgres-prepare",
        action="store_true",
        help="open graphexec's PostgresCheckpointer with prepare=True, as LangGraph's saver "
        "prepares every statement (default: graphexec's own default, prepare=False, which "
        "works through any transaction-mode pooler)",
    )
    p.add_argument(
        "--tmpdir",
        type=Path,
        default=None,
        help="folder for the SQLite files (default: the system temp folder)",
    )
    p.add_argument("--repeat", type=int, default=5, help="measured rounds per system (default 5)")
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"JSON output path (default {RESULTS_DIR / 'latest.json'}); loop_growth.json and "
        ".png go to the same folder",
    )
    p.add_argument(
        "--markdown",
        type=Path,
        default=None,
        help="Markdown output path (default: next to --json with a .md suffix, else "
        f"{RESULTS_DIR / 'latest.md'})",
    )
    p.add_argument("--quick", action="store_true", help="shrink every workload (smoke test)")
    p.add_argument(
        "--no-langgraph", action="store_true", help="run graphexec only, even if langgraph imports"
    )
    p.add_argument("--list", action="store_true", help="list the workloads and exit")
    return p


def _meta(
    args: argparse.Namespace,
    versions: dict[str, str | None],
    skip: str | None,
    backends: list[str],
    tmp: Path,
) -> dict[str, Any]:
    sync = args.sqlite_synchronous
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
        "api": API_STYLE,
        "backends": ", ".join(backends),
        "durability modes": ", ".join(args.durability),
        "checkpointers": "memory: InMemoryCheckpointer / InMemorySaver; sqlite: "
        "SqliteCheckpointer / AsyncSqliteSaver; postgres: PostgresCheckpointer / "
        "AsyncPostgresSaver; a fresh store (file, database) per measured batch",
        "sqlite synchronous": f"{sync} on both"
        if sync
        else "library defaults: graphexec NORMAL, LangGraph FULL (both WAL)",
        "postgres statements": "prepared on both (graphexec prepare=True)"
        if args.postgres_prepare
        else "graphexec unprepared (its default, prepare=False); LangGraph prepared "
        "(prepare_threshold=0)",
        "sqlite files in": str(tmp),
        "load average (1, 5, 15 min) at start": _load(),
        "rounds": args.repeat,
        "quick": args.quick,
        "langgraph_comparison": "skipped: " + skip if skip else "yes",
    }


def _load() -> str:
    # Other processes on the machine skew timings: record how busy it was.
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (1 when graphexec fails a workload)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list:
        for name, cls in REGISTRY.items():
            print(f"{name:14} {cls.summary}")
        return 0
    unknown = [w for w in args.workloads if w not in REGISTRY]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(REGISTRY)}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    backends: list[str] = args.backend or (
        ["memory", "sqlite", "postgres"] if args.dsn else ["memory", "sqlite"]
    )
    if "postgres" in backends and not args.dsn:
        parser.error("the postgres backend needs --dsn")
    names = list(dict.fromkeys(args.workloads)) or [
        name for name, cls in REGISTRY.items() if cls.in_quick or not args.quick
    ]
    json_path: Path = args.json or RESULTS_DIR / "latest.json"
    md_path: Path = args.markdown or (
        args.json.with_suffix(".md") if args.json else RESULTS_DIR / "latest.md"
    )

    systems, skip = load_systems(compare=not args.no_langgraph)
    versions: dict[str, str | None] = {}
    for system in systems:
        versions.update(system.versions())
    versions["matplotlib"] = package_version("matplotlib")

    results: list[WorkloadResult] = []
    with tempfile.TemporaryDirectory(prefix="graphexec-bench-", dir=args.tmpdir) as folder:
        tmp = Path(folder)
        meta = _meta(args, versions, skip, backends, tmp.parent)
        for name in names:
            workload = REGISTRY[name](quick=args.quick)
            for env in cases(
                workload,
                backends,
                args.durability,
                tmp=tmp,
                dsn=args.dsn,
                synchronous=args.sqlite_synchronous,
                prepare=args.postgres_prepare,
            ):
                result = run_workload(
                    workload, env, systems, repeat=args.repeat, progress=_progress
                )
                if skip:
                    result.skipped.setdefault(LANGGRAPH, "skipped: " + skip)
                results.append(result)

    rounds = f"{args.repeat} round{'s' if args.repeat != 1 else ''}"
    print(f"graphexec benchmarks ({rounds} after a warm-up{', quick' if args.quick else ''})")
    print(f"API: {API_STYLE}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))
    print(f"SQLite {sqlite3.sqlite_version}, synchronous: {meta['sqlite synchronous']}")
    print("Medians; langgraph / graphexec above 1 means graphexec is faster (or smaller).")
    print()
    print(table(results))
    print()
    if skip:
        print(f"LangGraph comparison skipped: {skip}.")
    lost = losses(results)
    if lost:
        print("graphexec is slower or larger on:")
        for item in lost:
            print(f"  {item}")
    for item in problems(results):
        print(item)
    meta["load average (1, 5, 15 min) at end"] = _load()
    print(f"load average at start {meta['load average (1, 5, 15 min) at start']}, at end {_load()}")
    write(json_path, dumps(to_json(results, meta)))
    write(md_path, markdown(results, meta))
    print(f"wrote {json_path} and {md_path}")
    for path in write_growth(results, json_path.parent, meta):
        print(f"wrote {path}")
    return 1 if any(r.failed for r in results) else 0
