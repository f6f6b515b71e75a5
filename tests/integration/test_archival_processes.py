"""Two processes inserting into one archival SQLite file at the same time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from graphexec.testing import assert_eventually
from memory._sqlite_archival import SqliteArchivalStore

ROOT = Path(__file__).resolve().parents[2]
PER_WORKER = 150

# Each worker waits at a file-system gate so both write at once, then inserts PER_WORKER
# passages (some in bulk, some one by one with op keys that both workers share) and searches.
WORKER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from pathlib import Path
    from memory._archival_common import NewPassage
    from memory._sqlite_archival import SqliteArchivalStore

    db, gate, name, count = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])

    async def main():
        async with SqliteArchivalStore.open(db, namespace=("shared",)) as store:
            (gate / f"ready-{name}").touch()
            while not (gate / "go").exists():
                time.sleep(0.002)
            half = count // 2
            bulk = [NewPassage(f"{name} bulk note {i} about ferries", tags=[name])
                    for i in range(half)]
            ids = await store.insert_many(bulk, batch_size=16)
            for i in range(half, count):
                ids.append(await store.insert(f"{name} single note {i} about ferries", tags=[name]))
            shared = [await store.insert(f"shared step {i}", op_key=f"step-{i}") for i in range(10)]
            page = await store.search("ferries note", tags=[name], top_k=5)
            print(json.dumps({"ids": ids, "shared": shared, "found": len(page.hits)}))

    asyncio.run(main())
    """
)


def _start(db: Path, gate: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(db), str(gate), name, str(PER_WORKER)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def test_two_processes_insert_into_one_file(tmp_path: Path) -> None:
    db = tmp_path / "memory.db"
    gate = tmp_path / "gate"
    gate.mkdir()
    procs = [_start(db, gate, name) for name in ("alpha", "beta")]

    async def ready() -> None:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a worker exited early: {[p.communicate() for p in procs]}")
        assert len(list(gate.glob("ready-*"))) == 2

    await assert_eventually(ready, timeout=60)
    (gate / "go").touch()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))

    alpha, beta = results
    assert len(set(alpha["ids"]) | set(beta["ids"])) == 2 * PER_WORKER
    assert alpha["shared"] == beta["shared"], "op keys must be idempotent across processes"
    assert alpha["found"] == beta["found"] == 5
    async with SqliteArchivalStore.open(db, namespace=("shared",)) as store:
        seen: list[str] = []
        cursor = None
        while True:
            page = await store.list(limit=1000, cursor=cursor)
            seen += [h.passage.id for h in page.hits]
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(seen) == sorted({*alpha["ids"], *beta["ids"], *alpha["shared"]})
        for name, result in (("alpha", alpha), ("beta", beta)):
            page = await store.search("ferries note", tags=[name], top_k=1000)
            assert sorted(h.passage.id for h in page.hits) == sorted(result["ids"])
