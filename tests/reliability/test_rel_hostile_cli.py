"""Hostile text and numbers at the terminal: stored data never drives it, never crashes it.

Rows: each class of control character (ESC/CSI, OSC 52 clipboard writes, BEL, CR, LF, NUL,
DEL, the C1 CSI, bidirectional overrides) put into a thread id and into a state value, then every
read command (`run`, `threads`, `history`, `show`, `show --diff`, `show --json`) -- no raw control
character may reach stdout or stderr, no newline may forge a table row, and JSON keeps the value
exactly. Then ints past Python's decimal-conversion limit, bare and nested: every command prints
them (as hexadecimal text) instead of a traceback.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from rel_support import STATS

from graphexec.cli import EXIT_OK, main

CONTROLS = {
    "esc-csi": "\x1b[2J\x1b[31m",
    "osc52": "\x1b]52;c;ZXZpbA==\x07",
    "bel": "\x07",
    "cr": "\roverwritten",
    "lf": "\nforged row",
    "nul": "\x00",
    "del": "\x7f",
    "c1-csi": "\x9b6n",
    "bidi": "\u202eevil\u2066",
}
RAW = ["\x1b", "\x07", "\r", "\x00", "\x7f", "\x9b", "\u202e", "\u2066"]
HUGE = {
    "positive": "2**14001",
    "negative": "-(7**20000)",
    "nested": "[{'deep': [3**30000]}]",
}

MODULE = """
from typing import Any, TypedDict

from graphexec import END, START, StateGraph


class State(TypedDict, total=False):
    value: Any


def write(state: State) -> dict[str, Any]:
    return {{"value": {value}}}


builder = StateGraph(State)
builder.add_node("write", write)
builder.add_edge(START, "write")
builder.add_edge("write", END)
graph = builder.compile(name="hostile_cli")
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("GRAPHEXEC_GRAPH", "GRAPHEXEC_DB", "GRAPHEXEC_DSN", "GRAPHEXEC_ENCRYPTION_KEYS"):
        monkeypatch.delenv(var, raising=False)


def _module(tmp_path: Path, name: str, value: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE.format(value=value)))
    return f"{name}:graph"


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main([*argv, "--db", "work.db"])
    out, err = capsys.readouterr()
    return status, out + err


@pytest.mark.parametrize("kind", sorted(CONTROLS))
def test_control_characters_never_reach_the_terminal(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = f"before{CONTROLS[kind]}after"
    spec = _module(tmp_path, f"ctl_{kind.replace('-', '_')}", repr(text))
    thread = f"t{CONTROLS[kind]}x"
    graph = ["--graph", spec]
    commands: list[list[str]] = [
        ["run", spec, "--input", "{}", "--thread", thread],
        ["threads"],
        ["history", thread],
        ["show", thread, *graph],
        ["show", thread, "--diff", *graph],
    ]
    for argv in commands:
        status, printed = _cli(capsys, *argv)
        assert status == EXIT_OK, (argv, printed)
        for c in RAW:
            assert c not in printed, (kind, argv, printed)
        assert not any(line.startswith(("forged", "overwritten")) for line in printed.splitlines())
        STATS.add("hostile", kind="hostile terminal text (control characters)")
    status, printed = _cli(capsys, "show", thread, "--json", *graph)
    assert status == EXIT_OK, printed
    for c in RAW:
        assert c not in printed
    values: dict[str, Any] = json.loads(printed)["values"]
    assert values["value"] == text
    STATS.add("hostile", kind="hostile terminal text (control characters)")


@pytest.mark.parametrize("kind", sorted(HUGE))
def test_huge_ints_are_printed_not_a_traceback(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _module(tmp_path, f"huge_{kind}", HUGE[kind])
    graph = ["--graph", spec]
    for argv in (
        ["run", spec, "--input", "{}", "--thread", "t"],
        ["run", spec, "--input", "{}", "--thread", "j", "--json"],
        ["history", "t"],
        ["show", "t", *graph],
        ["show", "t", "--diff", *graph],
        ["show", "t", "--json", *graph],
    ):
        status, printed = _cli(capsys, *argv)
        assert status == EXIT_OK, (argv, printed)
        assert "Traceback" not in printed, printed
        if argv[0] != "history":  # history shows no values
            assert "0x" in printed, printed
        STATS.add("hostile", kind="hostile terminal number (huge int)")
