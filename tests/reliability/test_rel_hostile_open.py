"""Hostile stores and secrets at the door: reads never write, messages never echo a secret.

Rows: every read command (threads, history, show) against another application's SQLite file, a
0-byte file, a missing file, a graphexec file one migration behind, a missing PostgreSQL schema
(plain and with a quote in its name) and a foreign PostgreSQL schema -- each refused in one line
with exit 2, every file byte-identical (no -wal/-shm left) and no schema or table created. Then
secrets: encryption keys misplaced as key ids, as ``active=``, as malformed
``$GRAPHEXEC_ENCRYPTION_KEYS`` entries, and DSN passwords in unreachable and malformed DSNs --
none may appear in the message.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pg import admin_connection, postgres_dsn
from rel_support import STATS

from checkpointers._crypto import Encryption
from graphexec.cli import EXIT_USAGE, main

CLI_FLOWS = Path(__file__).resolve().parent.parent / "cli"
READS = [["threads"], ["history", "t1"], ["show", "t1"]]
KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(CLI_FLOWS))
    monkeypatch.chdir(tmp_path)
    for var in ("GRAPHEXEC_GRAPH", "GRAPHEXEC_DB", "GRAPHEXEC_DSN", "GRAPHEXEC_ENCRYPTION_KEYS"):
        monkeypatch.delenv(var, raising=False)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    assert status == 0 or out == "", out  # a refusal prints nothing on stdout
    return status, err


def _tree(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def _foreign(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, note TEXT)")
        db.execute("INSERT INTO orders (note) VALUES ('keep me')")
    db.close()


def _behind(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _ = _run(capsys, "run", "flows:chain", "--thread", "t1", "--input", "{}", "-q",
                     "--db", str(path))  # fmt: skip
    assert status == 0
    with sqlite3.connect(path) as db:
        db.execute(
            "DELETE FROM graphexec_migrations"
            " WHERE version = (SELECT max(version) FROM graphexec_migrations)"
        )
    db.close()


@pytest.mark.parametrize("case", ["foreign", "empty", "missing", "behind"])
def test_sqlite_reads_never_write(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store.db"
    if case == "foreign":
        _foreign(path)
    elif case == "empty":
        path.touch()
    elif case == "behind":
        _behind(path, capsys)
    before = _tree(tmp_path)
    says = {
        "foreign": "not a graphexec database",
        "empty": "not a graphexec database",
        "missing": "no database at",
        "behind": "does not migrate it",
    }[case]
    for argv in READS:
        status, err = _run(capsys, *argv, "--db", str(path))
        STATS.add("hostile", kind=f"hostile open (sqlite {case})")
        assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
        assert says in err and "store.db" in err, err
        assert _tree(tmp_path) == before


def _pg_catalogue() -> set[tuple[str, str]]:
    with admin_connection() as conn:
        rows = conn.execute(
            "SELECT n.nspname, coalesce(c.relname, '') FROM pg_namespace n"
            " LEFT JOIN pg_class c ON c.relnamespace = n.oid"
        ).fetchall()
    return {(str(a), str(b)) for a, b in rows}


@pytest.mark.postgres
@pytest.mark.parametrize("case", ["missing", "quoted", "foreign"])
def test_postgres_reads_never_write(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    schema = {
        "missing": f"gx_h_missing_{os.getpid()}",
        "quoted": 'gx_h"quoted',
        "foreign": f"gx_h_foreign_{os.getpid()}",
    }[case]
    if case == "foreign":
        with admin_connection() as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'CREATE TABLE "{schema}".orders (id int)')
    try:
        before = _pg_catalogue()
        for argv in READS:
            status, err = _run(capsys, *argv, "--dsn", postgres_dsn(), "--schema", schema)
            STATS.add("hostile", kind=f"hostile open (postgres {case} schema)")
            assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
            assert any(s in err for s in ("no such schema", "not a graphexec", "SQL identifier"))
            assert _pg_catalogue() == before
    finally:
        with admin_connection() as conn:
            quoted = schema.replace('"', '""')
            conn.execute(f'DROP SCHEMA IF EXISTS "{quoted}" CASCADE')


def _bad_encryptions() -> dict[str, Callable[[], object]]:
    """Misconfigurations that put a key where an id (or the active id) belongs."""
    untyped: Any = Encryption  # the misuses below are what the type hints forbid
    return {
        "key-as-long-id": lambda: Encryption(keys={KEY.hex() * 5: KEY}, active=KEY.hex() * 5),
        "hex-str-as-key": lambda: untyped(keys={"k1": KEY.hex()}, active="k1"),
        "bytes-as-id": lambda: untyped(keys={KEY: KEY}, active=KEY),
        "key-as-active": lambda: Encryption(keys={"k1": KEY}, active=KEY.hex()),
        "short-key": lambda: Encryption(keys={"k1": KEY[:31]}, active="k1"),
    }


@pytest.mark.parametrize("case", sorted(_bad_encryptions()))
def test_encryption_errors_never_show_a_key(case: str) -> None:
    STATS.add("hostile", kind="hostile secret (encryption key in error)")
    with pytest.raises(ValueError) as raised:
        _bad_encryptions()[case]()
    message = str(raised.value)
    assert KEY.hex()[:12] not in message and repr(KEY)[:20] not in message, message
    assert repr(KEY[:31])[:20] not in message, message


@pytest.mark.parametrize(
    "spec",
    [
        KEY.hex(),
        f"k1={KEY.hex()[:-1]}",
        f"={KEY.hex()}",
        f"{KEY.hex()}=k1",
        f"a={KEY.hex()},{KEY.hex()}",
    ],
)
def test_cli_key_entries_are_never_echoed(
    spec: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    STATS.add("hostile", kind="hostile secret (GRAPHEXEC_ENCRYPTION_KEYS)")
    monkeypatch.setenv("GRAPHEXEC_ENCRYPTION_KEYS", spec)
    path = tmp_path / "store.db"
    _foreign(path)
    status, err = _run(capsys, "threads", "--db", str(path))
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert KEY.hex()[:12] not in err and KEY.hex()[-12:-1] not in err, err


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://gx:Hunter2pw@127.0.0.1:1/none",
        "postgresql://gx@127.0.0.1:1/none?password=Hunter2pw",
        "host=127.0.0.1 port=1 user=gx password=Hunter2pw dbname=none",
        "host=127.0.0.1 port=1 password=Hunter2pw dbname",  # malformed, password before the error
    ],
)
def test_dsn_passwords_never_in_read_command_errors(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    STATS.add("hostile", kind="hostile secret (DSN password)")
    status, err = _run(capsys, "threads", "--dsn", dsn)
    assert status == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert "Hunter2pw" not in err, err
