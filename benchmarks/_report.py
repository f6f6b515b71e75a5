"""Rendering results: the printed table, the Markdown file and the JSON file."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._core import Metric, WorkloadResult
from benchmarks._systems import GRAPHEXEC, LANGGRAPH

__all__ = ["dumps", "losses", "markdown", "rows", "table", "to_json", "write"]

HEADERS = ("workload", "backend", "metric", GRAPHEXEC, LANGGRAPH, "langgraph / graphexec")
Row = tuple[str, str, str, str, str, str]


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}" if abs(value) >= 10_000 else f"{value:.{digits}f}"


_FACT_WIDTH = 90


def _fact(value: Any, *, cut: bool = True) -> str:
    """A fact on one line, cut to a table cell's width unless ``cut`` is false."""
    if isinstance(value, dict):
        text = ", ".join(f"{k} {v}" for k, v in value.items())
    elif isinstance(value, list):
        text = "varies: " + ", ".join(map(str, value))
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if not cut or len(text) <= _FACT_WIDTH else text[: _FACT_WIDTH - 3] + "..."


def _cell(result: WorkloadResult, system: str, metric: Metric) -> str:
    if system in result.systems:
        value = result.systems[system].median(metric.key)
        return "-" if value is None else _number(value, metric.digits)
    reason = result.skipped.get(system, "")
    if reason.startswith("failed"):
        return "failed"
    return "n/a" if reason.startswith("unavailable") else "-"


def rows(results: Sequence[WorkloadResult]) -> list[Row]:
    """One row per metric and per fact; workload and backend on the first row of each case."""
    out: list[Row] = []
    for result in results:
        first = True

        def add(label: str, ge: str, lg: str, ratio: str, result: WorkloadResult = result) -> None:
            nonlocal first
            head = (result.workload.name, result.env.label) if first else ("", "")
            out.append((*head, label, ge, lg, ratio))
            first = False

        for metric in result.workload.metrics:
            ge = _cell(result, GRAPHEXEC, metric)
            lg = _cell(result, LANGGRAPH, metric)
            if ge == lg == "-":
                continue  # the metric does not apply to this case (bytes on disk in memory)
            ratio = result.ratio(metric, LANGGRAPH)
            add(metric.label, ge, lg, "" if ratio is None else f"{ratio:.2f}x")
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
        if first:  # nothing measured at all
            add("(not run)", "-", "-", "")
    return out


def losses(results: Sequence[WorkloadResult]) -> list[str]:
    """Every compared metric where LangGraph's median is lower than graphexec's."""
    out = []
    for result in results:
        for metric in result.workload.metrics:
            ratio = result.ratio(metric, LANGGRAPH)
            if ratio is not None and ratio < 1:
                out.append(f"{result.case}: {metric.label} ({ratio:.2f}x)")
    return out


def problems(results: Sequence[WorkloadResult]) -> list[str]:
    """Systems that failed or could not run, one line each."""
    return [
        f"{result.case} on {system}: {reason}"
        for result in results
        for system, reason in result.skipped.items()
        if not reason.startswith("skipped")
    ]


def table(results: Sequence[WorkloadResult]) -> str:
    """A plain-text table for the terminal."""
    body = rows(results)
    widths = [max(len(r[i]) for r in [HEADERS, *body]) for i in range(len(HEADERS))]

    def line(r: Sequence[str]) -> str:
        left = [r[i].ljust(widths[i]) for i in range(3)]
        right = [r[i].rjust(widths[i]) for i in range(3, len(r))]
        return "  ".join(left + right).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(HEADERS), rule, *(line(r) for r in body)])


def markdown(results: Sequence[WorkloadResult], meta: dict[str, Any]) -> str:
    """A Markdown report: the environment, then the table, then losses and failures."""
    lines = ["# graphexec benchmarks", ""]
    lines += [f"- {key}: {_fact(value, cut=False)}" for key, value in meta.items()]
    lines += [
        "",
        "Medians over the rounds. `langgraph / graphexec` above 1 means graphexec is faster "
        "(or smaller). Backend `sqlite/async` means SQLite in durability mode `async`; in-memory "
        "stores run in `sync`. `n/a`: that backend is not available for that system here.",
        "",
    ]
    lines.append("| " + " | ".join(HEADERS) + " |")
    lines.append("|" + "|".join(["---", "---", "---", "---:", "---:", "---:"]) + "|")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows(results)]
    lines.append("")
    lost = losses(results)
    if lost:
        lines += ["## Where graphexec is slower or larger", ""]
        lines += [f"- {item}" for item in lost]
        lines.append("")
    trouble = problems(results)
    if trouble:
        lines += ["## Not measured", ""]
        lines += [f"- {item}" for item in trouble]
        lines.append("")
    return "\n".join(lines)


def to_json(results: Sequence[WorkloadResult], meta: dict[str, Any]) -> dict[str, Any]:
    """Everything measured, every round included, keyed by case (``workload/backend/mode``)."""
    cases: dict[str, Any] = {}
    for result in results:
        w = result.workload
        cases[result.case] = {
            "workload": w.name,
            "backend": result.env.backend,
            "durability": result.env.durability,
            "summary": w.summary,
            "params": w.params(),
            "metrics": [{"key": m.key, "label": m.label, "compare": m.compare} for m in w.metrics],
            "results": {
                system: {
                    "median": r.medians(),
                    "samples": [s.metrics for s in r.samples],
                    "info": r.info(),
                    **({"series": r.series()} if r.samples and r.samples[0].series else {}),
                }
                for system, r in result.systems.items()
            },
            "ratio_langgraph_over_graphexec": {
                m.key: ratio for m in w.metrics if (ratio := result.ratio(m, LANGGRAPH)) is not None
            },
            "skipped": result.skipped,
        }
    return {"meta": meta, "workloads": cases}


def write(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, creating folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def dumps(data: dict[str, Any]) -> str:
    """JSON text for :func:`to_json` output."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
