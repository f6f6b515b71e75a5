"""The soak's 60-second CI profile (the 10-minute run is ``python -m benchmarks.soak``).

Runs ``benchmarks.soak`` for 60 s on SQLite and, when a server is configured, PostgreSQL at the
same time. In 60 s the leak and drift criteria of the 10-minute soak (< 0.5 MB/min, p99 drift
<= 1.2x) are dominated by warm-up (SQLite's page cache filling, the pool growing to its working
size) and by the neighbours of a shared 2-core machine, so this profile checks what 60 s can
show: no errors, open files and connections flat, and no gross memory growth (< 5 MB/min);
p99 drift is reported, not judged (60 s of a shared machine's noise says nothing about drift).
The long profile (``GRAPHEXEC_RELIABILITY_PROFILE=long``) runs 10 minutes with the real limits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rel_support import LONG, STATS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1000 if LONG else 120)
def test_soak_profile(tmp_path: Path) -> None:
    backends = ["sqlite"]
    if os.environ.get("GRAPHEXEC_TEST_POSTGRES_DSN"):
        backends.append("postgres")
    out = tmp_path / "soak.json"
    command = [sys.executable, "-m", "benchmarks.soak", "--backend", ",".join(backends)]
    command += ["--seconds", "600" if LONG else "60", "--json", str(out)]
    if not LONG:
        command += ["--max-growth", "5", "--max-drift", "0", "--concurrency", "2"]
    proc = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=900 if LONG else 110
    )
    reports = json.loads(out.read_text()) if out.exists() else []
    for r in reports:
        conns = (
            ""
            if r["connections_first"] is None
            else f", conns {r['connections_first']}->{r['connections_max']}"
        )
        STATS.soak.append(
            f"{r['backend']} {r['seconds']:.0f}s: {r['throughput']:.0f} steps/s, p99 "
            f"{r['p99_first_ms']:.2f}->{r['p99_last_ms']:.2f} ms ({r['p99_drift']}x), RSS "
            f"{r['growth_mb_per_min']:+.2f} MB/min, fds {r['fds_first']}->{r['fds_max']}{conns}, "
            f"{'PASS' if r['passed'] else 'FAIL'}"
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["backend"] for r in reports] == backends
    for r in reports:
        assert r["errors"] == [] and r["runs"] > 100, r["problems"]
        assert r["fds_max"] <= r["fds_first"] + 2
