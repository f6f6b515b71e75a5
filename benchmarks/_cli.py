"""``python -m benchmarks``: run workloads on graphexec and LangGraph, interleaved."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import workloads as _workloads  # noqa: F401 - registers the workloads
from benchmarks._core import REGISTRY, WorkloadResult, run_workload
from benchmarks._report import dumps, markdown, table, to_json, write
from benchmarks._systems import API_STYLE, LANGGRAPH, load_systems

__all__ = ["RESULTS_DIR", "main"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _parser() -> argparse.ArgumentParser:
    names = ", ".join(REGISTRY)
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=(
            "Run graphexec workloads and, when langgraph imports, the same workloads on "
            "LangGraph, interleaved: a warm-up of each, then A B A B ... for --repeat rounds. "
            "Prints medians and the ratio langgraph/graphexec (above 1: graphexec is faster)."
        ),
    )
    p.add_argument(
        "workloads",
        nargs="*",
        metavar="workload",
        help=f"workloads to run (default: all): {names}",
    )
    p.add_argument("--repeat", type=int, default=5, help="measured rounds per system (default 5)")
    p.add_argument(
        "--json",
        type=Path,
        default=None,
        help=f"JSON output path (default {RESULTS_DIR / 'latest.json'})",
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
    args: argparse.Namespace, versions: dict[str, str | None], skip: str | None
) -> dict[str, Any]:
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
        "api": API_STYLE,
        "checkpointers": "graphexec InMemoryCheckpointer, LangGraph InMemorySaver",
        "rounds": args.repeat,
        "quick": args.quick,
        "langgraph_comparison": "skipped: " + skip if skip else "yes",
    }


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
    names = list(dict.fromkeys(args.workloads)) or list(REGISTRY)
    json_path: Path = args.json or RESULTS_DIR / "latest.json"
    md_path: Path = args.markdown or (
        args.json.with_suffix(".md") if args.json else RESULTS_DIR / "latest.md"
    )

    systems, skip = load_systems(compare=not args.no_langgraph)
    versions: dict[str, str | None] = {}
    for system in systems:
        versions.update(system.versions())
    meta = _meta(args, versions, skip)

    results: list[WorkloadResult] = []
    for name in names:
        workload = REGISTRY[name](quick=args.quick)
        result = run_workload(workload, systems, repeat=args.repeat, progress=_progress)
        if skip:
            result.skipped.setdefault(LANGGRAPH, "skipped: " + skip)
        results.append(result)

    rounds = f"{args.repeat} round{'s' if args.repeat != 1 else ''}"
    print(f"graphexec benchmarks ({rounds} after a warm-up{', quick' if args.quick else ''})")
    print(f"API: {API_STYLE}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print("Medians; langgraph / graphexec above 1 means graphexec is faster.")
    print()
    print(table(results))
    print()
    if skip:
        print(f"LangGraph comparison skipped: {skip}.")
    for result in results:
        for name, reason in result.skipped.items():
            if reason.startswith("failed"):
                print(f"{result.workload.name} on {name}: {reason}")
    write(json_path, dumps(to_json(results, meta)))
    write(md_path, markdown(results, meta))
    print(f"wrote {json_path} and {md_path}")
    return 1 if any(r.failed for r in results) else 0
