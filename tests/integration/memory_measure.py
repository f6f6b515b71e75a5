"""Measure the SQLite (or PostgreSQL) memory tiers (a script run by hand, not a test).

    python tests/integration/memory_measure.py [--quick] [--items N] [--dsn postgresql://...]

Prints, on a temporary file (``synchronous=NORMAL``, the default) -- or, with ``--dsn``, on a
fresh PostgreSQL schema dropped afterwards:

1. Loading a session of N items (default 100,000; ~120-byte chat messages) with ``add_items``
   batches of 1,000, and the file size.
2. ``get_items(limit=20)`` latency (p50/p95/max over 1,000 calls) on that session, then again
   after ``evict_oldest`` has moved 90% of it out of the context, and ``get_items()`` of a
   200-item session.
3. Recall search latency (p50/p95) over those N items, unfiltered and filtered to the session.
4. Fact ``put`` and ``get`` throughput (sequential awaited calls, 2,000 each; puts in 100
   namespaces) and 20-way concurrent ``put`` throughput.
5. Block ``append`` throughput, sequential and 20-way concurrent on one block.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from memory import Block, PostgresMemory, SqliteMemory

WORDS = (
    "flight hotel lisbon paris booking refund seat aisle window meal vegetarian train "
    "ticket price change cancel luggage passport visa airport transfer taxi museum"
).split()


def message(rng: random.Random, i: int) -> dict[str, Any]:
    text = " ".join(rng.choice(WORDS) for _ in range(14))
    return {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {text}"}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(calls: int, fn: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await fn(i)
        out.append((time.perf_counter() - start) * 1000)
    return out


def report(label: str, ms: list[float]) -> None:
    print(
        f"  {label:<44} p50 {pct(ms, 0.5):7.3f} ms   p95 {pct(ms, 0.95):7.3f} ms   "
        f"max {max(ms):7.3f} ms"
    )


@asynccontextmanager
async def opened(dsn: str | None, tmp: str) -> AsyncIterator[Any]:
    """A SqliteMemory on a file in ``tmp``, or a PostgresMemory on a fresh schema."""
    if dsn is None:
        async with SqliteMemory.open(Path(tmp) / "memory.db") as mem:
            yield mem
        return
    import psycopg
    import psycopg.sql

    schema = f"memory_measure_{uuid.uuid4().hex[:12]}"
    try:
        async with PostgresMemory.open(dsn, schema=schema) as mem:
            yield mem
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            drop = psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
            await conn.execute(drop.format(psycopg.sql.Identifier(schema)))


async def storage_mb(mem: Any, tmp: str) -> float:
    if isinstance(mem, SqliteMemory):
        return sum(f.stat().st_size for f in Path(tmp).iterdir()) / 1e6
    [(size,)] = await mem._db.fetch(
        "size",
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c"
        " JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname = :schema AND c.relkind = 'r'",
        {"schema": mem.schema},
    )
    return int(size) / 1e6


async def main(items: int, quick: bool, dsn: str | None) -> None:
    rng = random.Random(7)
    calls = 200 if quick else 1000
    with tempfile.TemporaryDirectory() as tmp:
        async with opened(dsn, tmp) as mem:
            print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {mem!r}")
            session = mem.session("big")
            start = time.perf_counter()
            for base in range(0, items, 1000):
                batch = [message(rng, i) for i in range(base, min(items, base + 1000))]
                await session.add_items(batch)
            load = time.perf_counter() - start
            size = await storage_mb(mem, tmp)
            print(f"\n1. session of {items:,} items")
            print(f"  loaded in {load:.1f} s ({items / load:,.0f} items/s); storage {size:.1f} MB")

            print("\n2. get_items")
            report(
                f"get_items(limit=20), {items:,} live",
                await timed(calls, lambda _: session.get_items(limit=20)),
            )
            await session.evict_oldest(items * 9 // 10, {"role": "system", "content": "summary"})
            report(
                f"get_items(limit=20), {items // 10:,} live of {items:,}",
                await timed(calls, lambda _: session.get_items(limit=20)),
            )
            small = mem.session("small")
            await small.add_items([message(rng, i) for i in range(200)])
            report(
                "get_items() of a 200-item session", await timed(calls, lambda _: small.get_items())
            )

            print(f"\n3. recall search over {items + 200:,} items (top_k=10)")
            queries = [" ".join(rng.sample(WORDS, 2)) for _ in range(50)]
            n = 50 if quick else 200
            report("two-word query", await timed(n, lambda i: mem.recall.search(queries[i % 50])))
            report(
                "two-word query, session='small'",
                await timed(n, lambda i: mem.recall.search(queries[i % 50], session_id="small")),
            )
            report(
                "rare token ('1234')",
                await timed(n, lambda _: mem.recall.search("1234")),
            )

            print("\n4. facts")
            count = 500 if quick else 2000
            start = time.perf_counter()
            for i in range(count):
                await mem.facts.put(
                    ("user", str(i % 100)), f"key{i // 100}", {"v": i}, source="measure"
                )
            put_rate = count / (time.perf_counter() - start)
            start = time.perf_counter()
            for i in range(count):
                await mem.facts.get(("user", str(i % 100)), f"key{i // 100}")
            get_rate = count / (time.perf_counter() - start)
            start = time.perf_counter()
            for base in range(0, count, 20):
                await asyncio.gather(
                    *(mem.facts.put(("conc",), f"k{j}", j) for j in range(base, base + 20))
                )
            conc_rate = count / (time.perf_counter() - start)
            print(f"  put  {put_rate:8,.0f}/s sequential   {conc_rate:8,.0f}/s 20 concurrent")
            print(f"  get  {get_rate:8,.0f}/s sequential")
            report(
                "summary(('user','7'), 2000)",
                await timed(calls, lambda _: mem.facts.summary(("user", "7"), 2000)),
            )
            report(
                "search(('user','7'), 'key')",
                await timed(calls, lambda _: mem.facts.search(("user", "7"), "key")),
            )

            print("\n5. blocks")
            await mem.blocks.create(Block("log", "", limit=10_000_000))
            n = 500 if quick else 2000
            start = time.perf_counter()
            for i in range(n):
                await mem.blocks.append("log", f"line {i}")
            seq_rate = n / (time.perf_counter() - start)
            start = time.perf_counter()
            for base in range(0, n, 20):
                await asyncio.gather(
                    *(mem.blocks.append("log", f"c{j}") for j in range(base, base + 20))
                )
            conc_rate = n / (time.perf_counter() - start)
            print(f"  append {seq_rate:8,.0f}/s sequential   {conc_rate:8,.0f}/s 20 concurrent")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, 10k items")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--dsn", help="measure PostgreSQL (a fresh schema in this database)")
    args = parser.parse_args()
    asyncio.run(main(args.items or (10_000 if args.quick else 100_000), args.quick, args.dsn))
