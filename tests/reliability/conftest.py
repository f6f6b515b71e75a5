"""The reliability battery: profile, seed, SQL recording, audit guard and the closing counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rel_backends import drop_memory_schemas
from rel_support import GUARD, LONG, PROFILE, RECORDER, SEED, STATS, install_recorders

from graphexec._serde import known_zones


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"reliability: profile={PROFILE} seed={SEED} "
        f"(replay: GRAPHEXEC_RELIABILITY_PROFILE={PROFILE} GRAPHEXEC_RELIABILITY_SEED={SEED})"
    )


@pytest.fixture(scope="session", autouse=True)
def _record_sql() -> Iterator[None]:
    """Every statement the stores send, for the SQL-text audit (test_rel_zz_sql_audit)."""
    known_zones()  # load the zone list (it imports the fixed `tzdata` package) before arming
    GUARD.install()
    restore = install_recorders()
    try:
        yield
    finally:
        restore()
        drop_memory_schemas()


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file that hostile payloads try to create; it must never exist."""
    return tmp_path / "gx-canary"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not (STATS.kills or STATS.faults or STATS.hostile or RECORDER.total or STATS.soak):
        return
    tr = terminalreporter
    tr.section("reliability battery")
    tr.write_line(
        f"reliability: {STATS.kills} kills survived ({STATS.resumes} resumes, "
        f"{STATS.missed_kills} runs finished before their kill), {STATS.faults} faults injected, "
        f"{STATS.hostile} hostile inputs tried (all refused or kept inert), "
        f"{STATS.sql_checked or RECORDER.total} SQL "
        f"statements checked, {STATS.lost} lost"
    )
    tr.write_line(
        f"  profile={PROFILE}{' (long)' if LONG else ''} seed={SEED}; effects re-invoked and "
        f"absorbed by their idempotency key: {STATS.effects_deduplicated}"
    )
    for kind, n in sorted(STATS.by_kind.items()):
        tr.write_line(f"  {kind}: {n}")
    for line in STATS.soak:
        tr.write_line(f"  soak {line}")
