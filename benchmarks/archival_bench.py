"""Archival store speed: insert throughput, search latency and file size at scale (SPEC §7).

``python -m benchmarks.archival_bench [--sizes 10000 100000] [--embedder hashing|minilm]
[--dsn postgresql://...]``

For each size, a fresh SQLite file (in a temporary folder) -- or, with ``--dsn``, a fresh
PostgreSQL schema (dropped afterwards) -- is filled with synthetic passages through
``insert_many`` (batches of 512), then 100 queries are timed one by one:

* ``plain``: no filter;
* ``tag (rare)``: ``tags=["rare"]``, a tag on 0.1% of the passages;
* ``tag (common)``: ``tags=[<topic>]``, one of 20 topic tags, each on about 5% of them;
* ``date``: ``after=`` the creation time of the passage in the middle.

Before the timed queries, one search loads the namespace's vectors into memory (reported as
``first search``, i.e. the cost a new process pays once). The text is generated from a fixed
seed: sentences of 8-16 words drawn with a Zipf-like law from common English words and 4,000
made-up words, so full-text posting lists have realistic lengths (a few very common terms,
many rare ones). Queries are 2-5 words drawn from the same law.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from memory._archival_common import NewPassage
from memory._base import ArchivalStore
from memory._sqlite_archival import SqliteArchivalStore
from memory.embedders import Embedder, HashingEmbedder, MiniLMEmbedder

__all__ = ["EMBEDDERS", "QUERIES", "main", "make_embedder", "passages", "queries", "run"]

EMBEDDERS = ("hashing", "minilm")
QUERIES = 100
BATCH = 512
SEED = 20260601
TOPICS = 20
RARE_EVERY = 1000

_COMMON = (
    "report meeting budget travel flight hotel customer refund invoice order team project "
    "deadline server database backup password office kitchen garden school doctor weather "
    "storm train airport contract payment salary vacation holiday laptop printer network "
    "email phone message schedule delivery package warehouse policy approval manager client "
    "support ticket release update error outage morning evening weekend monday friday city "
    "family child parent friend dinner lunch coffee restaurant museum library hospital"
).split()
_GLUE = "the a of to and in on for with at by from after before during about".split()
_SYLLABLES = "ka lo mi ne ru sa ti vo ze bu da fe gi ho ju ly po qu ri xe".split()


def _vocabulary(rng: random.Random, size: int = 4000) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < size:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


class _Words:
    """Draws words with a Zipf-like law (rank r has weight 1/r) over a fixed vocabulary."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.words = _COMMON + _vocabulary(rng)
        rng.shuffle(self.words)
        weights = [1.0 / (r + 1) for r in range(len(self.words))]
        total = sum(weights)
        acc = 0.0
        self.cumulative = []
        for w in weights:
            acc += w / total
            self.cumulative.append(acc)

    def draw(self, rng: random.Random, k: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cumulative, k=k)


def passages(n: int, *, seed: int = SEED) -> list[NewPassage]:
    """``n`` synthetic passages with topic tags, the same on every run.

    Args:
        n: How many.
        seed: Seed of the generator.

    Returns:
        Passages; every one has a ``topic-<k>`` tag, every 1000th also ``rare``.
    """
    vocab = _Words(seed)
    rng = random.Random(seed + 1)
    out: list[NewPassage] = []
    for i in range(n):
        body = vocab.draw(rng, rng.randint(8, 16))
        for _ in range(len(body) // 3):
            body.insert(rng.randrange(len(body)), rng.choice(_GLUE))
        text = " ".join(body).capitalize() + "."
        tags = [f"topic-{rng.randrange(TOPICS)}"]
        if i % RARE_EVERY == RARE_EVERY // 2:
            tags.append("rare")
        out.append(NewPassage(text, tags=tags, metadata={"n": i}))
    return out


def queries(n: int = QUERIES, *, seed: int = SEED) -> list[str]:
    """``n`` synthetic queries of 2-5 words, drawn like the passages' words.

    Args:
        n: How many.
        seed: Seed of the draw (the vocabulary is always :func:`passages`' default one).

    Returns:
        The queries.
    """
    vocab = _Words(SEED)
    rng = random.Random(seed + 1000)
    return [" ".join(vocab.draw(rng, rng.randint(2, 5))) for _ in range(n)]


def make_embedder(name: str) -> Embedder:
    """``hashing`` (the built-in default) or ``minilm`` (the real model, needs its extra)."""
    if name == "hashing":
        return HashingEmbedder()
    if name == "minilm":
        return MiniLMEmbedder()
    raise ValueError(f"unknown embedder {name!r}: choose from {', '.join(EMBEDDERS)}")


def _percentiles(samples: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered) * 1e3, 2), "p95_ms": round(p95 * 1e3, 2)}


async def _timed(store: ArchivalStore, qs: Sequence[str], **kw: Any) -> dict[str, Any]:
    samples: list[float] = []
    empty = 0
    for q in qs:
        t0 = time.perf_counter()
        page = await store.search(q, top_k=10, **kw)
        samples.append(time.perf_counter() - t0)
        empty += not page.hits
    return {**_percentiles(samples), "empty": empty}


@asynccontextmanager
async def _postgres(dsn: str, embedder: Embedder) -> AsyncIterator[Any]:
    """A PostgreSQL archival store on a fresh schema, dropped on exit."""
    import psycopg
    import psycopg.sql

    from memory.postgres import PostgresArchivalStore

    schema = f"archival_bench_{uuid.uuid4().hex[:12]}"
    try:
        async with PostgresArchivalStore.open(dsn, embedder=embedder, schema=schema) as store:
            yield store
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            drop = psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
            await conn.execute(drop.format(psycopg.sql.Identifier(schema)))


_PG_SIZE = """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = :schema AND c.relkind = 'r'"""


async def _one(size: int, embedder: Embedder, folder: Path, dsn: str | None) -> dict[str, Any]:
    path = folder / f"archival-{size}.db"
    items = passages(size)
    opened: Any = (
        SqliteArchivalStore.open(path, embedder=embedder)
        if dsn is None
        else _postgres(dsn, embedder)
    )
    async with opened as store:
        t0 = time.perf_counter()
        await store.insert_many(items, batch_size=BATCH)
        insert_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        await store.search("warm up", top_k=10)
        first_s = time.perf_counter() - t1
        middle = (await store.list(limit=1)).hits[0].passage.created_at
        mid_at: datetime = middle - (middle - (await _oldest(store))) / 2
        result = {
            "passages": size,
            "insert_per_s": round(size / insert_s, 1),
            "insert_s": round(insert_s, 2),
            "first_search_ms": round(first_s * 1e3, 1),
            "search": {
                # Fresh queries per kind: none profits from another's warmed embedder caches.
                "plain": await _timed(store, queries(seed=SEED)),
                "tag (rare)": await _timed(store, queries(seed=SEED + 1), tags=["rare"]),
                "tag (common)": await _timed(store, queries(seed=SEED + 2), tags=["topic-3"]),
                "date": await _timed(store, queries(seed=SEED + 3), after=mid_at),
            },
        }
        if dsn is not None:
            [(size_bytes,)] = await store._shared.db.fetch(
                "bench size", _PG_SIZE, {"schema": store._shared.db.schema}
            )
            result["db_mb"] = round(int(size_bytes) / 2**20, 1)
    if dsn is None:
        files = [path, path.with_name(path.name + "-wal")]
        result["db_mb"] = round(sum(f.stat().st_size for f in files if f.exists()) / 2**20, 1)
    return result


async def _oldest(store: ArchivalStore) -> datetime:
    cursor: str | None = None
    oldest: datetime | None = None
    while True:
        page = await store.list(limit=1000, cursor=cursor)
        if page.hits:
            oldest = page.hits[-1].passage.created_at
        if page.cursor is None:
            break
        cursor = page.cursor
    assert oldest is not None
    return oldest


def run(sizes: Sequence[int], embedder: str, *, dsn: str | None = None) -> dict[str, Any]:
    """Benchmark the SQLite (or, with ``dsn``, the PostgreSQL) archival store at each size.

    Args:
        sizes: Passage counts, e.g. ``(10_000, 100_000)``.
        embedder: ``hashing`` or ``minilm``.
        dsn: A PostgreSQL DSN: benchmark :class:`~memory.PostgresArchivalStore` on a fresh
            schema of that database instead of SQLite.

    Returns:
        A JSON-compatible dict: machine facts, the embedder, and one result per size (insert
        throughput, first-search time, p50/p95 latency per query kind, file size in MiB).
    """
    emb = make_embedder(embedder)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="archival-bench-") as tmp:
        for size in sizes:
            results.append(asyncio.run(_one(size, emb, Path(tmp), dsn)))
    return {
        "backend": "sqlite" if dsn is None else "postgres",
        "embedder": embedder,
        "model": emb.name,
        "queries": QUERIES,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "results": results,
    }


def table(report: dict[str, Any]) -> str:
    """A Markdown table of :func:`run`'s result."""
    kinds = ("plain", "tag (rare)", "tag (common)", "date")
    head = " | ".join(f"{k} p50 / p95 ms" for k in kinds)
    rows = [
        f"| passages | insert/s | first search ms | {head} | DB MiB |",
        "|---:|---:|---:|" + "---:|" * len(kinds) + "---:|",
    ]
    for r in report["results"]:
        cells = " | ".join(
            f"{r['search'][k]['p50_ms']} / {r['search'][k]['p95_ms']}" for k in kinds
        )
        rows.append(
            f"| {r['passages']:,} | {r['insert_per_s']:,.0f} | {r['first_search_ms']} | "
            f"{cells} | {r['db_mb']} |"
        )
    backend = report.get("backend", "sqlite")
    return f"backend: {backend}, embedder: {report['model']}\n\n" + "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the table (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.archival_bench",
        description="Archival store: insert throughput, search p50/p95, database size.",
    )
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--embedder", choices=EMBEDDERS, default="hashing")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--dsn", help="benchmark PostgreSQL (a fresh schema in this database)")
    args = p.parse_args(argv)
    if any(s < 1 for s in args.sizes):
        p.error("sizes must be positive")
    try:
        report = run(args.sizes, args.embedder, dsn=args.dsn)
    except ImportError as e:
        print(f"cannot run {args.embedder}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
