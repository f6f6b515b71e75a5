"""Mermaid rendering of a graph's structure."""

from __future__ import annotations

import re
from typing import Any

import networkx as nx

from graphexec._types import END, START

__all__ = ["draw_mermaid"]


# Words Mermaid's flowchart parser treats specially: never usable as a node id.
_KEYWORDS = frozenset(
    {
        "end",
        "graph",
        "flowchart",
        "subgraph",
        "style",
        "class",
        "classdef",
        "click",
        "linkstyle",
        "direction",
        "default",
        "interpolate",
        "call",
        "href",
    }
)


def _ids(nodes: list[Any]) -> dict[Any, str]:
    """Readable, unique, parser-safe ids: the name itself when it is one, else ``n<i>_name``."""
    ids: dict[Any, str] = {}
    taken: set[str] = set()
    for i, node in enumerate(nodes):
        name = str(node)
        clean = re.sub(r"[^0-9A-Za-z_]", "_", name)
        ident = clean
        if (
            clean != name
            or clean.lower() in _KEYWORDS
            or not clean
            or clean[0].isdigit()
            or clean in taken
        ):
            ident = f"n{i}_{clean}"
        ids[node] = ident
        taken.add(ident)
    return ids


def _label(text: str) -> str:
    return text.replace('"', "#quot;")


def draw_mermaid(g: nx.MultiDiGraph[Any]) -> str:
    """Render ``g`` (from ``CompiledGraph.to_networkx()``) as a Mermaid flowchart.

    A node's id is its name when that is a safe Mermaid identifier, otherwise a positional
    ``n<i>_<name>``, so any node name draws correctly; names always appear as labels. Plain
    edges are solid, joins thick, conditional edges and declared ``Command`` destinations
    dotted, labelled with the routing key when it differs from the target.
    """
    ids = _ids(list(g.nodes))
    lines = ["flowchart TD"]
    for node, data in g.nodes(data=True):
        ident = ids[node]
        if node in (START, END):
            lines.append(f'    {ident}(["{_label(node)}"])')
        else:
            shape = '[["{}"]]' if data.get("subgraph") else '["{}"]'
            lines.append(f"    {ident}" + shape.format(_label(str(node))))
    for a, b, data in g.edges(data=True):
        kind = data.get("kind", "edge")
        src, dst = ids[a], ids[b]
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
    lines.append(f"    class {ids[START]},{ids[END]} terminal;")
    return "\n".join(lines) + "\n"
