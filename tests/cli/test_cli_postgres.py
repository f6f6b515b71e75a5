"""The inspection and run commands against PostgreSQL (``--dsn``/``--schema``), same as SQLite."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pg import fresh_schema, postgres_dsn

from graphexec.cli import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, main

pytestmark = pytest.mark.postgres
HERE = Path(__file__).resolve().parent


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    async with fresh_schema() as name:
        yield name


def test_commands_on_postgres(
    schema: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.delenv("GRAPHEXEC_DB", raising=False)
    where = ["--dsn", postgres_dsn(), "--schema", schema]

    def cli(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = main([*argv, *where])
        out, err = capsys.readouterr()
        return status, out, err

    status, out, err = cli("run", "flows:chain", "--thread", "p1", "--input", "{}", "--json")
    assert status == EXIT_OK, err
    assert json.loads(out)["values"]["n"] == 3
    status, out, _ = cli("threads", "--json")
    assert [t["thread_id"] for t in json.loads(out)] == ["p1"]
    status, out, _ = cli("history", "p1", "--json")
    history = json.loads(out)
    assert [c["step"] for c in history] == [3, 2, 1, 0]
    status, out, _ = cli(
        "show",
        "p1",
        "--checkpoint",
        history[1]["checkpoint_id"],
        "--diff",
        "--graph",
        "flows:chain",
        "--json",
    )
    assert {c["key"] for c in json.loads(out)["diff"]} == {"n", "log"}

    status, out, err = cli("run", "flows:approval", "--thread", "p2", "--input", '{"item": "x"}')
    assert status == EXIT_INTERRUPTED, err
    status, out, err = cli("approve", "p2", "--by", "pg", "--graph", "flows:approval", "-q")
    assert status == EXIT_INTERRUPTED and "waiting: input of node 'ask'" in out, err

    status, _, err = cli("history", "ghost")
    assert status == EXIT_USAGE and "no thread 'ghost' in the PostgreSQL database" in err


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://gx:s3cr%40t@127.0.0.1:1/none",
        "postgresql://gx@127.0.0.1:1/none?password=s3cr%40t&sslmode=disable",
        "host=127.0.0.1 port=1 user=gx password=s3cr@t dbname=none",
        "host=127.0.0.1 port=1 user=gx password='s3cr@t' dbname=none",
    ],
)
@pytest.mark.parametrize("command", [["runs"], ["enqueue", "chain", "--input", "{}"]])
def test_queue_commands_on_unreachable_postgres_say_one_line_without_the_password(
    dsn: str,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """#19.8, #20.7: exit 2 at once, one line on stderr, no password, no pool log spam."""
    status = main([*command, "--dsn", dsn])
    out, err = capsys.readouterr()
    assert status == EXIT_USAGE and out == ""
    assert len(err.strip().splitlines()) == 1 and "cannot use PostgreSQL" in err, err
    assert "s3cr" not in err and "40t" not in err, err
    assert not [r for r in caplog.records if r.name.startswith("psycopg")]


def test_queue_command_help_names_the_dsn_default_and_units(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GRAPHEXEC_DSN", raising=False)
    assert main(["worker", "--help"]) == EXIT_OK
    out = " ".join(capsys.readouterr().out.split())
    assert "[--dsn postgresql://...]" in out and "(default: $GRAPHEXEC_DSN)" in out
    assert "--concurrency N runs executed at once" in out
    assert "--lease-ttl SECONDS seconds before" in out
    assert main(["runs"]) == EXIT_USAGE
    assert "pass --dsn postgresql://... or set $GRAPHEXEC_DSN" in capsys.readouterr().err
