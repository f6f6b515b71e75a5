"""Hostile text and values reaching the command line's output, and modules planted in the cwd.

Thread ids and state values come from whoever wrote the thread; the human output must never
pass their control characters to the terminal (ESC and OSC sequences, BEL, CR, a newline that
forges a table row), a value Python cannot print in decimal must not crash a command, and a
file in the working directory must not shadow the standard library when a graph is imported.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from graphexec.cli import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, main

BIG = 7**20000  # 16,900 decimal digits: over Python's int-to-str limit of 4,300
OSC52 = "\x1b]52;c;ZXZpbA==\x07"  # writes "evil" into the terminal's clipboard
HOSTILE = f"{OSC52}\x1b[2J\x1b[31mred\rover\nforged row\x9b6n\u202eevil"
THREAD = "t\x1b[31m\nforged-thread\r\x07"
RAW_CONTROLS = ["\x1b", "\x07", "\r", "\x9b", "\u202e"]

GRAPH_MODULE = textwrap.dedent(
    f"""
    from typing import Any, TypedDict

    from graphexec import END, START, StateGraph


    class State(TypedDict, total=False):
        label: str
        big: int


    def poison(state: State) -> dict[str, Any]:
        return {{"label": {HOSTILE!r}, "big": 7**20000}}


    builder = StateGraph(State)
    builder.add_node("poison", poison)
    builder.add_edge(START, "poison")
    builder.add_edge("poison", END)
    graph = builder.compile(name="hostile")
    """
)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "hostile_flows.py").write_text(GRAPH_MODULE)
    monkeypatch.chdir(tmp_path)
    for var in ("GRAPHEXEC_GRAPH", "GRAPHEXEC_DB", "GRAPHEXEC_DSN", "GRAPHEXEC_ENCRYPTION_KEYS"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main([*argv, "--db", "work.db"])
    out, err = capsys.readouterr()
    return status, out, err


def _no_raw_controls(text: str) -> None:
    for c in RAW_CONTROLS:
        assert c not in text, f"raw {c!r} reached the terminal: {text!r}"


def test_every_human_command_escapes_stored_text(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _cli(
        capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", THREAD, "-q"
    )
    assert status == EXIT_OK, err
    _no_raw_controls(out + err)
    assert "\\x1b]52" in out  # shown, escaped, so the user sees what was stored

    for argv in (
        ["threads"],
        ["history", THREAD],
        ["show", THREAD, "--graph", "hostile_flows:graph"],
        ["show", THREAD, "--diff", "--graph", "hostile_flows:graph"],
    ):
        status, out, err = _cli(capsys, *argv)
        assert status == EXIT_OK, (argv, err)
        _no_raw_controls(out + err)
        assert not any(line.startswith(("forged", "over")) for line in out.splitlines()), (
            argv,
            out,
        )


def test_a_newline_in_a_thread_id_does_not_forge_a_row(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _cli(capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", THREAD, "-q")[0]
        == EXIT_OK
    )
    assert (
        _cli(capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", "plain", "-q")[0]
        == EXIT_OK
    )
    status, out, _ = _cli(capsys, "threads")
    assert status == EXIT_OK
    lines = out.strip().splitlines()
    assert len(lines) == 2 + 2, lines  # header, rule, one row per thread


def test_json_output_escapes_controls_and_keeps_the_values(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        _cli(capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", THREAD, "-q")[0]
        == EXIT_OK
    )
    status, out, err = _cli(capsys, "show", THREAD, "--json", "--graph", "hostile_flows:graph")
    assert status == EXIT_OK, err
    _no_raw_controls(out)
    shown = json.loads(out)
    values: dict[str, Any] = shown["values"]
    assert values["label"] == HOSTILE  # JSON escapes are lossless
    assert values["big"] == f"{BIG:#x}"  # too long for decimal: hexadecimal text
    assert int(values["big"], 16) == BIG


def test_a_huge_int_is_rendered_not_a_traceback(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = _cli(
        capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", "big"
    )
    assert status == EXIT_OK, err
    assert 'big: "0x' in out
    status, out, err = _cli(
        capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", "big2", "--json"
    )
    assert status == EXIT_OK, err
    assert json.loads(out)["values"]["big"].startswith("0x")
    graph = ["--graph", "hostile_flows:graph"]
    for argv in (["show", "big", *graph], ["show", "big", "--diff", *graph], ["history", "big"]):
        status, out, err = _cli(capsys, *argv)
        assert status == EXIT_OK, (argv, err)
        assert "Traceback" not in err


def test_usage_errors_escape_the_arguments_they_quote(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse quotes an unknown argument verbatim: pasted text must not drive the terminal."""
    status, out, err = _cli(capsys, "threads", HOSTILE)
    assert status == EXIT_USAGE
    _no_raw_controls(out + err)
    assert "unrecognized arguments" in err and "\\x1b]52" in err, err


def test_escaping_leaves_clean_text_alone_and_escapes_every_class() -> None:
    from graphexec.cli._common import terminal_safe

    clean = "thread-1  done  2026-12-02T14:00:00  {'k': 'é ü 名前'}"
    assert terminal_safe(clean) is clean or terminal_safe(clean) == clean
    assert terminal_safe(HOSTILE).isprintable()
    assert terminal_safe("a\nb", keep_newlines=True) == "a\nb"
    assert terminal_safe("a\nb") == "a\\nb"
    assert terminal_safe("\x00\x7f\x85\u2066") == "\\x00\\x7f\\x85\\u2066"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("graphexec 0.")


def test_a_module_in_the_cwd_cannot_shadow_the_stdlib(tmp_path: Path) -> None:
    """The console script imports the named module only; a planted stdlib name never runs."""
    installed = tmp_path / "site"
    (installed / "pkg").mkdir(parents=True)
    (installed / "pkg" / "__init__.py").write_text("")
    (installed / "pkg" / "flows.py").write_text(
        "import colorsys  # a stdlib module graphexec itself never imports\n" + GRAPH_MODULE
    )
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    canary = tmp_path / "planted-code-ran"
    (cwd / "colorsys.py").write_text(f"open({str(canary)!r}, 'w').close()\n")
    # A graph module next to the planted file is still found: only the named module comes
    # from the working directory.
    (cwd / "hostile_flows.py").write_text("import colorsys\n" + GRAPH_MODULE)

    script = Path(sys.executable).with_name("graphexec")
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("GRAPHEXEC_DB", None)
    for spec in ("pkg.flows:graph", "hostile_flows:graph"):
        proc = subprocess.run(
            [
                str(script),
                "run",
                spec,
                "--input",
                "{}",
                "--thread",
                "t",
                "--db",
                "w.db",
                "-q",
                "--json",
            ],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == EXIT_OK, proc.stderr
        assert not canary.exists(), f"{spec}: the planted colorsys.py in the cwd ran"
        (cwd / "w.db").unlink()


@pytest.mark.parametrize(
    "argv",
    [
        ["threads", "--limit", "0"],
        ["threads", "--limit", "-3"],
        ["history", "t", "--limit", "-1"],
        ["history", "t", "--limit", "many"],
        ["run", "hostile_flows:graph", "--input", "{}", "--thread", "t", "--recursion-limit", "0"],
    ],
)
def test_numeric_options_are_checked(
    work: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    status, out, err = _cli(capsys, *argv)
    assert status == EXIT_USAGE, (out, err)
    assert len(err.strip().splitlines()) == 1, err
    assert "--limit" in err or "--recursion-limit" in err
    assert not (work / "work.db").exists()  # refused before anything was opened


async def test_busy_and_waiting_threads_are_explained_in_cli_words(
    work: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from checkpointers import SqliteCheckpointer

    async with SqliteCheckpointer.open(work / "work.db") as store:
        await store.setup()
        await store.acquire_lease("held", owner="someone-else", ttl=600)
    status, _, err = await asyncio.to_thread(
        _cli, capsys, "run", "hostile_flows:graph", "--input", "{}", "--thread", "held"
    )
    assert status == EXIT_USAGE, err
    assert "--wait" in err and "on_busy" not in err, err

    (work / "ask_flows.py").write_text(
        textwrap.dedent(
            """
            from typing import Any, TypedDict

            from graphexec import END, START, StateGraph, interrupt


            class State(TypedDict, total=False):
                answer: str


            def ask(state: State) -> dict[str, Any]:
                return {"answer": interrupt("why?")}


            builder = StateGraph(State)
            builder.add_node("ask", ask)
            builder.add_edge(START, "ask")
            builder.add_edge("ask", END)
            graph = builder.compile(name="ask")
            """
        )
    )
    args = ("run", "ask_flows:graph", "--input", "{}", "--thread", "w", "-q")
    status, _, err = await asyncio.to_thread(_cli, capsys, *args)
    assert status == EXIT_INTERRUPTED, err
    status, _, err = await asyncio.to_thread(_cli, capsys, *args)
    assert status == EXIT_USAGE, err
    assert "graphexec resume w" in err and "Command(" not in err, err
