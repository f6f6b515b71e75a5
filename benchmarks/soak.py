"""Soak test: sustained workflow load, watched for leaks and drift.

    python -m benchmarks.soak --minutes 10 --backend sqlite,postgres
    python -m benchmarks.soak --seconds 60 --backend sqlite --json soak.json

Each backend runs in its own process (so its memory and file descriptors are its own), all at
the same time, for the whole duration. A process keeps ``--concurrency`` runs in flight, each on
a new thread: an 8-step chain with a growing reducer list, every third run a 4-way ``Send``
fan-out and every fifth an ``interrupt`` answered by a second run. Finished threads are deleted
once ``--keep`` newer ones exist, as a deployment with retention would, so the store stays
bounded and any growth is the process's own.

Every second the process samples its RSS (``/proc/self/status``), open file descriptors
(``/proc/self/fd``) and, on PostgreSQL, its server connections (``pg_stat_activity`` by
``application_name``); every step's latency (a run's time over its steps) is recorded. After a
warm-up (the first fifth of the run), the report gives per window: throughput, p50/p99 step
latency, RSS, fds and connections; and the verdict:

- memory growth (least-squares slope of RSS) < 0.5 MB/min;
- open files and connections flat (at most +2 over the first window after warm-up);
- p99 drift (p99 of the last third over the first third) <= 1.2x.

Exit status 0 when every backend passes, 1 otherwise. PostgreSQL needs ``--dsn`` or
``GRAPHEXEC_TEST_POSTGRES_DSN``; a schema is created for the run and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import operator
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

MAX_GROWTH_MB_PER_MIN = 0.5
MAX_P99_DRIFT = 1.2
FLAT_TOLERANCE = 2
WARMUP_FRACTION = 0.2


# -- the workload ---------------------------------------------------------------------------------


class SoakState(TypedDict):
    log: Annotated[list[str], operator.add]
    n: int
    answer: str


def build_graph(cp: Any) -> Any:
    from graphexec import END, START, Send, StateGraph, interrupt

    chain = [f"s{i}" for i in range(8)]

    def step(name: str) -> Any:
        async def node(state: SoakState) -> dict[str, Any]:
            return {"log": [f"{name}:{state['n']}" + "x" * 64], "n": state["n"] + 1}

        return node

    async def part(i: int) -> dict[str, Any]:
        return {"log": [f"part{i}"]}

    def ask(state: SoakState) -> dict[str, Any]:
        return {"answer": str(interrupt("ok?"))}

    def route(state: SoakState) -> Any:
        if state["n"] % 3 == 0:
            return [Send("part", i) for i in range(4)]
        return "s4"

    b = StateGraph(SoakState)
    for name in chain:
        b.add_node(name, step(name))
    b.add_node("part", part)
    b.add_node("ask", ask)
    b.add_edge(START, "s0")
    b.add_sequence(chain[:4])
    b.add_conditional_edges("s3", route, ["part", "s4"])
    b.add_edge("part", "s4")
    b.add_sequence(chain[4:])
    b.add_conditional_edges("s7", lambda s: "ask" if s["n"] % 5 == 0 else "__end__")
    b.add_edge("ask", END)
    return b.compile(checkpointer=cp)


# -- measurements ---------------------------------------------------------------------------------


def rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")  # pragma: no cover - Linux always has it


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Histogram:
    """Latencies in log-spaced buckets (2% wide, 1 us .. 100 s): constant memory, however long.

    A soak must not grow by what it measures: keeping every sample would itself look like a leak.
    """

    RATIO = 1.02
    LOW = 1e-6
    SIZE = 940  # LOW * RATIO**SIZE > 100 s

    def __init__(self) -> None:
        self.counts = [0] * (self.SIZE + 1)
        self.n = 0

    def add(self, seconds: float, count: int = 1) -> None:
        i = 0 if seconds <= self.LOW else int(math.log(seconds / self.LOW, self.RATIO)) + 1
        self.counts[min(i, self.SIZE)] += count
        self.n += count

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.n += other.n

    def percentile(self, q: float) -> float:
        if not self.n:
            return float("nan")
        rank = q * (self.n - 1)
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen > rank:
                return self.LOW * self.RATIO**i  # the bucket's upper bound
        return self.LOW * self.RATIO**self.SIZE


def slope_per_minute(points: Sequence[tuple[float, float]]) -> float:
    if len(points) < 3:
        return 0.0
    xs = [t / 60 for t, _ in points]
    ys = [v for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


@dataclass
class Window:
    start: float
    steps: int
    p50_ms: float
    p99_ms: float
    rss_mb: float
    fds: int
    connections: int | None


@dataclass
class Report:
    backend: str
    seconds: float
    runs: int = 0
    steps: int = 0
    errors: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    throughput: float = 0.0
    growth_mb_per_min: float = 0.0
    p99_first_ms: float = 0.0
    p99_last_ms: float = 0.0
    p99_drift: float = 0.0
    fds_first: int = 0
    fds_max: int = 0
    connections_first: int | None = None
    connections_max: int | None = None
    passed: bool = False
    problems: list[str] = field(default_factory=list)
    limits: dict[str, float] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def open_store(backend: str, dsn: str | None, folder: Path, tag: str) -> AsyncIterator[Any]:
    if backend == "sqlite":
        from checkpointers import SqliteCheckpointer

        async with SqliteCheckpointer.open(folder / "soak.db") as cp:
            yield cp
        return
    import psycopg

    from checkpointers import PostgresCheckpointer

    assert dsn is not None
    schema = f"gxsoak_{uuid.uuid4().hex[:12]}"
    tagged = dsn + ("&" if "?" in dsn else "?") + f"application_name={tag}"
    try:
        async with PostgresCheckpointer.open(tagged, schema=schema, pool_max=8) as cp:
            yield cp
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def server_connections(dsn: str, tag: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (tag,)
        ).fetchone()
    return int(row[0]) if row else 0


async def soak(
    backend: str,
    seconds: float,
    *,
    dsn: str | None,
    concurrency: int,
    keep: int,
    window: float,
    limits: dict[str, float],
) -> Report:
    from graphexec import Command

    report = Report(backend, seconds)
    tag = f"gxsoak-{uuid.uuid4().hex[:8]}"
    windows = max(1, math.ceil(seconds / window - 1e-9))
    latencies = [Histogram() for _ in range(windows)]  # per window: per-step seconds
    steps_in = [0] * windows
    samples: list[tuple[float, float, int, int | None]] = []  # (time, rss, fds, connections)
    with tempfile.TemporaryDirectory(prefix="gxsoak-") as tmp:
        async with open_store(backend, dsn, Path(tmp), tag) as cp:
            graph = build_graph(cp)
            t0 = time.monotonic()
            stop = t0 + seconds
            finished: list[str] = []
            counter = 0

            async def one_run() -> None:
                nonlocal counter
                counter += 1
                thread = f"t{counter}"
                started = time.monotonic()
                result = await graph.arun({"log": [], "n": counter, "answer": ""}, thread_id=thread)
                if result.status == "interrupted":
                    result = await graph.arun(Command(resume="yes"), thread_id=thread)
                elapsed = time.monotonic() - started
                if result.status != "done":
                    report.errors.append(f"{thread}: {result.status} {result.error!r}")
                    return
                steps = len(await graph.aget_state_history(thread, limit=50))
                report.runs += 1
                report.steps += steps
                w = min(int((started - t0) / window), windows - 1)
                latencies[w].add(elapsed / max(steps, 1), steps)
                steps_in[w] += steps
                finished.append(thread)
                if len(finished) > keep:
                    await graph.adelete_thread(finished.pop(0))

            async def loop() -> None:
                while time.monotonic() < stop:
                    try:
                        await one_run()
                    except Exception as e:  # recorded: a soak must not stop on the first error
                        report.errors.append(f"{type(e).__name__}: {e}")

            async def sampler() -> None:
                while time.monotonic() < stop:
                    conns = (
                        await asyncio.to_thread(server_connections, dsn, tag)
                        if backend == "postgres" and dsn
                        else None
                    )
                    samples.append((time.monotonic() - t0, rss_mb(), open_fds(), conns))
                    await asyncio.sleep(1.0)

            await asyncio.gather(sampler(), *(loop() for _ in range(concurrency)))
    return analyse(report, latencies, steps_in, samples, window, **limits)


def analyse(
    report: Report,
    latencies: list[Histogram],
    steps_in: list[int],
    samples: list[tuple[float, float, int, int | None]],
    window: float,
    *,
    max_growth: float = MAX_GROWTH_MB_PER_MIN,
    max_drift: float = MAX_P99_DRIFT,
) -> Report:
    seconds = report.seconds
    warm = seconds * WARMUP_FRACTION
    report.throughput = report.steps / seconds
    for i, hist in enumerate(latencies):
        start, end = i * window, (i + 1) * window
        smp = [s for s in samples if start <= s[0] < end] or samples[-1:]
        report.windows.append(
            Window(
                start=round(start, 1),
                steps=steps_in[i],
                p50_ms=round(hist.percentile(0.5) * 1e3, 3),
                p99_ms=round(hist.percentile(0.99) * 1e3, 3),
                rss_mb=round(smp[-1][1], 2) if smp else float("nan"),
                fds=smp[-1][2] if smp else -1,
                connections=smp[-1][3] if smp else None,
            )
        )
    steady = [s for s in samples if s[0] >= warm]
    report.growth_mb_per_min = round(slope_per_minute([(t, r) for t, r, _, _ in steady]), 3)
    # p99 drift: the windows after warm-up, first third against last third
    after = [h for i, h in enumerate(latencies) if i * window >= warm - 1e-9]
    third = max(1, len(after) // 3)
    first, last = Histogram(), Histogram()
    for h in after[:third]:
        first.merge(h)
    for h in after[-third:]:
        last.merge(h)
    report.p99_first_ms = round(first.percentile(0.99) * 1e3, 3)
    report.p99_last_ms = round(last.percentile(0.99) * 1e3, 3)
    report.p99_drift = round(report.p99_last_ms / report.p99_first_ms, 3) if first.n else 0.0
    if steady:
        report.fds_first = steady[0][2]
        report.fds_max = max(s[2] for s in steady)
        conns = [s[3] for s in steady if s[3] is not None]
        if conns:
            report.connections_first, report.connections_max = conns[0], max(conns)
    problems = report.problems
    if report.errors:
        problems.append(f"{len(report.errors)} errors, first: {report.errors[0]}")
    if report.runs == 0:
        problems.append("no run finished")
    if report.growth_mb_per_min >= max_growth:
        problems.append(f"memory grows {report.growth_mb_per_min} MB/min")
    if report.fds_max > report.fds_first + FLAT_TOLERANCE:
        problems.append(f"open files grew from {report.fds_first} to {report.fds_max}")
    if report.connections_max is not None and report.connections_first is not None:
        if report.connections_max > report.connections_first + FLAT_TOLERANCE:
            problems.append(
                f"connections grew from {report.connections_first} to {report.connections_max}"
            )
    if max_drift and report.p99_drift > max_drift:
        problems.append(f"p99 drifted {report.p99_drift}x")
    report.passed = not problems
    report.limits = {"growth_mb_per_min": max_growth, "p99_drift": max_drift}
    return report


def format_report(r: Report) -> str:
    lines = [
        f"== {r.backend}: {r.seconds:.0f} s, {r.runs} runs, {r.steps} steps, "
        f"{r.throughput:.1f} steps/s, {len(r.errors)} errors",
        f"{'t (s)':>7} {'steps':>7} {'p50 ms':>8} {'p99 ms':>8} {'RSS MB':>8} {'fds':>5} "
        f"{'conns':>6}",
    ]
    for w in r.windows:
        conns = "-" if w.connections is None else str(w.connections)
        lines.append(
            f"{w.start:7.0f} {w.steps:7d} {w.p50_ms:8.3f} {w.p99_ms:8.3f} {w.rss_mb:8.1f} "
            f"{w.fds:5d} {conns:>6}"
        )
    conns = (
        ""
        if r.connections_first is None
        else f", connections {r.connections_first} -> max {r.connections_max}"
    )
    lines.append(
        f"memory growth {r.growth_mb_per_min:+.3f} MB/min (limit "
        f"{r.limits.get('growth_mb_per_min')}), p99 {r.p99_first_ms:.3f} -> {r.p99_last_ms:.3f} "
        f"ms (drift {r.p99_drift}x, limit {r.limits.get('p99_drift')}), fds {r.fds_first} -> max "
        f"{r.fds_max}{conns}"
    )
    lines.append("PASS" if r.passed else "FAIL: " + "; ".join(r.problems))
    return "\n".join(lines)


# -- command line ----


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__.split("\n")[0]
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="duration (default 10)")
    length.add_argument("--seconds", type=float, help="duration in seconds")
    p.add_argument("--backend", default="sqlite,postgres", help="sqlite,postgres")
    p.add_argument("--dsn", default=os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN"))
    p.add_argument("--concurrency", type=int, default=4, help="runs in flight per backend")
    p.add_argument("--keep", type=int, default=200, help="finished threads kept (retention)")
    p.add_argument("--window", type=float, help="report window in seconds (default: 1/10)")
    p.add_argument("--json", type=Path, help="also write the reports here")
    p.add_argument(
        "--max-growth", type=float, default=MAX_GROWTH_MB_PER_MIN, help="RSS MB/min limit"
    )
    p.add_argument(
        "--max-drift", type=float, default=MAX_P99_DRIFT, help="p99 drift limit (0: report only)"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    seconds = args.seconds if args.seconds else 60 * (args.minutes or 10)
    window = args.window or max(seconds / 10, 1.0)
    if args.child:
        report = asyncio.run(
            soak(
                args.child,
                seconds,
                dsn=args.dsn,
                concurrency=args.concurrency,
                keep=args.keep,
                window=window,
                limits={"max_growth": args.max_growth, "max_drift": args.max_drift},
            )
        )
        print(json.dumps(asdict(report)), flush=True)
        return 0
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    for b in backends:
        if b not in ("sqlite", "postgres"):
            raise SystemExit(f"unknown backend {b!r}: choose sqlite, postgres")
        if b == "postgres" and not args.dsn:
            raise SystemExit("postgres needs --dsn or GRAPHEXEC_TEST_POSTGRES_DSN")
    root = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    )
    common = ["--seconds", str(seconds), "--concurrency", str(args.concurrency)]
    common += ["--keep", str(args.keep), "--window", str(window)]
    common += ["--max-growth", str(args.max_growth), "--max-drift", str(args.max_drift)]
    if args.dsn:
        common += ["--dsn", args.dsn]
    procs = {
        b: subprocess.Popen(
            [sys.executable, "-m", "benchmarks.soak", "--child", b, *common],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=root,
        )
        for b in backends
    }
    print(f"soak: {', '.join(backends)} for {seconds:.0f} s ...", flush=True)
    reports = []
    for b, proc in procs.items():
        out, _ = proc.communicate(timeout=seconds + 300)
        if proc.returncode != 0 or not out.strip():
            print(f"== {b}: the soak process failed ({proc.returncode})")
            return 1
        data = json.loads(out.strip().splitlines()[-1])
        data["windows"] = [Window(**w) for w in data["windows"]]
        reports.append(Report(**data))
    for r in reports:
        print(format_report(r))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=2))
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
