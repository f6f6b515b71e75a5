"""Smoke test for ``python -m benchmarks``: it runs, and writes sensible JSON and Markdown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("chain", "loop", "fanout")


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_quick_run_reports_positive_graphexec_timings(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = _bench(*WORKLOADS, "--quick", "--repeat", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr

    data = _load(out)
    assert set(data["workloads"]) == set(WORKLOADS)
    for name in WORKLOADS:
        ge = data["workloads"][name]["results"]["graphexec"]
        assert len(ge["samples"]) == 1
        assert ge["median"], name
        assert all(value > 0 for value in ge["median"].values()), (name, ge["median"])
    assert data["meta"]["quick"] is True
    # Markdown goes next to the JSON, so the smoke test never overwrites real results.
    assert "| chain |" in (tmp_path / "bench.md").read_text(encoding="utf-8")
    for name in WORKLOADS:
        assert name in proc.stdout


def test_without_langgraph_the_comparison_is_skipped(tmp_path: Path) -> None:
    # A regular package named langgraph that fails to import shadows any installed one.
    shadow = tmp_path / "shadow" / "langgraph"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("hidden by the smoke test")\n')
    paths = [str(tmp_path / "shadow"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    out = tmp_path / "bench.json"

    proc = _bench("chain", "--quick", "--repeat", "1", "--json", str(out), env=env)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LangGraph comparison skipped" in proc.stdout
    chain = _load(out)["workloads"]["chain"]
    assert set(chain["results"]) == {"graphexec"}
    assert chain["results"]["graphexec"]["median"]["ms_per_step"] > 0
    assert "langgraph" in chain["skipped"]
