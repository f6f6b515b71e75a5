"""SQLite WAL checkpoints on a background thread, off the commit path (``_sqlite_db``, opt-in:
``wal_checkpoints="background"``).

Real files throughout. What happened is read from the files themselves: in WAL mode a commit
writes only the WAL, so the main database file grows only when a checkpoint copies pages into
it, and the WAL file's size is the most frames it ever held (it is reused from the start after
a complete checkpoint, never shrunk while open). A writer checkpoints by itself only once the WAL
holds ``AUTOCHECKPOINT`` frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sqlite3
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

from checkpointers import SqliteCheckpointer
from checkpointers import _sqlite_db as sqlite_db
from checkpointers._sqlite_db import (
    AUTOCHECKPOINT,
    CHECKPOINT_EVERY,
    WAL_SIZE_LIMIT,
    SqliteDatabase,
    WalCheckpoints,
)
from graphexec.testing import assert_eventually, put_chain
from memory import SqliteSession

MIGRATIONS = [
    "CREATE TABLE IF NOT EXISTS versions (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)",
    "CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
]
THREAD_NAME = "graphexec WAL checkpoints"


def database(path: Path) -> SqliteDatabase:
    return SqliteDatabase(
        path,
        owner=f"Test({path.name})",
        migrations=MIGRATIONS,
        version_table="versions",
        wal_checkpoints="background",
    )


def background(path: Path | str, **kwargs: Any) -> Any:
    """``SqliteCheckpointer.open`` with background WAL checkpoints."""
    return SqliteCheckpointer.open(path, wal_checkpoints="background", **kwargs)


async def insert(db: SqliteDatabase, count: int, size: int = 100) -> None:
    """Commit ``count`` transactions of one row each."""
    for _ in range(count):
        await db.write(
            "insert", lambda c: c.execute("INSERT INTO rows (body) VALUES (randomblob(?))", (size,))
        )


def checkpoints_of(db: SqliteDatabase) -> WalCheckpoints:
    checkpoints = db._checkpoints
    assert checkpoints is not None
    return checkpoints


def wal_threads(path: Path | None = None) -> list[threading.Thread]:
    name = THREAD_NAME if path is None else f"{THREAD_NAME} {path}"
    return [t for t in threading.enumerate() if t.name.startswith(name)]


def wal_frames(path: Path) -> int:
    """The most frames the WAL has held so far (its file is reused, not shrunk)."""
    wal = path.with_name(path.name + "-wal")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        [(page_size,)] = conn.execute("PRAGMA page_size").fetchall()
    return max(0, wal.stat().st_size - 32) // (int(page_size) + 24)


def count_rows(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        [(n,)] = conn.execute("SELECT count(*) FROM rows").fetchall()
    return int(n)


async def caught_up(checkpoints: WalCheckpoints, *, after: int) -> tuple[int, int, int]:
    """Wait for a checkpoint that started after run ``after`` and copied the whole WAL."""

    async def probe() -> tuple[int, int, int]:
        last = checkpoints.last
        assert checkpoints.runs > after and last is not None
        assert last[0] == 0 and last[1] == last[2], last
        return last

    return await assert_eventually(probe)


@contextlib.contextmanager
def unopenable(path: Path) -> Iterator[None]:
    """Put a directory where the database file was; open connections keep working."""
    moved = path.with_name(path.name + ".moved")
    path.rename(moved)
    path.mkdir()
    try:
        yield
    finally:
        path.rmdir()
        moved.rename(path)


# -- the checkpoints run, and not in a commit ---------------------------------------------------


async def test_the_main_file_fills_while_no_commit_checkpoints(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        await db.open()
        empty = path.stat().st_size
        await insert(db, 10 * CHECKPOINT_EVERY, size=1000)
        # Far fewer frames than a writer's autocheckpoint needs: no commit checkpointed.
        assert wal_frames(path) < AUTOCHECKPOINT / 2
        checkpoints = checkpoints_of(db)

        async def copied() -> None:
            assert path.stat().st_size > empty + 10 * CHECKPOINT_EVERY * 1000

        await assert_eventually(copied)
        assert checkpoints.runs >= 1 and checkpoints.failures == 0
    finally:
        await db.aclose()
    assert count_rows(path) == 10 * CHECKPOINT_EVERY


async def test_the_wal_stays_bounded_over_3000_commits(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    logs: list[int] = []
    sizes: list[int] = []
    try:
        for _ in range(3000 // CHECKPOINT_EVERY):
            before = 0 if db._checkpoints is None else db._checkpoints.runs
            await insert(db, CHECKPOINT_EVERY)
            # A complete checkpoint before the next commit lets that commit restart the WAL.
            logs.append((await caught_up(checkpoints_of(db), after=before))[1])
            sizes.append(wal_frames(path))
    finally:
        await db.aclose()
    assert len(logs) == 3000 // CHECKPOINT_EVERY
    assert max(logs) <= 2 * logs[0], logs  # never more than about one batch in the WAL
    assert sizes[-1] <= 2 * sizes[0], sizes
    assert count_rows(path) == 3000


async def test_a_wal_grown_by_a_burst_shrinks_when_writes_pause(tmp_path: Path) -> None:
    """Writes that never pause grow the WAL; the first commit after a pause shrinks it."""
    path = tmp_path / "db.sqlite"
    wal = path.with_name(path.name + "-wal")
    db = database(path)
    try:
        await db.open()
        conns = await db._connections()
        burst = 8 * 1024 * 1024  # 2,048 pages, between the limit and the autocheckpoint
        await conns.writer.execute("PRAGMA wal_autocheckpoint=0")  # no restart meanwhile
        await insert(db, burst // 4096, size=4000)
        assert wal.stat().st_size > burst
        with contextlib.closing(sqlite3.connect(path)) as other:
            [(busy, log, done)] = other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        assert busy == 0 and log == done
        await insert(db, 1)
        assert wal.stat().st_size <= WAL_SIZE_LIMIT
    finally:
        await db.aclose()


async def test_writers_keep_the_autocheckpoint_as_a_safety_net_only(tmp_path: Path) -> None:
    async with background(tmp_path / "cp.db") as cp:
        conns = await cp._db._connections()
        assert list(await conns.writer.execute_fetchall("PRAGMA wal_autocheckpoint")) == [
            (AUTOCHECKPOINT,)
        ]


@pytest.mark.parametrize("synchronous", ["NORMAL", "FULL"])
async def test_the_default_keeps_sqlite_s_own_checkpoints(tmp_path: Path, synchronous: Any) -> None:
    async with SqliteCheckpointer.open(tmp_path / "cp.db", synchronous=synchronous) as cp:
        await put_chain(cp, "t", CHECKPOINT_EVERY + 1)
        assert cp._db._checkpoints is None
        assert wal_threads() == []
        conns = await cp._db._connections()
        assert list(await conns.writer.execute_fetchall("PRAGMA wal_autocheckpoint")) == [(1000,)]


async def test_an_unknown_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="wal_checkpoints"):
        SqliteCheckpointer(tmp_path / "cp.db", wal_checkpoints="sometimes")  # type: ignore[arg-type]


async def test_a_memory_database_has_no_checkpoint_thread() -> None:
    async with background(":memory:") as cp:
        await put_chain(cp, "t", CHECKPOINT_EVERY + 1)
        assert cp._db._checkpoints is None
        assert wal_threads() == []


# -- lifecycle ----------------------------------------------------------------------------------


def hold_first_checkpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event]:
    """Make the checkpoint thread's first checkpoint wait: ``(entered, release)``.

    ``entered`` is set once the thread is inside it; it runs on when ``release`` is set.
    """
    entered, release = threading.Event(), threading.Event()
    connect = WalCheckpoints._connect

    def slow_connect(self: WalCheckpoints) -> sqlite3.Connection:
        entered.set()
        release.wait(10)
        return connect(self)

    monkeypatch.setattr(WalCheckpoints, "_connect", slow_connect)
    return entered, release


async def test_aclose_waits_for_a_running_checkpoint_and_joins_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint in progress when aclose() is called finishes first, without a warning."""
    entered, release = hold_first_checkpoint(monkeypatch)
    path = tmp_path / "db.sqlite"
    db = database(path)
    await insert(db, CHECKPOINT_EVERY)  # the thread starts, and checkpoints
    assert entered.wait(10)
    [thread] = wal_threads(path)
    assert thread.daemon
    checkpoints = checkpoints_of(db)
    assert checkpoints.runs == 0  # still in its first checkpoint
    threading.Timer(0.2, release.set).start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # finishing within the wait warns about nothing
        await db.aclose()
    assert release.is_set()  # aclose returned only after the checkpoint was let go ...
    assert not thread.is_alive()  # ... and had ended
    assert checkpoints.runs == 1 and checkpoints.failures == 0
    assert wal_threads() == []


async def test_aclose_warns_when_a_checkpoint_outlasts_its_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint still running after the wait is said so, never passed over in silence."""
    entered, release = hold_first_checkpoint(monkeypatch)
    monkeypatch.setattr(sqlite_db, "_STOP_TIMEOUT", 0.05)
    path = tmp_path / "db.sqlite"
    db = database(path)
    await insert(db, CHECKPOINT_EVERY)  # the thread starts, and checkpoints
    assert entered.wait(10)
    thread = checkpoints_of(db).thread
    with pytest.warns(RuntimeWarning, match="still running 0.05s after aclose"):
        await db.aclose()
    assert thread.is_alive()
    release.set()
    thread.join(10)
    assert not thread.is_alive()


def own_threads() -> set[threading.Thread]:
    """Alive threads but the event loop's executor (aclose uses it, and it outlives aclose)."""
    return {t for t in threading.enumerate() if not t.name.startswith("asyncio_")}


async def test_stores_opened_and_closed_many_times_leave_no_threads(tmp_path: Path) -> None:
    threads_before = own_threads()
    for i in range(10):
        async with background(tmp_path / "cp.db") as cp:
            await put_chain(cp, f"t{i}", CHECKPOINT_EVERY)
            assert len(wal_threads(tmp_path / "cp.db")) == 1
        assert wal_threads() == []
        async with SqliteSession("s", tmp_path / "memory.db") as session:  # inline: no thread
            for j in range(CHECKPOINT_EVERY):
                await session.add_items([{"role": "user", "content": f"{i}-{j}"}])
            assert wal_threads() == []

    async def connections_stopped() -> None:
        assert own_threads() == threads_before

    await assert_eventually(connections_stopped)


async def test_a_leaked_database_stops_its_thread(tmp_path: Path) -> None:
    cp = SqliteCheckpointer(tmp_path / "cp.db", wal_checkpoints="background")
    await put_chain(cp, "t", CHECKPOINT_EVERY)
    [thread] = wal_threads(tmp_path / "cp.db")
    with pytest.warns(ResourceWarning, match="garbage-collected with open connections"):
        del cp
        gc.collect()

    async def stopped() -> None:
        assert not thread.is_alive()

    await assert_eventually(stopped)


def test_an_unclosed_database_does_not_hang_the_interpreter_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    script = (
        "import asyncio, sys, threading\n"
        "from checkpointers import SqliteCheckpointer\n"
        "from graphexec.testing import put_chain\n"
        "cp = SqliteCheckpointer(sys.argv[1], wal_checkpoints='background')\n"
        f"asyncio.run(put_chain(cp, 't', {CHECKPOINT_EVERY}))\n"
        f"print(sum(t.name.startswith({THREAD_NAME!r}) for t in threading.enumerate()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"  # the thread was alive when the interpreter exited
    with contextlib.closing(sqlite3.connect(path)) as conn:
        [(n,)] = conn.execute("SELECT count(*) FROM graphexec_checkpoints").fetchall()
    assert n == CHECKPOINT_EVERY


# -- sharing the file ---------------------------------------------------------------------------


async def test_several_databases_on_one_file_each_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "cp.db"
    modes: list[Literal["inline", "background"]] = ["background", "background", "inline"]
    cps = [SqliteCheckpointer(path, wal_checkpoints=mode) for mode in modes]
    try:
        await asyncio.gather(
            *(put_chain(cp, f"t{i}", 3 * CHECKPOINT_EVERY) for i, cp in enumerate(cps))
        )
        assert len(wal_threads(path)) == 2  # none for the inline one

        async def all_ran() -> None:
            for cp in cps[:2]:
                checkpoints = checkpoints_of(cp._db)
                assert checkpoints.runs >= 1 and checkpoints.failures == 0, checkpoints

        await assert_eventually(all_ran)
        for i, cp in enumerate(cps):
            got = await cp.get(f"t{i}")
            assert got is not None and len(got.chain) == 3 * CHECKPOINT_EVERY - 1
    finally:
        for cp in cps:
            await cp.aclose()
    assert wal_threads() == []
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_a_long_reader_elsewhere_holds_checkpoints_back_harmlessly(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        await insert(db, 1)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as reader:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM rows").fetchone() == (1,)
            await insert(db, 3 * CHECKPOINT_EVERY - 1)
            checkpoints = checkpoints_of(db)

            async def held_back() -> None:
                last = checkpoints.last
                assert last is not None and last[2] < last[1], last  # not past its snapshot

            await assert_eventually(held_back)
            assert reader.execute("SELECT count(*) FROM rows").fetchone() == (1,)
            reader.execute("COMMIT")
        runs = checkpoints.runs
        await insert(db, CHECKPOINT_EVERY)
        await caught_up(checkpoints, after=runs)
        assert checkpoints.failures == 0
    finally:
        await db.aclose()
    assert count_rows(path) == 4 * CHECKPOINT_EVERY


# -- failures -----------------------------------------------------------------------------------


async def test_a_failing_checkpoint_is_reported_once_by_the_next_write(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        await insert(db, 1)
        with unopenable(path):
            await insert(db, CHECKPOINT_EVERY - 1)  # wakes the thread: it cannot connect
            checkpoints = checkpoints_of(db)

            async def failed(times: int) -> None:
                assert checkpoints.failures >= times

            await assert_eventually(lambda: failed(1))
            assert isinstance(checkpoints.error, sqlite3.OperationalError)
            with pytest.warns(RuntimeWarning, match=r"background WAL checkpoints of .* failed"):
                await insert(db, 1)
            await insert(db, CHECKPOINT_EVERY)  # fails again: warnings are errors in the tests
            await assert_eventually(lambda: failed(2))
            await insert(db, 1)
        runs = checkpoints.runs
        await insert(db, CHECKPOINT_EVERY)  # the file is back: the next checkpoint works
        await caught_up(checkpoints, after=runs)
    finally:
        await db.aclose()  # already reported: no second warning
    assert count_rows(path) == 3 * CHECKPOINT_EVERY + 2


async def test_a_failure_no_write_reported_is_reported_by_aclose(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    db = database(path)
    try:
        await insert(db, 1)
        with unopenable(path):
            await insert(db, CHECKPOINT_EVERY - 1)
            checkpoints = checkpoints_of(db)

            async def failed() -> None:
                assert checkpoints.failures >= 1

            await assert_eventually(failed)
    finally:
        with pytest.warns(RuntimeWarning, match="unable to open database file"):
            await db.aclose()
    assert count_rows(path) == CHECKPOINT_EVERY
