"""Smoke test for ``python -m benchmarks.archival_bench``: small sizes, sane numbers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package: run from the checkout
    sys.path.insert(0, str(ROOT))

from benchmarks import archival_bench  # noqa: E402


def test_run_reports_every_measure() -> None:
    report = archival_bench.run([300], "hashing")
    [result] = report["results"]
    assert result["passages"] == 300
    assert result["insert_per_s"] > 0
    assert result["db_mb"] > 0
    assert set(result["search"]) == {"plain", "tag (rare)", "tag (common)", "date"}
    for kind, numbers in result["search"].items():
        assert 0 < numbers["p50_ms"] <= numbers["p95_ms"], kind
    assert result["search"]["plain"]["empty"] < archival_bench.QUERIES
    assert "| 300 |" in archival_bench.table(report)


def test_data_is_deterministic() -> None:
    assert archival_bench.passages(50) == archival_bench.passages(50)
    assert archival_bench.queries(5) == archival_bench.queries(5)
    tags = [p.tags for p in archival_bench.passages(3000)]
    assert sum("rare" in t for t in tags) == 3


def test_command_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.archival_bench", "--sizes", "200"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "| 200 |" in proc.stdout


@pytest.mark.postgres
def test_run_on_postgres() -> None:
    from pg import postgres_dsn

    report = archival_bench.run([300], "hashing", dsn=postgres_dsn())
    [result] = report["results"]
    assert report["backend"] == "postgres"
    assert result["passages"] == 300 and result["db_mb"] > 0
    for kind, numbers in result["search"].items():
        assert 0 < numbers["p50_ms"] <= numbers["p95_ms"], kind
    assert "backend: postgres" in archival_bench.table(report)
