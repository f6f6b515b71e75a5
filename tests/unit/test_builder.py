"""StateGraph: build-time validation, sugar, fingerprints, introspection and state schemas."""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pydantic
import pytest

from graphexec import END, START, CompiledGraph, GraphBuildError, StateGraph


class State(TypedDict):
    x: int
    log: Annotated[list[str], operator.add]


class Unresolvable(TypedDict):
    x: Missing  # type: ignore[name-defined]  # noqa: F821 - deliberately undefined


class Opaque:
    """A type pydantic cannot build a validator for."""


class OpaqueKey(TypedDict):
    thing: Opaque


ReservedKey = TypedDict("ReservedKey", {"__x": int})


class NotASchema:
    x: int


def noop(state: Any) -> None:
    return None


def logger(name: str) -> Callable[[Any], dict[str, Any]]:
    def node(state: Any) -> dict[str, Any]:
        return {"log": [name]}

    node.__name__ = name
    return node


def first(state: Any) -> dict[str, Any]:
    return {"log": ["first"]}


def second(state: Any) -> dict[str, Any]:
    return {"log": ["second"]}


def to_end(state: Any) -> str:
    return END


def two_nodes() -> StateGraph[State]:
    """START -> a -> b -> END."""
    return (
        StateGraph(State)
        .add_node("a", noop)
        .add_node("b", noop)
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_edge("b", END)
    )


def build_error(fn: Callable[[], Any]) -> GraphBuildError:
    with pytest.raises(GraphBuildError) as info:
        fn()
    return info.value


def edge_kinds(graph: CompiledGraph) -> dict[tuple[str, str], tuple[str, str | None]]:
    return {(a, b): (d["kind"], d.get("label")) for a, b, d in graph.to_networkx().edges(data=True)}


_DECL = re.compile(r'^    (?P<id>[^\s\[\(]+)(?:\[\[|\(\[|\[)"(?P<label>.*?)"')


def mermaid_ids(text: str) -> dict[str, str]:
    """Node label -> Mermaid id, from the node declarations of a flowchart."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _DECL.match(line)
        if m:
            out[m["label"]] = m["id"]
    return out


# -- unknown nodes ------------------------------------------------------------------------------


UNKNOWN_NODE_CASES: dict[str, tuple[Callable[[StateGraph[State]], Any], str, Any]] = {
    "edge source": (lambda g: g.add_edge("ghost", "b"), "ghost", ("ghost", "b")),
    "edge target": (lambda g: g.add_edge("a", "ghost"), "ghost", ("a", "ghost")),
    "join source": (lambda g: g.add_edge(["a", "ghost"], "b"), "ghost", ("ghost", "b")),
    "join target": (lambda g: g.add_edge(["a", "b"], "ghost"), "ghost", ("a", "ghost")),
    "conditional source": (
        lambda g: g.add_conditional_edges("ghost", to_end, [END]),
        "ghost",
        None,
    ),
    "conditional path map": (
        lambda g: g.add_conditional_edges("a", to_end, {"go": "ghost", "stop": END}),
        "a",
        ("a", "ghost"),
    ),
    "destinations": (
        lambda g: g.add_node("c", noop, destinations=["ghost"]).add_edge("b", "c"),
        "ghost",
        ("c", "ghost"),
    ),
}


@pytest.mark.parametrize("case", list(UNKNOWN_NODE_CASES))
def test_unknown_node_is_named(case: str) -> None:
    mutate, node, edge = UNKNOWN_NODE_CASES[case]
    builder = two_nodes()
    mutate(builder)
    err = build_error(builder.compile)
    assert err.node == node
    assert err.edge == edge
    assert "'ghost'" in str(err)


def test_unknown_node_message_lists_defined_nodes() -> None:
    err = build_error(two_nodes().add_edge("a", "ghost").compile)
    assert "defined nodes: a, b" in str(err)


# -- reachability -------------------------------------------------------------------------------


def test_unreachable_node() -> None:
    builder = two_nodes().add_node("island", noop).add_edge("island", END)
    err = build_error(builder.compile)
    assert err.node == "island"
    assert err.edge is None
    assert "'island'" in str(err)
    assert "unreachable" in str(err)


def dead_end() -> StateGraph[State]:
    """START -> a -> (END | b), and b leads nowhere."""
    return (
        StateGraph(State)
        .add_node("a", noop)
        .add_edge(START, "a")
        .add_edge("a", END)
        .add_edge("a", "b")
    )


def test_node_without_path_to_end() -> None:
    err = build_error(dead_end().add_node("b", noop).compile)
    assert err.node == "b"
    assert "'b'" in str(err)
    assert "no path to END" in str(err)


@pytest.mark.parametrize(
    "fix",
    [
        pytest.param(lambda g: g.add_node("b", noop, destinations=[END]), id="destinations-END"),
        pytest.param(lambda g: g.add_node("b", noop, destinations=["a"]), id="destinations-loop"),
        pytest.param(
            lambda g: g.add_node("b", noop).add_conditional_edges("b", to_end, [END]),
            id="conditional",
        ),
        pytest.param(
            lambda g: g.add_node("b", noop).add_conditional_edges("b", to_end),
            id="conditional-no-map",
        ),
    ],
)
def test_declared_route_gives_a_path_to_end(fix: Callable[[StateGraph[State]], Any]) -> None:
    builder = dead_end()
    fix(builder)
    assert isinstance(builder.compile(), CompiledGraph)


def test_no_entry_edge() -> None:
    err = build_error(StateGraph(State).add_node("a", noop).add_edge("a", END).compile)
    assert err.node == START
    assert "entry point" in str(err)


def test_no_nodes() -> None:
    err = build_error(StateGraph(State).compile)
    assert err.node is None
    assert "no nodes" in str(err)


# -- names --------------------------------------------------------------------------------------


def test_duplicate_node_name() -> None:
    err = build_error(lambda: StateGraph(State).add_node("a", noop).add_node("a", noop))
    assert err.node == "a"
    assert "'a'" in str(err)
    assert "already defined" in str(err)


@pytest.mark.parametrize("name", [START, END, "__x", "a|b", "a:b"])
def test_reserved_node_name(name: str) -> None:
    err = build_error(lambda: StateGraph(State).add_node(name, noop))
    assert err.node == name
    assert repr(name) in str(err)
    assert "reserved" in str(err)


def test_empty_node_name() -> None:
    err = build_error(lambda: StateGraph(State).add_node("", noop))
    assert err.node is None
    assert "non-empty" in str(err)


# -- edges --------------------------------------------------------------------------------------


def test_end_cannot_be_an_edge_source() -> None:
    err = build_error(lambda: StateGraph(State).add_edge(END, "a"))
    assert err.edge == (END, "a")
    assert "END" in str(err)


def test_start_cannot_be_an_edge_target() -> None:
    err = build_error(lambda: StateGraph(State).add_edge("a", START))
    assert err.edge == ("a", START)
    assert "START" in str(err)


# -- callables and options ------------------------------------------------------------------------


def test_non_callable_node() -> None:
    err = build_error(lambda: StateGraph(State).add_node("a", 42))  # type: ignore[arg-type]
    assert err.node == "a"
    assert "'a'" in str(err)
    assert "not callable" in str(err)


def test_node_with_three_required_parameters() -> None:
    def three(state: Any, ctx: Any, extra: Any) -> None:
        return None

    err = build_error(lambda: StateGraph(State).add_node("a", three))
    assert "'a'" in str(err)
    assert "3 required parameters" in str(err)
    assert err.node == "a"


def test_node_with_optional_third_parameter_is_accepted() -> None:
    def node(state: Any, ctx: Any, extra: Any = None) -> None:
        return None

    StateGraph(State).add_node("a", node)


def test_conditional_path_taking_two_parameters() -> None:
    def route(state: Any, ctx: Any) -> str:
        return END

    builder = StateGraph(State).add_node("a", noop)
    err = build_error(lambda: builder.add_conditional_edges("a", route))
    assert "'a'" in str(err)
    assert "exactly one required parameter" in str(err)
    assert err.node == "a"


@pytest.mark.parametrize("timeout", [0, -1.5])
def test_non_positive_timeout(timeout: float) -> None:
    err = build_error(lambda: StateGraph(State).add_node("a", noop, timeout=timeout))
    assert err.node == "a"
    assert "'a'" in str(err)
    assert "timeout" in str(err)


@pytest.mark.parametrize("limit", [0, -3])
def test_recursion_limit_below_one(limit: int) -> None:
    err = build_error(lambda: two_nodes().compile(recursion_limit=limit))
    assert "recursion_limit" in str(err)
    assert str(limit) in str(err)


# -- schemas refused ----------------------------------------------------------------------------


@pytest.mark.parametrize("schema", [NotASchema, int, dict], ids=["plain-class", "int", "dict"])
def test_unsupported_state_schema(schema: Any) -> None:
    err = build_error(lambda: StateGraph(schema))
    assert "TypedDict, pydantic BaseModel or dataclass" in str(err)


def test_unresolvable_forward_reference() -> None:
    err = build_error(lambda: StateGraph(Unresolvable))
    assert "Unresolvable" in str(err)
    assert "Missing" in str(err)


def test_key_type_without_validator_is_named() -> None:
    err = build_error(lambda: StateGraph(OpaqueKey))
    assert "'thing'" in str(err)


def test_reserved_state_key() -> None:
    err = build_error(lambda: StateGraph(ReservedKey))
    assert "'__x'" in str(err)


# -- sugar --------------------------------------------------------------------------------------


def run_log(graph: CompiledGraph) -> list[str]:
    return list(graph.invoke({"x": 0, "log": []})["log"])


def test_add_sequence_of_existing_node_names() -> None:
    builder = StateGraph(State).add_node("a", logger("a")).add_node("b", logger("b"))
    builder.add_sequence(["a", "b"]).set_entry_point("a").set_finish_point("b")
    graph = builder.compile()
    assert edge_kinds(graph)[("a", "b")] == ("edge", None)
    assert run_log(graph) == ["a", "b"]


def test_add_sequence_of_functions_uses_their_names() -> None:
    builder = StateGraph(State).add_sequence([first, second])
    graph = builder.set_entry_point("first").set_finish_point("second").compile()
    assert set(graph.spec.nodes) == {"first", "second"}
    assert run_log(graph) == ["first", "second"]


def test_add_sequence_of_name_function_pairs() -> None:
    builder = StateGraph(State).add_sequence([("one", logger("one")), ("two", logger("two"))])
    graph = builder.set_entry_point("one").set_finish_point("two").compile()
    assert run_log(graph) == ["one", "two"]


def test_entry_and_finish_points_are_edges_from_start_and_to_end() -> None:
    graph = (
        StateGraph(State)
        .add_node("a", logger("a"))
        .set_entry_point("a")
        .set_finish_point("a")
        .compile()
    )
    assert edge_kinds(graph) == {(START, "a"): ("edge", None), ("a", END): ("edge", None)}
    assert run_log(graph) == ["a"]


def test_join_runs_once_after_all_sources() -> None:
    graph = (
        StateGraph(State)
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_node("c", logger("c"))
        .add_edge(START, "a")
        .add_edge(START, "b")
        .add_edge(["a", "b"], "c")
        .add_edge("c", END)
        .compile()
    )
    assert run_log(graph) == ["a", "b", "c"]


def test_path_map_as_list() -> None:
    def route(state: Any) -> str:
        return "b"

    graph = (
        StateGraph(State)
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_edge(START, "a")
        .add_conditional_edges("a", route, ["b", END])
        .add_edge("b", END)
        .compile()
    )
    kinds = edge_kinds(graph)
    assert kinds[("a", "b")] == ("conditional", "b")
    assert kinds[("a", END)] == ("conditional", END)
    assert run_log(graph) == ["a", "b"]


def test_conditional_edge_without_path_map_makes_every_node_reachable() -> None:
    def route(state: Any) -> str:
        return "b"

    graph = (
        StateGraph(State)
        .add_node("a", logger("a"))
        .add_node("b", logger("b"))
        .add_edge(START, "a")
        .add_conditional_edges("a", route)
        .add_edge("b", END)
        .compile()
    )
    kinds = edge_kinds(graph)
    assert {b for (a, b), (kind, _) in kinds.items() if a == "a" and kind == "conditional"} == {
        "a",
        "b",
        END,
    }
    assert run_log(graph) == ["a", "b"]


# -- version ------------------------------------------------------------------------------------


def routed(**changes: Any) -> CompiledGraph:
    """START -> a -> (b | c) -> END, a -> d; with one declaration changed."""
    opts: dict[str, Any] = {
        "edge": ("b", END),
        "path_map": {"left": "b", "right": "c"},
        "join": (["b", "c"], "d"),
        "destinations": (),
        "extra_node": False,
    }
    opts.update(changes)

    def route(state: Any) -> str:
        return "left"

    builder = (
        StateGraph(State)
        .add_node("a", logger("a"), destinations=opts["destinations"])
        .add_node("b", logger("b"))
        .add_node("c", logger("c"))
        .add_node("d", logger("d"))
        .add_edge(START, "a")
        .add_conditional_edges("a", route, opts["path_map"])
        .add_edge(*opts["edge"])
        .add_edge("c", END)
        .add_edge(*opts["join"])
        .add_edge("d", END)
    )
    if opts["extra_node"]:
        builder.add_node("e", noop).add_edge("a", "e").add_edge("e", END)
    return builder.compile()


def test_version_is_stable_across_identical_builds() -> None:
    v1, v2 = routed().version, routed().version
    assert v1 == v2
    assert re.fullmatch(r"[0-9a-f]{16}", v1)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"edge": ("b", "c")}, id="edge-target"),
        pytest.param({"path_map": {"left": "c", "right": "b"}}, id="path-map-target"),
        pytest.param({"path_map": {"left": "b", "other": "c"}}, id="path-map-key"),
        pytest.param({"join": (["b"], "d")}, id="join-sources"),
        pytest.param({"extra_node": True}, id="extra-node"),
        pytest.param({"destinations": ("c",)}, id="destinations"),
    ],
)
def test_version_changes_with_the_structure(change: dict[str, Any]) -> None:
    assert routed(**change).version != routed().version


# -- to_networkx / draw_mermaid -------------------------------------------------------------------


def every_kind() -> CompiledGraph:
    """One edge of each kind: plain, join, labelled conditional and declared destination."""

    def route(state: Any) -> str:
        return "yes"

    return (
        StateGraph(State)
        .add_node("a", logger("a"))
        .add_node("b", logger("b"), destinations=["d"])
        .add_node("c", logger("c"))
        .add_node("d", logger("d"))
        .add_edge(START, "a")
        .add_conditional_edges("a", route, {"yes": "b", "no": END})
        .add_edge(START, "c")
        .add_edge(["b", "c"], "d")
        .add_edge("d", END)
        .compile(name="kinds")
    )


def test_to_networkx_edges_carry_kind_and_label() -> None:
    g = every_kind().to_networkx()
    assert g.graph["name"] == "kinds"
    assert list(g.nodes) == [START, "a", "b", "c", "d", END]
    assert edge_kinds(every_kind()) == {
        (START, "a"): ("edge", None),
        (START, "c"): ("edge", None),
        ("a", "b"): ("conditional", "yes"),
        ("a", END): ("conditional", "no"),
        ("b", "d"): ("destination", None),
        ("c", "d"): ("join", None),
        ("d", END): ("edge", None),
    }


def test_draw_mermaid_arrow_styles() -> None:
    text = every_kind().draw_mermaid()
    lines = {line.strip() for line in text.splitlines()}
    assert text.startswith("flowchart TD\n")
    for name in ["a", "b", "c", "d"]:
        assert f'{name}["{name}"]' in lines
    assert '__start__(["__start__"])' in lines
    assert '__end__(["__end__"])' in lines
    assert "__start__ --> a" in lines
    assert 'a -. "yes" .-> b' in lines
    assert 'a -. "no" .-> __end__' in lines
    assert "b -.-> d" in lines
    assert "c ==> d" in lines
    assert "b ==> d" in lines  # b is both a join source and declares d as a destination
    assert "d --> __end__" in lines


def test_draw_mermaid_unlabelled_conditional_when_key_is_the_target() -> None:
    graph = (
        StateGraph(State)
        .add_node("a", noop)
        .add_node("b", noop)
        .add_edge(START, "a")
        .add_conditional_edges("a", to_end, ["b", END])
        .add_edge("b", END)
        .compile()
    )
    lines = {line.strip() for line in graph.draw_mermaid().splitlines()}
    assert "a -.-> b" in lines
    assert "a -.-> __end__" in lines


def test_draw_mermaid_keeps_every_key_routing_to_one_target() -> None:
    def route(state: Any) -> str:
        return "high"

    graph = (
        StateGraph(State)
        .add_node("a", noop)
        .add_node("escalate", noop)
        .add_edge(START, "a")
        .add_conditional_edges("a", route, {"high": "escalate", "urgent": "escalate", "ok": END})
        .add_edge("escalate", END)
        .compile()
    )
    text = graph.draw_mermaid()
    assert '"high"' in text
    assert '"urgent"' in text


def test_draw_mermaid_keeps_a_static_edge_next_to_a_conditional_one() -> None:
    graph = (
        StateGraph(State)
        .add_node("a", noop)
        .add_node("b", noop)
        .add_edge(START, "a")
        .add_edge("a", "b")
        .add_conditional_edges("a", to_end, ["b", END])
        .add_edge("b", END)
        .compile()
    )
    lines = {line.strip() for line in graph.draw_mermaid().splitlines()}
    assert "a --> b" in lines


ODD_NAMES = ["my node", "x-y.z", 'say "hi"', "naïve"]


def odd_graph(names: list[str]) -> CompiledGraph:
    builder = StateGraph(State)
    for name in names:
        builder.add_node(name, noop).add_edge(START, name).add_edge(name, END)
    return builder.compile()


def test_draw_mermaid_sanitises_ids_and_keeps_labels() -> None:
    text = odd_graph(ODD_NAMES).draw_mermaid()
    ids = mermaid_ids(text)
    assert set(ids) == {START, END, "my node", "x-y.z", "say #quot;hi#quot;", "naïve"}
    for ident in ids.values():
        assert re.fullmatch(r"[A-Za-z0-9_]+", ident)
    assert f"{ids['my node']} --> __end__" in text


def test_draw_mermaid_ids_are_unique() -> None:
    ids = mermaid_ids(odd_graph(["a b", "a_b", "a-b"]).draw_mermaid())
    assert len(set(ids.values())) == len(ids)


def test_draw_mermaid_avoids_the_end_keyword_as_an_id() -> None:
    # Mermaid flowcharts break on a node whose id is the keyword "end".
    ids = mermaid_ids(odd_graph(["end"]).draw_mermaid())
    assert ids["end"].lower() != "end"


# -- schemas ------------------------------------------------------------------------------------


class Model(pydantic.BaseModel):
    x: int = 0
    tags: list[str] = pydantic.Field(default_factory=list)
    log: Annotated[list[str], operator.add] = []


@dataclasses.dataclass
class Data:
    x: int = 0
    name: str = "anon"
    log: Annotated[list[str], operator.add] = dataclasses.field(default_factory=list)


SCHEMA_CASES: dict[str, tuple[Any, type, dict[str, Any]]] = {
    "typeddict": (State, dict, {"x": 2, "log": ["n"]}),
    "pydantic": (Model, Model, {"x": 2, "tags": [], "log": ["n"]}),
    "dataclass": (Data, Data, {"x": 2, "name": "anon", "log": ["n"]}),
}


@pytest.mark.parametrize("case", list(SCHEMA_CASES))
def test_schema_kinds_compile_run_and_give_nodes_their_type(case: str) -> None:
    schema, node_type, expected = SCHEMA_CASES[case]
    received: list[Any] = []

    def node(state: Any) -> dict[str, Any]:
        received.append(state)
        x = state["x"] if isinstance(state, dict) else state.x
        return {"x": x + 1, "log": ["n"]}

    graph = StateGraph(schema).add_node("n", node).set_entry_point("n").set_finish_point("n")
    assert graph.compile().invoke({"x": 1}) == expected
    assert len(received) == 1
    assert type(received[0]) is node_type


def test_pydantic_node_sees_defaults() -> None:
    received: list[Model] = []

    def node(state: Model) -> None:
        received.append(state)

    StateGraph(Model).add_node("n", node).set_entry_point("n").set_finish_point(
        "n"
    ).compile().invoke({"x": 4})
    assert received[0].x == 4
    assert received[0].tags == []
    assert received[0].log == []


def test_dataclass_node_sees_defaults() -> None:
    received: list[Data] = []

    def node(state: Data) -> None:
        received.append(state)

    StateGraph(Data).add_node("n", node).set_entry_point("n").set_finish_point(
        "n"
    ).compile().invoke({"x": 4})
    assert received[0] == Data(x=4, name="anon", log=[])
