"""What every command shares: errors and exit codes, storage, graphs, input, output."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from graphexec._checkpoint import BaseCheckpointer
from graphexec._graph import CompiledGraph
from graphexec._types import RunResult

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "Progress",
    "dump_json",
    "graph_for",
    "json_arg",
    "load_graph",
    "open_store",
    "print_result",
    "short",
    "table",
    "to_plain",
]

EXIT_OK = 0
"""The command did what was asked (a run finished)."""
EXIT_FAILED = 1
"""A run failed (a node raised), or a queued run being waited for failed."""
EXIT_USAGE = 2
"""A user mistake: bad arguments, a missing database, an unknown thread or checkpoint."""
EXIT_INTERRUPTED = 3
"""A run paused for a human (an approval, an ``interrupt()`` or a breakpoint)."""

GRAPH_VARIABLE = "GRAPHEXEC_GRAPH"
DB_VARIABLE = "GRAPHEXEC_DB"
DSN_VARIABLE = "GRAPHEXEC_DSN"
DEFAULT_DB = "graphexec.db"
KEYS_VARIABLE = "GRAPHEXEC_ENCRYPTION_KEYS"


class CliError(Exception):
    """A user mistake: reported as one line on stderr, exit status 2, nothing written."""


# -- graphs ---------------------------------------------------------------------------------


def load_graph(spec: str) -> tuple[str, CompiledGraph[Any]]:
    """Import ``[name=]module:attribute`` and return ``(name, graph)``.

    The attribute may be a compiled graph, a ``StateGraph`` (compiled here) or a zero-argument
    function returning either. The name defaults to the graph's ``name``. The named module is
    taken from the current directory when it is there, and nothing else is (see
    :func:`_import_from_cwd`).
    """
    from graphexec._builder import StateGraph

    name, _, target = spec.rpartition("=")
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{spec!r}: expected MODULE:ATTRIBUTE, e.g. myapp.flows:graph")
    try:
        module = _import_from_cwd(module_name)
    except ImportError as e:
        raise CliError(f"cannot import module {module_name!r} (from {spec!r}): {e}") from e
    except Exception as e:  # the module's own code failed while importing
        raise CliError(f"importing module {module_name!r} failed: {type(e).__name__}: {e}") from e
    try:
        obj: Any = getattr(module, attr)
    except AttributeError as e:
        raise CliError(f"module {module_name!r} has no attribute {attr!r}") from e
    if callable(obj) and not isinstance(obj, CompiledGraph | StateGraph):
        try:
            obj = obj()
        except Exception as e:
            raise CliError(f"{target}() failed: {type(e).__name__}: {e}") from e
    if isinstance(obj, StateGraph):
        obj = obj.compile(name=attr)
    if not isinstance(obj, CompiledGraph):
        raise CliError(f"{target} is a {type(obj).__name__}, not a graph (StateGraph or compiled)")
    return (name or obj.name), obj


def _import_from_cwd(module_name: str) -> Any:
    """Import ``module_name``, its top-level package taken from the working directory if there.

    Only the named module comes from the working directory: it is loaded from its file there
    explicitly, and the directory is *appended* to ``sys.path`` (for the module's own sibling
    imports), never put in front of it. So a stray ``sqlite3.py`` or ``json.py`` in the
    directory cannot shadow the standard library or an installed package (``python -m``
    would let it).
    """
    cwd = os.getcwd()
    top = module_name.partition(".")[0]
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [cwd])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[top]
                raise
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    return importlib.import_module(module_name)


async def graph_for(args: argparse.Namespace, command: str) -> tuple[str, CompiledGraph[Any]]:
    """The graph of ``--graph`` (or ``$GRAPHEXEC_GRAPH``), loaded; a clear error without one.

    Graphs are never imported from names stored in the database: the user names the module.
    When none is given, the error shows the ``--graph`` the thread's runs were started with
    (recorded by ``graphexec run``), for the user to confirm and pass.
    """
    spec = getattr(args, "graph", None) or os.environ.get(GRAPH_VARIABLE)
    if not spec:
        hint = ""
        thread = getattr(args, "thread", None)
        if thread:
            async with open_store(args) as store:
                tup = await store.get(thread)
            recorded = None if tup is None else tup.checkpoint.metadata.get("graph")
            if isinstance(recorded, str):
                hint = f"; thread {thread!r} was run with --graph {recorded}"
        raise CliError(
            f"{command} needs the graph that wrote the thread (to fold its state and run its "
            f"nodes): pass --graph MODULE:ATTRIBUTE or set {GRAPH_VARIABLE}{hint}"
        )
    _, graph = load_graph(spec)
    return spec, graph


# -- storage --------------------------------------------------------------------------------


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--db PATH`` / ``--dsn URL`` (and ``--schema``) to a command that uses threads."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help=f"SQLite file (default: ${DB_VARIABLE} or ./{DEFAULT_DB})",
    )
    where.add_argument(
        "--dsn", metavar="URL", default=None, help=f"postgresql://... (default: ${DSN_VARIABLE})"
    )
    parser.add_argument(
        "--schema", default=None, help="PostgreSQL schema of the checkpoint tables (with --dsn)"
    )


def describe_store(args: argparse.Namespace) -> str:
    """The database a command uses, for messages."""
    dsn = args.dsn or (None if args.db else os.environ.get(DSN_VARIABLE))
    if dsn:
        return "the PostgreSQL database"
    return str(_db_path(args))


def _db_path(args: argparse.Namespace) -> Path:
    return Path(args.db or os.environ.get(DB_VARIABLE) or DEFAULT_DB)


READ_COMMANDS = frozenset({"threads", "history", "show", "draw"})
"""Commands that only read a store: they open it as it is, never creating or migrating it."""

CONNECT_TIMEOUT = 5
"""Seconds a read command waits for PostgreSQL to accept the connection."""


@contextlib.asynccontextmanager
async def open_store(
    args: argparse.Namespace, *, create: bool = False
) -> AsyncIterator[BaseCheckpointer]:
    """Open the checkpointer ``--db`` / ``--dsn`` names, closing it afterwards.

    Without ``create``, a SQLite file that does not exist is an error (and is not created): a
    typo in a path must not leave an empty database behind. A read command (one of
    :data:`READ_COMMANDS`) first checks, without writing, that the store is a graphexec
    database at the current schema version: another application's file, an empty file, a
    missing schema or a database that needs a migration is an error, left as it was.
    """
    dsn = args.dsn or (None if args.db else os.environ.get(DSN_VARIABLE))
    reading = getattr(args, "command", None) in READ_COMMANDS and not create
    store: BaseCheckpointer
    if dsn:
        try:
            from checkpointers.postgres import PostgresCheckpointer
        except ImportError as e:
            raise CliError(
                f"--dsn needs the PostgreSQL extra: pip install 'graphexec[postgres]' ({e})"
            ) from e
        try:
            store = PostgresCheckpointer(dsn, schema=args.schema)
        except ValueError as e:
            raise CliError(f"--dsn/--schema: {_redact(str(e), dsn)}") from None
        if reading:
            await _check_postgres(store, dsn, args.schema)
    else:
        if args.schema:
            raise CliError("--schema applies to PostgreSQL (--dsn), not to a SQLite --db")
        from checkpointers.sqlite import SqliteCheckpointer

        path = _db_path(args)
        if path.is_dir():
            raise CliError(f"--db {path}: is a directory; give the database file's path")
        if not create and not path.exists():
            raise CliError(
                f"no database at {path}: run a graph first (graphexec run ...) or point --db at "
                "an existing file"
            )
        store = SqliteCheckpointer(path, encryption=_encryption())
        if reading:
            _check_sqlite(path, store._db.schema_version)
    try:
        await store.setup()
        yield store
    finally:
        await store.aclose()


def _redact(text: str, dsn: str) -> str:
    from checkpointers.queue import redact_dsn

    return redact_dsn(text, dsn)


def _version_verdict(where: str, found: int | None, expected: int) -> None:
    """Refuse a store a read command must not touch (``found`` is ``None``: no graphexec table)."""
    if found is None:
        raise CliError(f"{where}: not a graphexec database (no graphexec_migrations table)")
    if found < expected:
        raise CliError(
            f"{where}: graphexec database at schema version {found}, this graphexec uses "
            f"{expected}; a read command does not migrate it: run a write command (graphexec "
            "resume/run) or open it from the application once"
        )
    # A newer version is refused by setup() itself, without writing.


def _check_sqlite(path: Path, expected: int) -> None:
    """Check, on a read-only connection, that ``path`` is a graphexec database (no writes)."""
    import sqlite3

    from checkpointers._sql import VERSION_TABLE

    if path.stat().st_size == 0:
        raise CliError(f"{path}: not a graphexec database (empty file)")
    # With no -wal / -journal beside it the file alone is the database: open it immutable, so
    # that SQLite creates no -shm/-wal files either. Otherwise read-only, to see their content.
    side = [path.with_name(path.name + end) for end in ("-wal", "-journal")]
    mode = "mode=ro" if any(p.exists() for p in side) else "immutable=1"
    uri = f"{path.resolve().as_uri()}?{mode}"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            row = db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (VERSION_TABLE,)
            ).fetchone()
            found = None
            if row is not None:
                (found,) = db.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()
    except sqlite3.DatabaseError as e:
        raise CliError(f"{path}: not a graphexec database ({e})") from None
    _version_verdict(str(path), found if found is None else int(found), expected)


async def _check_postgres(store: Any, dsn: str, schema: str | None) -> None:
    """Check, reading only, that the schema exists and holds graphexec tables."""
    import psycopg

    from checkpointers._pg_db import describe_dsn
    from checkpointers._sql import VERSION_TABLE

    where = describe_dsn(dsn)
    options: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in dsn:
        options["connect_timeout"] = CONNECT_TIMEOUT
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, **options)
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CliError(f"cannot connect to PostgreSQL at {where}: {_redact(first, dsn)}") from None
    try:
        async with conn:
            cur = await conn.execute(
                "SELECT n.nspname, EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid"
                " AND c.relname = %s) FROM pg_namespace n"
                " WHERE n.nspname = coalesce(%s::text, current_schema())",
                (VERSION_TABLE, schema),
            )
            row = await cur.fetchone()
            if row is None:
                named = schema if schema is not None else "(the search_path's)"
                raise CliError(f"{where}: no such schema {named!r}; check --schema")
            found = None
            if row[1]:
                table = psycopg.sql.Identifier(row[0], VERSION_TABLE)
                cur = await conn.execute(
                    psycopg.sql.SQL("SELECT max(version) FROM {}").format(table)
                )
                (value,) = await cur.fetchone() or (None,)
                found = None if value is None else int(value)
    except psycopg.Error as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CliError(f"PostgreSQL at {where}: {_redact(first, dsn)}") from None
    _version_verdict(f"{where} (schema {row[0]})", found, store._db.schema_version)


def _encryption() -> Any:
    """Keys from ``$GRAPHEXEC_ENCRYPTION_KEYS``: ``id=HEX[,id=HEX...]``, the first one active.

    The key ids must be the ones the application encrypts with (they are stored in every
    blob); each key is 64 hex digits (32 bytes). Messages name an entry by its position only:
    a malformed entry may be a key (or hold one), which must never be echoed.
    """
    spec = os.environ.get(KEYS_VARIABLE)
    if not spec:
        return None
    from checkpointers._crypto import Encryption

    keys: dict[str, bytes] = {}
    for number, part in enumerate(spec.split(","), 1):
        key_id, sep, hexkey = part.strip().partition("=")
        try:
            raw = bytes.fromhex(hexkey)
        except ValueError:
            raw = b""
        if not sep or not key_id or len(raw) != 32:
            raise CliError(
                f"{KEYS_VARIABLE} must be id=HEX[,id=HEX...] with 64 hex digits per key; "
                f"could not read entry {number} (the value is not shown)"
            )
        keys[key_id] = raw
    try:
        return Encryption(keys=keys, active=next(iter(keys)))
    except (ValueError, ImportError) as e:
        raise CliError(f"{KEYS_VARIABLE}: {e}") from None


async def thread_head(store: BaseCheckpointer, thread_id: str, where: str) -> Any:
    """The thread's head tuple; :class:`CliError` naming the thread when it does not exist."""
    tup = await store.get(thread_id)
    if tup is None:
        raise CliError(
            f"no thread {thread_id!r} in {where}; list the threads with: graphexec threads"
        )
    return tup


async def checkpoint_of(
    store: BaseCheckpointer, thread_id: str, checkpoint_id: str, where: str
) -> Any:
    """The tuple of one checkpoint; :class:`CliError` naming thread and id when unknown."""
    await thread_head(store, thread_id, where)
    tup = await store.get(thread_id, "", checkpoint_id)
    if tup is None:
        raise CliError(
            f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}; list them with: "
            f"graphexec history {thread_id}"
        )
    return tup


# -- input ----------------------------------------------------------------------------------


def json_arg(text: str, what: str = "input") -> Any:
    """Parse ``text`` as JSON, or the file ``@path`` names; :class:`CliError` when invalid."""
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise CliError(f"cannot read {what} file {text[1:]!r}: {e.strerror}") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CliError(f"{what} is not valid JSON: {e}") from e


# -- output ---------------------------------------------------------------------------------


def _control_escapes() -> dict[str, str]:
    table = {chr(c): f"\\x{c:02x}" for c in [*range(0x20), *range(0x7F, 0xA0)]}
    table.update({"\n": "\\n", "\r": "\\r", "\t": "\\t"})
    # Bidirectional overrides and isolates reorder what a terminal shows (Trojan Source).
    for c in [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]:
        table[chr(c)] = f"\\u{c:04x}"
    return table


def _class_of(chars: Iterable[str]) -> re.Pattern[str]:
    return re.compile("[" + "".join(f"\\u{ord(c):04x}" for c in sorted(chars)) + "]")


_ESCAPES = _control_escapes()
# A regex finds the characters to escape: on text with none (nearly all output) it is a single
# C scan, about 20x faster than str.translate with a mapping, which looks up every character.
_CONTROLS = _class_of(_ESCAPES)
_CONTROLS_BUT_NEWLINE = _class_of(c for c in _ESCAPES if c != "\n")
# json escapes C0 controls itself; DEL, C1 controls and bidi overrides it leaves raw.
_JSON_UNESCAPED = _class_of(c for c in _ESCAPES if ord(c) >= 0x7F)
# Above this many bits an int has more than 4,300 decimal digits: Python refuses to convert it
# to decimal text (the conversion is quadratic), so it is shown in hexadecimal, which is linear.
_MAX_DECIMAL_BITS = 14_000


def _escape_match(match: re.Match[str]) -> str:
    return _ESCAPES[match.group()]


def _json_escape_match(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def terminal_safe(text: str, *, keep_newlines: bool = False) -> str:
    r"""``text`` with every control character escaped (``\x1b``, ``\n``, ...).

    Thread ids, node names and state values are data from the store or from whoever wrote the
    thread: printed raw, an ESC or OSC sequence would drive the terminal (colours, title,
    clipboard writes with OSC 52), a CR would overwrite the line and a newline forge a table row.
    Bidirectional-override characters are escaped too. This is the one escaping function of
    the command line; :class:`SafeStream` applies it to everything printed.

    Args:
        text: The text to print.
        keep_newlines: Leave ``\n`` as is (for whole lines of output, whose fields were
            escaped with ``keep_newlines=False`` already).

    Returns:
        ``text`` itself when it has nothing to escape.
    """
    pattern = _CONTROLS_BUT_NEWLINE if keep_newlines else _CONTROLS
    return pattern.sub(_escape_match, text)


class SafeStream:
    """A text stream that escapes control characters (except newline) written through it.

    The command line's human output goes through it, so no code path can print stored text
    raw; JSON output is unaffected (JSON escapes control characters itself).
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    @property
    def unwrapped(self) -> TextIO:
        """The stream written to, for the few writes that are meant to drive the terminal."""
        return self._stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_safe(text, keep_newlines=True))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def to_plain(value: Any) -> Any:
    """``value`` as JSON-compatible data (datetimes, dataclasses, models, sets, bytes...).

    An int too large for decimal text becomes the string ``"0x..."`` (``"-0x..."``).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value.bit_length() > _MAX_DECIMAL_BITS:
            return f"{value:#x}"
        return value
    if value is None or isinstance(value, str | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [to_plain(v) for v in items]
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return to_plain(dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    try:
        return repr(value)
    except ValueError:  # e.g. a huge int inside an object's repr
        return f"<{type(value).__name__} (its repr failed)>"


def dump_json(value: Any, out: TextIO | None = None) -> None:
    """Print ``value`` as one JSON document (stable key order, UTF-8 kept)."""
    text = json.dumps(to_plain(value), ensure_ascii=False, indent=2)
    # DEL, C1 controls and bidi overrides (left raw by json) can only occur inside strings,
    # where a \\u escape means the same character.
    print(_JSON_UNESCAPED.sub(_json_escape_match, text), file=out or sys.stdout)


def short(value: Any, width: int = 60) -> str:
    """A one-line rendering of ``value`` at most ``width`` characters long."""
    text = value if isinstance(value, str) else json.dumps(to_plain(value), ensure_ascii=False)
    text = terminal_safe(" ".join(text.split()))
    return text if len(text) <= width else text[: width - 3] + "..."


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain-text table with a header rule, columns padded to their widest cell."""
    cells = [
        [str(h) for h in headers],
        *[["" if c is None else terminal_safe(str(c)) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def when(value: dt.datetime) -> str:
    """A timestamp for tables: local-free UTC, seconds precision."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def result_dict(result: RunResult) -> dict[str, Any]:
    """A run's outcome as JSON-compatible data."""
    return {
        "thread_id": result.thread_id,
        "run_id": result.run_id,
        "status": result.status,
        "checkpoint_id": result.checkpoint_id,
        "values": to_plain(result.values),
        "interruptions": [
            {"id": i.id, "node": i.node, "kind": i.kind, "value": to_plain(i.value)}
            for i in result.interruptions
        ],
        "error": None if result.error is None else to_plain(result.error),
    }


def print_result(result: RunResult, args: argparse.Namespace, spec: str) -> int:
    """Report a run's outcome (JSON or text) and return the exit status it means."""
    status = {
        "done": EXIT_OK,
        "rejected": EXIT_OK,
        "interrupted": EXIT_INTERRUPTED,
        "failed": EXIT_FAILED,
    }[result.status]
    if args.json:
        dump_json(result_dict(result))
        return status
    thread = terminal_safe(str(result.thread_id))
    print(f"thread {thread}: {result.status} at checkpoint {result.checkpoint_id}")
    for key, value in result.values.items():
        print(f"  {key}: {short(value, 100)}")
    if result.error is not None:
        print(
            f"error: {type(result.error).__name__}: {terminal_safe(str(result.error))}",
            file=sys.stderr,
        )
        print(f"after fixing the cause: graphexec resume {thread} --graph {spec}")
    for i in result.interruptions:
        node = terminal_safe(repr(i.node))
        print(f"waiting: {i.kind} of node {node} (id {i.id}): {short(i.value, 80)}")
        verb = "approve" if i.kind == "approval" else "resume"
        extra = " --value JSON" if i.kind == "input" else ""
        print(f"  answer with: graphexec {verb} {thread} {i.id}{extra} --graph {spec}")
    return status


class Progress:
    """Progress lines for long work on stderr: rewritten in place on a terminal."""

    def __init__(self, what: str, total: int | None = None, *, enabled: bool = True) -> None:
        self._what = what
        self._total = total
        self._done = 0
        self._enabled = enabled
        self._tty = sys.stderr.isatty()

    def step(self, note: str = "") -> None:
        """Count one unit of work and show it."""
        self._done += 1
        if not self._enabled:
            return
        of = f"/{self._total}" if self._total is not None else ""
        line = f"{self._what}: {self._done}{of}" + (f" {note}" if note else "")
        if self._tty:
            # The line's own text is escaped; only the redraw prefix drives the terminal.
            err = sys.stderr
            raw = err.unwrapped if isinstance(err, SafeStream) else err
            raw.write("\r\x1b[2K" + terminal_safe(line))
            raw.flush()
        else:
            print(line, file=sys.stderr)

    def close(self) -> None:
        """End the in-place line."""
        if self._enabled and self._tty and self._done:
            sys.stderr.write("\n")


Handler = Callable[[argparse.Namespace], Any]
