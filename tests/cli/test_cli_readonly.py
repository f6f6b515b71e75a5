"""Read commands (threads, history, show) never write: foreign, empty, missing or old stores.

Each is refused with one line and exit 2, and the file's bytes (or the database's schemas) are
exactly as before. Bad ``--dsn`` / ``--schema`` values and an unreachable server are one line
too, and ``$GRAPHEXEC_ENCRYPTION_KEYS`` entries are never echoed.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from pg import admin_connection, postgres_dsn

from graphexec.cli import EXIT_USAGE, main

HERE = Path(__file__).resolve().parent
READS = [["threads"], ["history", "t1"], ["show", "t1"]]
KEY_HEX = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.chdir(tmp_path)
    for var in ("GRAPHEXEC_GRAPH", "GRAPHEXEC_DB", "GRAPHEXEC_DSN", "GRAPHEXEC_ENCRYPTION_KEYS"):
        monkeypatch.delenv(var, raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def files(directory: Path) -> dict[str, str]:
    """Every file in ``directory`` with its content's hash (journal/WAL files included)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def one_line_refusal(status: int, out: str, err: str, *, says: str) -> None:
    assert status == EXIT_USAGE, (out, err)
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert says in err, err


@pytest.fixture
def foreign(tmp_path: Path) -> Path:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        db.execute("INSERT INTO invoices (total) VALUES (9.5)")
    return path


@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
def test_read_commands_refuse_a_foreign_sqlite_file_and_leave_it_byte_identical(
    argv: list[str], foreign: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files(foreign.parent)
    status, out, err = run(capsys, *argv, "--db", str(foreign))
    one_line_refusal(status, out, err, says="not a graphexec database")
    assert str(foreign.name) in err
    assert files(foreign.parent) == before


@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
def test_read_commands_refuse_an_empty_file_and_leave_it_empty(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    status, out, err = run(capsys, *argv, "--db", str(empty))
    one_line_refusal(status, out, err, says="not a graphexec database")
    assert [p.name for p in tmp_path.iterdir()] == ["empty.db"]
    assert empty.stat().st_size == 0


@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
def test_read_commands_do_not_create_a_missing_file(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, *argv, "--db", str(tmp_path / "missing.db"))
    one_line_refusal(status, out, err, says="no database at")
    assert list(tmp_path.iterdir()) == []


def test_a_read_command_does_not_migrate_an_older_graphexec_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    assert (
        run(capsys, "run", "flows:chain", "--thread", "t1", "--input", "{}", "-q", "--db", str(db))[
            0
        ]
        == 0
    )
    with sqlite3.connect(db) as conn:  # pretend the last migration was never applied
        conn.execute(
            "DELETE FROM graphexec_migrations"
            " WHERE version = (SELECT max(version) FROM graphexec_migrations)"
        )
    conn.close()
    before = files(tmp_path)
    status, out, err = run(capsys, "threads", "--db", str(db))
    one_line_refusal(status, out, err, says="does not migrate it")
    assert "schema version" in err
    assert files(tmp_path) == before


def test_read_commands_still_read_a_graphexec_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "work.db"
    assert (
        run(capsys, "run", "flows:chain", "--thread", "t1", "--input", "{}", "-q", "--db", str(db))[
            0
        ]
        == 0
    )
    status, out, err = run(capsys, "threads", "--db", str(db))
    assert status == 0 and "t1" in out, err


def test_encryption_key_entries_are_never_echoed(
    foreign: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for spec in (KEY_HEX, f"k1={KEY_HEX[:-2]}", f"={KEY_HEX}", f"k1={KEY_HEX},{KEY_HEX}zz"):
        monkeypatch.setenv("GRAPHEXEC_ENCRYPTION_KEYS", spec)
        status, out, err = run(capsys, "threads", "--db", str(foreign))
        one_line_refusal(status, out, err, says="GRAPHEXEC_ENCRYPTION_KEYS")
        assert KEY_HEX[:16] not in err and KEY_HEX[-16:-2] not in err, err


# -- PostgreSQL --------------------------------------------------------------------------------


def _schemas() -> set[str]:
    with admin_connection() as conn:
        return {str(r[0]) for r in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}


@pytest.fixture
def pg_schemas() -> Iterator[set[str]]:
    yield _schemas()


@pytest.mark.postgres
@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
@pytest.mark.parametrize("schema", ["gx_h_typo_schema", 'bad"schema'])
def test_read_commands_on_a_missing_postgres_schema_create_nothing(
    argv: list[str], schema: str, pg_schemas: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, *argv, "--dsn", postgres_dsn(), "--schema", schema)
    assert status == EXIT_USAGE and out == "" and len(err.strip().splitlines()) == 1, err
    assert "no such schema" in err or "SQL identifier" in err, err
    assert _schemas() == pg_schemas


@pytest.mark.postgres
def test_read_commands_on_a_foreign_postgres_schema_add_no_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with admin_connection() as conn:
        conn.execute('DROP SCHEMA IF EXISTS "gx_h_foreign" CASCADE')
        conn.execute('CREATE SCHEMA "gx_h_foreign"')
        conn.execute('CREATE TABLE "gx_h_foreign".invoices (id int)')
    try:
        for argv in READS:
            status, out, err = run(
                capsys, *argv, "--dsn", postgres_dsn(), "--schema", "gx_h_foreign"
            )
            one_line_refusal(status, out, err, says="not a graphexec database")
        with admin_connection() as conn:
            tables = conn.execute(
                "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'gx_h_foreign' AND c.relkind = 'r'"
            ).fetchall()
        assert tables == [("invoices",)]
    finally:
        with admin_connection() as conn:
            conn.execute('DROP SCHEMA IF EXISTS "gx_h_foreign" CASCADE')


@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
def test_a_dsn_that_is_not_one_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, *argv, "--dsn", "notadsn")
    one_line_refusal(status, out, err, says="invalid PostgreSQL DSN")


@pytest.mark.parametrize("argv", READS, ids=lambda a: a[0])
def test_an_unreachable_postgres_is_one_line_without_the_password(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, *argv, "--dsn", "postgresql://gx:s3cr3tpw@127.0.0.1:1/none")
    one_line_refusal(status, out, err, says="cannot connect to PostgreSQL at 127.0.0.1:1/none")
    assert "s3cr3tpw" not in err
