"""Mermaid rendering of a graph's structure."""

from __future__ import annotations

import re
from typing import Any

import networkx as nx

from graphexec._types import END, START

__all__ = ["draw_mermaid"]


def _ident(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def _label(text: str) -> str:
    return text.replace('"', "#quot;")


def draw_mermaid(g: nx.DiGraph[Any]) -> str:
    """Render ``g`` (from ``CompiledGraph.to_networkx()``) as a Mermaid flowchart.

    Plain edges are solid, joins are thick, conditional edges and declared ``Command``
    destinations are dotted (labelled with the routing key when it differs from the target).
    """
    lines = ["flowchart TD"]
    for node, data in g.nodes(data=True):
        ident = _ident(node)
        if node in (START, END):
            lines.append(f'    {ident}(["{_label(node)}"])')
        elif data.get("subgraph"):
            lines.append(f'    {ident}[["{_label(node)}"]]')
        else:
            lines.append(f'    {ident}["{_label(node)}"]')
    for a, b, data in g.edges(data=True):
        kind = data.get("kind", "edge")
        src, dst = _ident(a), _ident(b)
        if kind == "conditional":
            label = data.get("label", "")
            if label and label != b:
                lines.append(f'    {src} -. "{_label(label)}" .-> {dst}')
            else:
                lines.append(f"    {src} -.-> {dst}")
        elif kind == "destination":
            lines.append(f"    {src} -.-> {dst}")
        elif kind == "join":
            lines.append(f"    {src} ==> {dst}")
        else:
            lines.append(f"    {src} --> {dst}")
    lines.append("    classDef terminal fill:#eee,stroke:#999;")
    lines.append(f"    class {_ident(START)},{_ident(END)} terminal;")
    return "\n".join(lines) + "\n"
