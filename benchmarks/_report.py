"""Rendering results: the printed table, the Markdown file and the JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._core import Metric, WorkloadResult
from benchmarks._systems import GRAPHEXEC, LANGGRAPH

__all__ = ["dumps", "markdown", "rows", "table", "to_json", "write"]

HEADERS = ("workload", "metric", GRAPHEXEC, LANGGRAPH, "langgraph / graphexec")


def _number(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"


def _fact(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return "varies: " + ", ".join(map(str, value))
    return str(value)


def _cell(result: WorkloadResult, system: str, metric: Metric) -> str:
    if system in result.systems:
        return _number(result.systems[system].median(metric.key), metric.digits)
    reason = result.skipped.get(system)
    return "failed" if reason and reason.startswith("failed") else "-"


def rows(results: Sequence[WorkloadResult]) -> list[tuple[str, str, str, str, str]]:
    """One row per metric and per fact, workload name on the first row of each workload."""
    out: list[tuple[str, str, str, str, str]] = []
    for result in results:
        first = True

        def add(label: str, ge: str, lg: str, ratio: str, name: str = result.workload.name) -> None:
            nonlocal first
            out.append((name if first else "", label, ge, lg, ratio))
            first = False

        for metric in result.workload.metrics:
            ratio = result.ratio(metric, LANGGRAPH)
            add(
                metric.label,
                _cell(result, GRAPHEXEC, metric),
                _cell(result, LANGGRAPH, metric),
                "" if ratio is None else f"{ratio:.2f}x",
            )
        facts: dict[str, dict[str, Any]] = {
            system: r.info() for system, r in result.systems.items()
        }
        keys = list(dict.fromkeys(k for info in facts.values() for k in info))
        for key in keys:
            add(
                key,
                _fact(facts.get(GRAPHEXEC, {}).get(key, "-")),
                _fact(facts.get(LANGGRAPH, {}).get(key, "-")),
                "",
            )
    return out


def table(results: Sequence[WorkloadResult]) -> str:
    """A plain-text table for the terminal."""
    body = rows(results)
    widths = [max(len(r[i]) for r in [HEADERS, *body]) for i in range(len(HEADERS))]

    def line(r: Sequence[str]) -> str:
        left = [r[i].ljust(widths[i]) for i in range(2)]
        right = [r[i].rjust(widths[i]) for i in range(2, len(r))]
        return "  ".join(left + right).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADERS), rule, *(line(r) for r in body)])


def markdown(results: Sequence[WorkloadResult], meta: dict[str, Any]) -> str:
    """A Markdown report: the environment, then the table."""
    lines = ["# graphexec benchmarks", ""]
    lines += [f"- {key}: {_fact(value)}" for key, value in meta.items()]
    lines += [
        "",
        "Medians over the rounds. `langgraph / graphexec` above 1 means graphexec is faster.",
        "",
    ]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join(["---", "---", "---:", "---:", "---:"]) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in rows(results)]
    lines.append("")
    return "\n".join(lines)


def to_json(results: Sequence[WorkloadResult], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything measured, every round included."""
    workloads: dict[str, Any] = {}
    for result in results:
        w = result.workload
        workloads[w.name] = {
            "summary": w.summary,
            "params": w.params(),
            "metrics": [{"key": m.key, "label": m.label, "compare": m.compare} for m in w.metrics],
            "results": {
                system: {
                    "median": r.medians(),
                    "samples": [s.metrics for s in r.samples],
                    "info": r.info(),
                }
                for system, r in result.systems.items()
            },
            "ratio_langgraph_over_graphexec": {
                m.key: result.ratio(m, LANGGRAPH)
                for m in w.metrics
                if result.ratio(m, LANGGRAPH) is not None
            },
            "skipped": result.skipped,
        }
    return {"meta": meta, "workloads": workloads}


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, creating folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def dumps(data: dict[str, Any]) -> str:
    """JSON text for :func:`to_json` output."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
