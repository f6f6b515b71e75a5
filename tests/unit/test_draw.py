"""``draw_svg``: a well-formed, self-contained image of any valid graph, loops included."""

from __future__ import annotations

import xml.dom.minidom
from typing import Any, TypedDict

from graphexec import END, START, StateGraph


class S(TypedDict, total=False):
    n: int


def _loop_graph() -> Any:
    b = StateGraph(S)
    b.add_node("draft", lambda s: {"n": s.get("n", 0) + 1})
    b.add_node("review", lambda s: {})
    b.add_node('a<b & "c"', lambda s: {})
    b.add_edge(START, "draft")
    b.add_edge("draft", "review")
    b.add_conditional_edges(
        "review",
        lambda s: "again" if s["n"] < 3 else "done",
        {"again": "draft", "done": 'a<b & "c"'},
    )
    b.add_edge('a<b & "c"', END)
    return b.compile(name="loop & co")


def test_svg_is_well_formed_and_names_every_node_and_route() -> None:
    svg = _loop_graph().draw_svg()
    doc = xml.dom.minidom.parseString(svg)
    texts = [t.firstChild.data for t in doc.getElementsByTagName("text")]  # type: ignore[union-attr]
    for label in ("__start__", "draft", "review", 'a<b & "c"', "__end__", "again", "done"):
        assert label in texts, label
    assert doc.getElementsByTagName("title")[0].firstChild.data == "loop & co"  # type: ignore[union-attr]


def test_back_edges_curve_and_conditional_edges_are_dashed() -> None:
    doc = xml.dom.minidom.parseString(_loop_graph().draw_svg())
    paths = doc.getElementsByTagName("path")
    edges = [p for p in paths if p.getAttribute("marker-end")]
    assert len(edges) == 5  # start->draft, draft->review, review->draft, review->x, x->end
    curved = [p for p in edges if " C" in p.getAttribute("d")]
    assert len(curved) == 1  # review -> draft goes back up
    dashed = [p for p in edges if p.getAttribute("stroke-dasharray")]
    assert len(dashed) == 2  # both routes of the conditional edge
