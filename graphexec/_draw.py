"""Drawings of a graph's structure: Mermaid text, and a dependency-free SVG image."""

from __future__ import annotations

import re
from html import escape
from typing import TYPE_CHECKING, Any

import networkx as nx

from graphexec._types import END, START

if TYPE_CHECKING:
    from graphexec._builder import GraphSpec

__all__ = ["draw_mermaid", "draw_svg", "graph_to_networkx"]


def graph_to_networkx(spec: GraphSpec, name: str) -> nx.MultiDiGraph[str]:
    """The graph as a networkx ``MultiDiGraph`` (one edge per declared connection).

    Edges carry a ``kind`` attribute: ``edge``, ``join``, ``conditional`` or
    ``destination``; conditional edges also carry the routing ``label``. Several routing
    keys leading to the same node, or a static edge beside a conditional one, are separate
    edges.
    """
    g: nx.MultiDiGraph[str] = nx.MultiDiGraph(name=name)
    g.add_node(START)
    for node_name, node in spec.nodes.items():
        g.add_node(node_name, subgraph=node.subgraph is not None)
    g.add_node(END)
    for source, targets in spec.edges.items():
        for t in targets:
            g.add_edge(source, t, kind="edge")
    for sources, target in spec.joins:
        for s in sources:
            g.add_edge(s, target, kind="join")
    for source, branches in spec.branches.items():
        for br in branches:
            mapping = br.path_map or {n: n for n in [*spec.nodes, END]}
            for key, target in mapping.items():
                g.add_edge(source, target, kind="conditional", label=str(key))
    for node_name, node in spec.nodes.items():
        for d in node.destinations:
            g.add_edge(node_name, d, kind="destination")
        if node.on_reject is not None:
            g.add_edge(node_name, node.on_reject, kind="conditional", label="rejected")
    return g


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


# -- SVG ------------------------------------------------------------------------------------

_CHAR_W, _BOX_H, _ROW_H, _GAP, _PAD = 7.4, 30.0, 74.0, 28.0, 24.0


def _layers(g: nx.MultiDiGraph[Any]) -> list[list[Any]]:
    """Rows top to bottom: breadth-first depth from START; END on its own last row.

    Breadth-first depth (not longest path) keeps loops drawable: an edge to the same or an
    earlier row is a back edge, drawn around the side.
    """
    depth: dict[Any, int] = {START: 0} if START in g else {}
    frontier = [START] if START in g else []
    while frontier:
        nxt: list[Any] = []
        for node in frontier:
            for succ in g.successors(node):
                if succ not in depth and succ != END:
                    depth[succ] = depth[node] + 1
                    nxt.append(succ)
        frontier = nxt
    last = max(depth.values(), default=0)
    for node in g.nodes:  # unreachable nodes (a valid graph has none): one row below
        if node not in depth and node != END:
            depth[node] = last + 1
    rows: list[list[Any]] = [[] for _ in range(max(depth.values(), default=0) + 1)]
    for node in g.nodes:  # insertion order within a row
        if node != END:
            rows[depth[node]].append(node)
    if END in g:
        rows.append([END])
    return [r for r in rows if r]


def draw_svg(g: nx.MultiDiGraph[Any]) -> str:
    """Render ``g`` (from ``CompiledGraph.to_networkx()``) as a standalone SVG document.

    Nodes sit in rows by their distance from START; plain edges are solid, joins thick,
    conditional edges and ``Command`` destinations dashed with their routing key, and edges that
    go back up (loops) curve around the right side. Needs no renderer: any browser opens it.
    """
    rows = _layers(g)
    width_of = {n: max(60.0, len(str(n)) * _CHAR_W + 24) for n in g.nodes}
    row_widths = [sum(width_of[n] for n in r) + _GAP * (len(r) - 1) for r in rows]
    canvas_w = max(row_widths, default=0) + 2 * _PAD + 80
    canvas_h = len(rows) * _ROW_H + 2 * _PAD
    pos: dict[Any, tuple[float, float]] = {}  # node -> centre
    row_of: dict[Any, int] = {}
    for i, (r, rw) in enumerate(zip(rows, row_widths, strict=True)):
        x = (canvas_w - 80 - rw) / 2
        for n in r:
            pos[n] = (x + width_of[n] / 2, _PAD + i * _ROW_H + _BOX_H / 2)
            row_of[n] = i
            x += width_of[n] + _GAP
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{canvas_w:.0f}" '
        f'height="{canvas_h:.0f}" viewBox="0 0 {canvas_w:.0f} {canvas_h:.0f}" '
        'font-family="sans-serif" font-size="12">',
        f"<title>{escape(str(g.graph.get('name') or 'graph'))}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#555"/></marker></defs>',
    ]
    for k, (a, b, data) in enumerate(g.edges(data=True)):
        kind = data.get("kind", "edge")
        (x1, y1), (x2, y2) = pos[a], pos[b]
        style = {
            "join": 'stroke-width="2.6"',
            "conditional": 'stroke-dasharray="5,4"',
            "destination": 'stroke-dasharray="2,3"',
        }.get(kind, "")
        if row_of[b] > row_of[a]:
            sy, ey = y1 + _BOX_H / 2, y2 - _BOX_H / 2
            path = f"M{x1:.1f},{sy:.1f} L{x2:.1f},{ey:.1f}"
            lx, ly = (x1 + x2) / 2, (sy + ey) / 2
        else:  # back edge or same row: around the right side
            sx, ex = x1 + width_of[a] / 2, x2 + width_of[b] / 2
            bend = max(sx, ex) + 30 + 6 * (k % 4)
            path = f"M{sx:.1f},{y1:.1f} C{bend:.1f},{y1:.1f} {bend:.1f},{y2:.1f} {ex:.1f},{y2:.1f}"
            lx, ly = bend - 4, (y1 + y2) / 2
        out.append(f'<path d="{path}" fill="none" stroke="#555" {style} marker-end="url(#arrow)"/>')
        label = data.get("label", "")
        if kind == "conditional" and label and label != b:
            out.append(
                f'<text x="{lx + 4:.1f}" y="{ly:.1f}" fill="#336" font-size="11">'
                f"{escape(str(label))}</text>"
            )
    for n, (cx, cy) in pos.items():
        w = width_of[n]
        terminal = n in (START, END)
        fill = "#eeeeee" if terminal else "#e8f0fe"
        radius = _BOX_H / 2 if terminal else 5
        double = g.nodes[n].get("subgraph")
        out.append(
            f'<rect x="{cx - w / 2:.1f}" y="{cy - _BOX_H / 2:.1f}" width="{w:.1f}" '
            f'height="{_BOX_H:.0f}" rx="{radius:.0f}" fill="{fill}" stroke="#4a6fa5"'
            + (' stroke-width="2.5"' if double else "")
            + "/>"
        )
        out.append(
            f'<text x="{cx:.1f}" y="{cy + 4:.1f}" text-anchor="middle">{escape(str(n))}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
