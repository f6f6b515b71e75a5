"""Run every ``examples/NN_*.py`` as a user would, and check what it prints.

New examples are picked up by the glob; each needs an entry in ``EXPECTED`` (the test fails
without one) and a line in ``examples/README.md``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))

EXPECTED: dict[str, tuple[str, ...]] = {
    "01_hello.py": (
        "priority=low",
        "log: classified as low -> drafted a reply",
        "priority=high",
        "log: classified as high -> escalated to a human",
        "ticket-1 has 3 checkpoints",
        "threads in the checkpointer: ['ticket-1', 'ticket-2']",
    ),
    "02_parallel_and_send.py": (
        "supersteps: step 1: fetch_profile, fetch_orders; step 2: enrich_profile; step 3: report",
        "'report' waited for both branches and ran once",
        "8 score tasks finished, in this order: 0, 3, 6, 1, 4, 7, 2, 5",
        "collected in document order: ['0:32', '1:44', '2:62', '3:30', '4:83', '5:31',",
        "best match: 'gift cards'",
    ),
    "03_crash_and_resume.py": (
        "run status: failed (NodeExecutionError)",
        "saved state: next=('load',), log=['extract', 'transform']",
        "executions: extract=1, transform=1, load=2, notify=1",
        "run status: failed; next=('charge', 'reserve')",
        "executions: prepare=1, charge=1, reserve=2, confirm=1",
    ),
    "04_time_travel.py": (
        "0:draft | 1:review | 2:draft | 3:review | 4:draft | 5:review | 6:done",
        "re-ran draft=2, review=2",
        "the new branch starts at step 2's checkpoint: True",
        "after update_state: next=('review',)",
        "notes: ['v1', 'hand edit', 'ok']",
        "fork:   version=5",
        "source: still 'Refunds within 30 days.' at step 3",
        "prune(keep_last=3) deleted",
        "3 remain on the current branch",
    ),
    "05_human_approval.py": (
        "paused at 'crm'",
        "a tampered state is refused: RunState signature does not match",
        "pending: approval of 'crm'",
        "approved; crm now asks: note to attach to CASE-1?",
        "streamed: crm finished",
        "crm case CASE-1 (high): customer called back",
        "approval -> approve by alice, edited {'priority': 'high'}",
        "CRM cases opened: 1 (priority high)",
    ),
    "06_travel_assistant.py": (
        "facts stored: meal=vegetarian, seat=window",
        "reloaded 4 items of history; facts summary: meal: vegetarian; seat: window",
        "Take the 08:10 flight to Lisbon on 12 May, window seat",
        "assistant: Book Casa Ribeira in Porto.",
        "popped the assistant item and the user item",
        "assistant: Book Casa Alfama in Lisbon.",
        "session 'trip-ada' now holds 8 items (0 mention Porto)",
    ),
    "07_memory.py": (
        "archival, tag 'policy': Warranty: two years",
        "A: Descale the K2 kettle monthly",
        "block 'customer' now: 'name: Ada\\nowns: K2 kettle'",
        "agent edit of 'persona' refused: MemoryStoreError",
        "<metadata>chars_current=25 chars_limit=120</metadata>",
        "the first is a system summary replacing",
        "recall still finds the evicted greeting: 'Hello, my name is Ada.' (evicted=True)",
        "pop_item correction: removed 'What about the warranty?' and its answer",
        "A: Returns are accepted within 30 days",
        "history: 'email' from signup form, 'phone, after 5pm' from chat turn 3",
    ),
    "08_postgres_workers.py": (
        "enqueued 12 runs of graph 'tickets'",
        "killed worker-a (SIGKILL) in the middle of its runs",
        "all 12 runs finished: {'done': 12}",
        "worker-a's interrupted runs were finished by worker-b: True",
        "customers notified: 12, each exactly once: True",
    ),
}

NEEDS_POSTGRES = {"08_postgres_workers.py"}
"""Examples that print a skip line and exit 0 without a server (they run for real in CI)."""


def _run(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Run against this checkout whether or not it is installed, from an unrelated directory.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(path)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_glob_finds_the_examples() -> None:
    assert len(EXAMPLES) >= 4, f"expected at least 4 examples, found {EXAMPLES}"


def test_every_expected_entry_has_a_file() -> None:
    assert sorted(EXPECTED) == sorted(p.name for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs(path: Path, tmp_path: Path) -> None:
    assert path.name in EXPECTED, (
        f"add the text {path.name} is expected to print to EXPECTED in tests/test_examples.py"
    )
    if path.name in NEEDS_POSTGRES and not os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN"):
        if os.environ.get("GRAPHEXEC_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"{path.name} needs PostgreSQL: GRAPHEXEC_TEST_POSTGRES_DSN is not set")
        proc = _run(path, tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("skipped: no PostgreSQL server")
        pytest.skip(f"{path.name}: no PostgreSQL server (it printed its skip line)")
    proc = _run(path, tmp_path)
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert proc.stderr == "", f"{path.name} wrote to stderr:\n{proc.stderr}"
    for marker in EXPECTED[path.name]:
        assert marker in proc.stdout, f"{path.name}: {marker!r} not in output:\n{proc.stdout}"
    assert list(tmp_path.iterdir()) == [], f"{path.name} left files in its working directory"
    again = _run(path, tmp_path)
    assert again.stdout == proc.stdout, f"{path.name}: output differs between two runs"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_is_documented(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc, f"{path.name} needs a module docstring saying what it shows"
    assert f"python examples/{path.name}" in doc, f"{path.name}: say how to run it"
    assert f"`{path.name}`" in (ROOT / "examples" / "README.md").read_text(encoding="utf-8"), (
        f"list {path.name} in examples/README.md"
    )
