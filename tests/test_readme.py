"""The READMEs tell the truth: their Python blocks run, and their figures come from results files.

- Every ```python block of ``README.md`` and ``examples/README.md`` is a program, or, when its
  first line is :data:`FRAGMENT`, a continuation of the program before it. Each program runs as
  a subprocess in a fresh temporary directory (so files like ``runs.db`` land there). A program
  mentioning ``GRAPHEXEC_TEST_POSTGRES_DSN`` needs PostgreSQL and skips without it.
- Every number in the README's performance table and in its "Why" table is found in the
  ``benchmarks/results/`` file its row names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ("README.md", "examples/README.md")
FRAGMENT = "# continued from the block above"
"""First line of a block that is not a program of its own but continues the one before it."""

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
_CVE = re.compile(r"CVE-\d{4}-\d+")


@dataclass
class Program:
    doc: str
    line: int
    source: str

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line, dedented source)`` of each ```python block, indented ones (in lists) too."""
    blocks: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i + 1
        j = start
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"unclosed ``` fence at line {i + 1}")
        if lang == "python":
            body = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[start:j]]
            blocks.append((start + 1, "\n".join(body) + "\n"))
        i = j + 1
    return blocks


def programs(doc: str) -> list[Program]:
    out: list[Program] = []
    for line, source in python_blocks((ROOT / doc).read_text(encoding="utf-8")):
        if source.startswith(FRAGMENT):
            assert out, f"{doc}:{line}: a fragment block needs a block before it"
            out[-1].source += f"\n# --- {doc}:{line}\n" + source
        else:
            out.append(Program(doc, line, source))
    return out


ALL_PROGRAMS = [p for doc in DOCS for p in programs(doc)]


def test_the_readme_has_blocks_to_run() -> None:
    # guards the extraction itself: a parsing slip must not turn this whole file into no tests
    blocks = python_blocks(README)
    assert len(blocks) >= 6
    assert sum(source.startswith(FRAGMENT) for _, source in blocks) >= 4


@pytest.mark.parametrize("program", ALL_PROGRAMS, ids=lambda p: p.id)
def test_python_block_runs(program: Program, tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if "GRAPHEXEC_TEST_POSTGRES_DSN" in program.source and not env.get(
        "GRAPHEXEC_TEST_POSTGRES_DSN"
    ):
        if env.get("GRAPHEXEC_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{program.id} needs PostgreSQL: GRAPHEXEC_TEST_POSTGRES_DSN is not set")
        pytest.skip("needs PostgreSQL: set GRAPHEXEC_TEST_POSTGRES_DSN")
    script = tmp_path / "block.py"
    script.write_text(program.source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (
        f"the Python block at {program.id} failed (exit {done.returncode}):\n"
        f"{done.stderr[-4000:]}\n--- program ---\n{program.source}"
    )


# figures -------------------------------------------------------------------------------------


def table_rows(text: str, heading: str) -> list[list[str]]:
    """Cells of the body rows of the first markdown table after the line ``heading``."""
    lines = text.splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for ln in lines[start + 1 :]:
        if ln.startswith("|"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table after {heading!r}"
    return rows[2:]  # header and separator


def numbers(text: str) -> set[str]:
    """Numeric tokens, thousands separators removed: ``"100,952"`` -> ``"100952"``."""
    return {n.replace(",", "") for n in _NUMBER.findall(_CVE.sub("", text))}


def results_numbers(name: str) -> set[str]:
    """Every number in the results table of ``benchmarks/results/<name>``."""
    path = RESULTS / name
    assert path.is_file(), f"the README names {name}, which is not in benchmarks/results/"
    cells = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("|")]
    return numbers("\n".join(cells))


def _results_files(cell: str) -> list[str]:
    return re.findall(r"(?:benchmarks/results/)?([\w.-]+\.md)", cell)


README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_performance_table_figures_are_in_the_named_results_file() -> None:
    rows = table_rows(README, "## Performance")
    missing = []
    for row in rows:
        assert len(row) == 6, f"performance row needs 6 cells (… | results): {row}"
        files = _results_files(row[5])
        assert files, f"performance row names no results file: {row}"
        found = set().union(*(results_numbers(f) for f in files))
        for n in numbers(" ".join(row[2:5])) - found:
            missing.append(f"{n} ({row[0]}, {row[1]}; {', '.join(files)})")
    assert not missing, "figures not in their results file: " + "; ".join(missing)


def test_why_table_figures_are_in_the_named_results_file() -> None:
    rows = table_rows(README, "## Why")
    missing = []
    for row in rows:
        figures = numbers(" ".join(row[1:3]))
        if not figures:
            continue
        files = _results_files(row[3])
        assert files, f"'Why' row {row[0]!r} has figures but names no results file"
        found = set().union(*(results_numbers(f) for f in files))
        missing += [f"{n} ({row[0]!r})" for n in figures - found]
    assert not missing, "figures not in their results file: " + "; ".join(missing)


def test_table_readers_find_planted_figures() -> None:
    # the checks above must be able to fail: a figure absent from latest.md is reported
    assert "0.56" not in results_numbers("latest.md")
    assert {"5.36", "0.230", "1.235"} <= results_numbers("latest.md")
    assert numbers("LangGraph 100,952 (10.8x), CVE-2025-64439") == {"100952", "10.8"}


def test_snapshot_depths_in_the_readme_are_the_code_defaults() -> None:
    from checkpointers import PostgresCheckpointer, SqliteCheckpointer
    from graphexec import InMemoryCheckpointer

    for name, cls in (
        ("in memory", InMemoryCheckpointer),
        ("on SQLite", SqliteCheckpointer),
        ("on PostgreSQL", PostgresCheckpointer),
    ):
        phrase = f"{cls.snapshot_policy.max_depth:,} deltas {name}"
        assert phrase in " ".join(README.split()), f"README should say {phrase!r} deltas"


def test_no_doc_claims_effects_run_at_most_once() -> None:
    # an effect killed mid-call runs again on resume (with the same idempotency key)
    offenders = []
    for folder in ("graphexec", "checkpointers", "memory", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            if "at most once" in " ".join(path.read_text(encoding="utf-8").split()):
                offenders.append(str(path.relative_to(ROOT)))
    for doc in DOCS:
        if "at most once" in (ROOT / doc).read_text(encoding="utf-8"):
            offenders.append(doc)
    assert not offenders, f"'at most once' is not what ctx.effect guarantees: {offenders}"


def test_examples_readme_names_every_example_and_no_false_runner() -> None:
    text = (ROOT / "examples" / "README.md").read_text(encoding="utf-8")
    for path in sorted((ROOT / "examples").glob("[0-9][0-9]_*.py")):
        assert f"`{path.name}`" in text, f"examples/README.md does not describe {path.name}"
    # scripts/demo runs `graphexec demo` only, not the examples
    assert not re.search(r"all with\s+`scripts/demo`", text), "scripts/demo runs no example"
