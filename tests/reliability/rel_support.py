"""Shared machinery of the reliability battery (not a test module).

- :data:`PROFILE` / :data:`SEED`: ``GRAPHEXEC_RELIABILITY_PROFILE=quick|long`` (default quick)
  and ``GRAPHEXEC_RELIABILITY_SEED`` (default: derived from the clock; printed in the header and
  the summary so a failure can be replayed with the same seed).
- :data:`STATS`: the counters the terminal summary prints (kills, faults, hostile inputs, SQL).
- :class:`SqlRecorder`: every SQL text the stores send to SQLite (through the connection proxy
  :func:`checkpointers._sqlite_db._on_thread` and ``_on_loop`` hand to transaction bodies)
  and to PostgreSQL (psycopg's async cursors), before parameters are bound.
- :class:`AuditGuard`: a process-wide ``sys.addaudithook`` that, while armed, records every
  event that would mean stored bytes made this process run code (``os.system``,
  ``subprocess.Popen``, ``exec``, ``compile``, ``pickle.find_class``, new imports, ...) or
  touch the canary file.
- :data:`INJECTIONS`: SQL-injection strings, each carrying a unique marker, so that the SQL
  audit can tell a user string pasted into SQL text from legitimate SQL.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE = os.environ.get("GRAPHEXEC_RELIABILITY_PROFILE", "quick").strip().lower() or "quick"
if PROFILE not in ("quick", "long"):
    raise SystemExit(f"GRAPHEXEC_RELIABILITY_PROFILE must be quick or long, got {PROFILE!r}")
LONG = PROFILE == "long"
SEED = int(os.environ.get("GRAPHEXEC_RELIABILITY_SEED") or (time.time_ns() // 1000) % 10**9)

INTEGRATION = Path(__file__).resolve().parent.parent / "integration"
if str(INTEGRATION) not in sys.path:  # reuse sqlite_worker / pg_worker helpers
    sys.path.insert(0, str(INTEGRATION))


def rng_for(name: str) -> random.Random:
    """A generator seeded from :data:`SEED` and ``name``: stable per test, whatever runs first."""
    return random.Random(f"{SEED}:{name}")


@dataclass
class Stats:
    """What the battery did, for the terminal summary."""

    kills: int = 0
    resumes: int = 0
    missed_kills: int = 0
    faults: int = 0
    hostile: int = 0
    lost: int = 0
    effects_deduplicated: int = 0
    sql_checked: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    soak: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, n: int = 1, *, kind: str | None = None) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + n)
            if kind is not None:
                self.by_kind[kind] += n


STATS = Stats()


# -- SQL text recording ----


class SqlRecorder:
    """Collects SQL texts (never parameters) sent by the stores under test."""

    def __init__(self) -> None:
        self.statements: Counter[str] = Counter()
        self._lock = threading.Lock()

    def record(self, query: Any) -> None:
        text = query if isinstance(query, str) else repr(query)
        with self._lock:
            self.statements[text] += 1

    @property
    def total(self) -> int:
        return sum(self.statements.values())


RECORDER = SqlRecorder()


class _RecordingConnection:
    """A ``sqlite3.Connection`` stand-in that records statement texts and can inject faults."""

    __slots__ = ("_real",)

    def __init__(self, real: Any) -> None:
        self._real = real

    def execute(self, sql: str, params: Any = ()) -> Any:
        RECORDER.record(sql)
        SQLITE_FAULTS.maybe_fail(sql)
        return self._real.execute(sql, params)

    def executemany(self, sql: str, params: Any) -> Any:
        RECORDER.record(sql)
        SQLITE_FAULTS.maybe_fail(sql)
        return self._real.executemany(sql, params)

    def executescript(self, sql: str) -> Any:
        RECORDER.record(sql)
        SQLITE_FAULTS.maybe_fail(sql)
        return self._real.executescript(sql)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class SqliteFaults:
    """Fails the ``fail_at``-th SQLite statement (counted from :meth:`arm`) with ``error``."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_at: int | None = None
        self.error: Callable[[], Exception] | None = None
        self.fired: list[str] = []
        self._lock = threading.Lock()

    def arm(self, fail_at: int | None, error: Callable[[], Exception] | None) -> None:
        with self._lock:
            self.calls = 0
            self.fail_at = fail_at
            self.error = error
            self.fired = []

    def disarm(self) -> None:
        self.arm(None, None)

    def maybe_fail(self, sql: str) -> None:
        with self._lock:
            self.calls += 1
            if self.fail_at is None or self.calls != self.fail_at or self.error is None:
                return
            self.fired.append(sql)
            error = self.error
        raise error()


SQLITE_FAULTS = SqliteFaults()


def install_recorders() -> Callable[[], None]:
    """Route the stores' SQLite and PostgreSQL statements through the recorder; returns undo."""
    from checkpointers import _sqlite_db

    undo: list[Callable[[], None]] = []
    original_on_thread = _sqlite_db._on_thread

    async def on_thread(conn: Any, fn: Callable[[Any], Any]) -> Any:
        return await original_on_thread(conn, lambda db: fn(_RecordingConnection(db)))

    _sqlite_db._on_thread = on_thread  # type: ignore[assignment]
    undo.append(lambda: setattr(_sqlite_db, "_on_thread", original_on_thread))

    # Small writes run on the loop's own connection (SqliteDatabase.write): same proxy.
    original_on_loop = _sqlite_db._on_loop

    def on_loop(db: Any, fn: Callable[[Any], Any]) -> Any:
        return original_on_loop(db, lambda real: fn(_RecordingConnection(real)))

    _sqlite_db._on_loop = on_loop
    undo.append(lambda: setattr(_sqlite_db, "_on_loop", original_on_loop))

    with contextlib.suppress(ImportError):
        import psycopg

        cursor = psycopg.AsyncCursor
        original_execute = cursor.execute
        original_executemany = cursor.executemany

        async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            RECORDER.record(_pg_text(query, self))
            return await original_execute(self, query, *args, **kwargs)

        async def executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            RECORDER.record(_pg_text(query, self))
            return await original_executemany(self, query, *args, **kwargs)

        cursor.execute = execute  # type: ignore[method-assign]
        cursor.executemany = executemany  # type: ignore[method-assign]
        undo.append(lambda: setattr(cursor, "execute", original_execute))
        undo.append(lambda: setattr(cursor, "executemany", original_executemany))

    def restore() -> None:
        for step in reversed(undo):
            step()

    return restore


def _pg_text(query: Any, cursor: Any) -> str:
    if isinstance(query, (str, bytes)):
        return query if isinstance(query, str) else query.decode(errors="replace")
    try:
        return str(query.as_string(cursor))
    except Exception:
        return repr(query)


# -- hostile strings ----

MARKER = "gxinj"
"""Every injection string carries ``gxinj<NN>``; no legitimate SQL text contains it."""

_PAYLOADS = [
    "x' OR '1'='1",
    "x'); DROP TABLE graphexec_checkpoints; --",
    'x"; DROP TABLE graphexec_heads; --',
    "x' UNION SELECT sqlite_version(), 1, 2 --",
    "x'||(SELECT version())||'",
    "x'; SELECT pg_sleep(5); --",
    "x$$; DROP SCHEMA public CASCADE; $$",
    "x%' OR thread_id LIKE '%",
    "x_%",
    "x\\'; DELETE FROM graphexec_writes; --",
    "x' AND 1=(SELECT COUNT(*) FROM sqlite_master) --",
    "x'/**/OR/**/1=1/**/--",
    "x' OR 1=1 LIMIT 1 OFFSET 0 --",
    "x:thread_id %(thread_id)s ? $1",
    "x'; COPY (SELECT '') TO PROGRAM 'touch /tmp/gx-canary'; --",
    "x\u2019 OR \u20181\u2019=\u20181",
    "x'; ATTACH DATABASE '/tmp/gx-evil.db' AS evil; --",
    "x' OR json_extract(metadata, '$.a') IS NULL --",
]
INJECTIONS: list[str] = [p.replace("x", f"{MARKER}{i:02d}", 1) for i, p in enumerate(_PAYLOADS)]
"""SQL-injection strings; each starts with (or contains) its own marker."""


# -- the audit-hook guard --------------------------------------------------------------------------

_FORBIDDEN_PREFIXES = (
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.startfile",
    "subprocess.Popen",
    "pty.spawn",
    "pickle.find_class",
    "marshal.loads",
    "ctypes.",
    "code.__new__",
    "exec",
    "compile",
    "builtins.input",
    "webbrowser.open",
    "shutil.",
    "os.remove",
    "os.rename",
    "os.rmdir",
    "os.truncate",
    "os.chmod",
    "socket.connect",
)


class AuditGuard:
    """Records forbidden audit events raised (by any thread) while :meth:`armed` is active."""

    def __init__(self) -> None:
        self.depth = 0
        self.violations: list[str] = []
        self.where: list[str] = []
        self.events_seen = 0
        self.canary: Path | None = None
        self._installed = False
        self._lock = threading.Lock()

    def install(self) -> None:
        if not self._installed:
            sys.addaudithook(self._hook)  # cannot be removed: stays inert while disarmed
            self._installed = True

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.depth:
            return
        self.events_seen += 1
        bad = None
        if event.startswith(_FORBIDDEN_PREFIXES):
            bad = event
        elif event == "import" and args and args[0] not in sys.modules:
            bad = f"import {args[0]}"
        elif event == "open" and args and self.canary is not None:
            with contextlib.suppress(Exception):
                if Path(os.fsdecode(args[0])).name == self.canary.name:
                    bad = f"open {args[0]}"
        if bad is not None:
            import traceback

            where = "".join(traceback.format_stack(limit=8)[:-1])
            with self._lock:
                self.violations.append(bad)
                self.where.append(where)

    @contextlib.contextmanager
    def armed(self, canary: Path) -> Iterator[None]:
        """Arm the guard; on exit raise if a forbidden event happened or the canary exists."""
        self.install()
        before = len(self.violations)
        self.canary = canary
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
        found = self.violations[before:]
        assert not found, (
            f"stored bytes made the process do forbidden things: {found}\n"
            + "\n".join(self.where[before : before + 3])
        )
        assert not canary.exists(), f"the canary {canary} was written"


GUARD = AuditGuard()


def fd_count() -> int:
    """Open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> Counter[str]:
    out: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out[os.readlink(f"/proc/self/fd/{fd}")] += 1
    return out
