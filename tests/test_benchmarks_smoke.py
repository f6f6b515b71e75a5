"""Smoke test for ``python -m benchmarks``: it runs, and writes sensible JSON and Markdown.

Runs a quick subset on the memory and SQLite backends. Passes whether or not LangGraph is
installed: the comparison columns are checked only when it is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("chain", "chat", "interrupt", "crash", "floor", "concurrency", "loop-growth")
HAS_LANGGRAPH = importlib.util.find_spec("langgraph") is not None


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


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("bench")
    out = folder / "bench.json"
    proc = _bench(
        *WORKLOADS,
        "--quick",
        "--repeat",
        "1",
        "--backend",
        "memory,sqlite",
        "--json",
        str(out),
        "--tmpdir",
        str(folder),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_quick_run_covers_every_case_with_positive_graphexec_figures(
    quick_run: tuple[Path, str],
) -> None:
    out, stdout = quick_run
    data = _load(out)
    cases = data["workloads"]
    assert set(cases) == {
        "chain/memory",
        "chain/sqlite/sync",
        "chat/memory",
        "chat/sqlite/sync",
        "interrupt/memory",
        "interrupt/sqlite/sync",
        "crash/memory",
        "crash/sqlite/sync",
        "floor/sqlite/sync",
        "concurrency/sqlite/sync",
        "loop-growth/sqlite/sync",
    }
    for name, case in cases.items():
        ge = case["results"]["graphexec"]
        assert len(ge["samples"]) == 1, name
        assert ge["median"], name
        assert case["backend"] in ("memory", "sqlite"), name
        for key, value in ge["median"].items():
            floor = 0 if key in ("errors", "locked") else 1e-9
            assert value >= floor, (name, key, value)
    assert data["meta"]["quick"] is True
    # Markdown goes next to the JSON, so the smoke test never overwrites real results.
    md = (out.parent / "bench.md").read_text(encoding="utf-8")
    assert "| chain | sqlite/sync |" in md
    for name in WORKLOADS:
        assert name in stdout


def test_storage_and_concurrency_figures_are_reported(quick_run: tuple[Path, str]) -> None:
    out, _ = quick_run
    cases = _load(out)["workloads"]
    chat = cases["chat/sqlite/sync"]["results"]["graphexec"]
    assert chat["median"]["disk_kib"] > 0
    assert chat["median"]["disk_ratio"] > 0
    assert "disk_kib" not in cases["chat/memory"]["results"]["graphexec"]["median"]
    conc = cases["concurrency/sqlite/sync"]["results"]["graphexec"]["median"]
    assert conc["errors"] == 0 and conc["runs_per_s"] > 0
    floor = cases["floor/sqlite/sync"]["results"]["graphexec"]
    assert floor["median"]["floor_ms"] > 0
    assert floor["info"]["payload bytes / transaction"] > 0


def test_loop_growth_curves_are_written(quick_run: tuple[Path, str]) -> None:
    out, _ = quick_run
    growth = _load(out.parent / "loop_growth.json")
    curves = {c["system"]: c for c in growth["curves"]}
    ge = curves["graphexec"]
    assert ge["step"] == [50.0, 100.0, 150.0, 200.0]
    for key in ("ms_per_step", "disk_bytes", "read_ms"):
        assert len(ge[key]) == 4 and all(v > 0 for v in ge[key]), key
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out.parent / "loop_growth.png").stat().st_size > 0


def test_langgraph_is_compared_when_installed(quick_run: tuple[Path, str]) -> None:
    if not HAS_LANGGRAPH:
        pytest.skip("langgraph is not installed (extra 'bench')")
    out, _ = quick_run
    data = _load(out)
    chain = data["workloads"]["chain/sqlite/sync"]
    if "langgraph" not in chain["results"]:  # its SQLite saver is a separate package
        assert chain["skipped"]["langgraph"].startswith("unavailable")
        return
    assert chain["ratio_langgraph_over_graphexec"]["ms_per_step"] > 0
    assert data["meta"]["langgraph_comparison"] == "yes"


def test_without_langgraph_the_comparison_is_skipped(tmp_path: Path) -> None:
    # A regular package named langgraph that fails to import shadows any installed one.
    shadow = tmp_path / "shadow" / "langgraph"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("hidden by the smoke test")\n')
    paths = [str(tmp_path / "shadow"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    out = tmp_path / "bench.json"

    proc = _bench(
        "chain",
        "history",
        "--quick",
        "--repeat",
        "1",
        "--backend",
        "memory,sqlite",
        "--json",
        str(out),
        "--tmpdir",
        str(tmp_path),
        env=env,
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LangGraph comparison skipped" in proc.stdout
    cases = _load(out)["workloads"]
    assert set(cases) == {
        "chain/memory",
        "chain/sqlite/sync",
        "history/memory",
        "history/sqlite/sync",
    }
    for case in cases.values():
        assert set(case["results"]) == {"graphexec"}
        assert "langgraph" in case["skipped"]
    assert cases["chain/sqlite/sync"]["results"]["graphexec"]["median"]["ms_per_step"] > 0


def test_postgres_without_dsn_is_refused() -> None:
    proc = _bench("chain", "--backend", "postgres")
    assert proc.returncode == 2
    assert "--dsn" in proc.stderr


def test_workers_graph_runs_and_the_workload_needs_postgres() -> None:
    # The queue workload itself needs PostgreSQL; here only its graph and its selection.
    import asyncio
    from types import SimpleNamespace

    from benchmarks._core import REGISTRY, cases
    from benchmarks._systems import LANGGRAPH, GraphexecAdapter
    from benchmarks._workers import GRAPH_NAME, NODES, chain_graph
    from graphexec import InMemoryCheckpointer

    graph = chain_graph().with_checkpointer(InMemoryCheckpointer())
    assert graph.name == GRAPH_NAME
    out = asyncio.run(graph.ainvoke({"n": 0, "log": []}, thread_id="t"))
    assert out["n"] == NODES and len(out["log"]) == NODES
    workload = REGISTRY["workers"](quick=True)
    assert workload.params()["runs"] == 40
    assert cases(workload, ["memory", "sqlite"], ["sync"], tmp=ROOT) == []
    assert len(cases(workload, ["postgres"], ["sync"], tmp=ROOT, dsn="postgresql://x")) == 1
    assert workload.unsupported(GraphexecAdapter()) is None
    reason = workload.unsupported(SimpleNamespace(name=LANGGRAPH))  # type: ignore[arg-type]
    assert reason is not None and reason.startswith("unavailable")


@pytest.mark.parametrize("prepare", [False, True])
def test_postgres_prepare_reaches_graphexec_store(prepare: bool) -> None:
    # --postgres-prepare must change what graphexec's store does, not just the report.
    import asyncio

    from benchmarks._systems import GraphexecAdapter, Location
    from benchmarks.workloads import build_chain, run_chain
    from tests.pg import admin_connection, fresh_schema, schema_dsn

    async def prepared_statements() -> int:
        system = GraphexecAdapter()
        async with fresh_schema() as schema:
            with admin_connection() as admin:
                admin.execute(f'CREATE SCHEMA "{schema}"')
            where = Location("postgres", dsn=schema_dsn(schema), prepare=prepare)
            async with system.open_store(where) as store:
                graph = build_chain(system, store)
                await run_chain(system, graph, ["t1", "t2"], "sync")
                rows = await store._db.fetch("count", "SELECT count(*) FROM pg_prepared_statements")
                return int(rows[0][0])

    count = asyncio.run(prepared_statements())
    assert (count > 0) if prepare else (count == 0)


def test_postgres_prepare_run_is_reported(tmp_path: Path) -> None:
    from tests.pg import postgres_dsn

    out = tmp_path / "bench.json"
    proc = _bench(
        "chain",
        "--quick",
        "--repeat",
        "1",
        "--backend",
        "postgres",
        "--dsn",
        postgres_dsn(),
        "--postgres-prepare",
        "--no-langgraph",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = _load(out)
    assert data["meta"]["postgres statements"].startswith("prepared on both")
    chain = data["workloads"]["chain/postgres/sync"]["results"]["graphexec"]
    assert chain["median"]["ms_per_step"] > 0
