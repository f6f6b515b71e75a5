"""``StateGraph``: declaring nodes and edges, and compiling them into a runnable graph."""

from __future__ import annotations

import hashlib
import inspect
import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import networkx as nx

from graphexec._checkpoint import BaseCheckpointer
from graphexec._state import StateSchema
from graphexec._types import END, START, RetryPolicy
from graphexec.errors import GraphBuildError

if TYPE_CHECKING:
    from graphexec._graph import CompiledGraph

__all__ = ["StateGraph"]

StateT = TypeVar("StateT")
_RESERVED_CHARS = ("|", ":")
DEFAULT_MAX_TASKS_PER_STEP = 100_000
"""The default ``compile(max_tasks_per_step=...)``.

Measured on the in-memory store (2 vCPUs): a step of 100,000 one-item ``Send`` workers takes
about 15 s and 0.5 GB; SQLite about 25 s. Far more than a real map step needs, and refused
before a runaway fan-out (a loop appending Sends, a fan over the wrong list) holds the process
for minutes and gigabytes.
"""


def _required_positional(fn: Callable[..., Any], what: str, node: str) -> int:
    """How many positional parameters ``fn`` requires (``*args`` counts as unlimited)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise GraphBuildError(
            f"{what}: cannot inspect the signature of {fn!r}: {e}", node=node
        ) from e
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 1
    return sum(
        1
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    )


def _accepts_ctx(fn: Callable[..., Any], what: str, node: str) -> bool:
    """Whether ``fn`` takes ``(state, ctx)`` rather than ``(state)``."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise GraphBuildError(
            f"{what}: cannot inspect the signature of {fn!r}: {e}", node=node
        ) from e
    positional = [
        p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()):
        return True
    if not positional:
        raise GraphBuildError(
            f"{what}: {fn!r} must take the state as its first parameter", node=node
        )
    if len(positional) > 2 and all(p.default is p.empty for p in positional[2:]):
        raise GraphBuildError(
            f"{what}: {fn!r} takes {len(positional)} required parameters; "
            "a node takes (state) or (state, ctx)",
            node=node,
        )
    return len(positional) >= 2


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node as compiled: its callable and execution options."""

    name: str
    fn: Callable[..., Any] | None
    subgraph: CompiledGraph[Any] | None
    is_async: bool
    takes_ctx: bool
    retry: RetryPolicy | None
    timeout: float | None
    destinations: tuple[str, ...]
    metadata: Mapping[str, Any]
    needs_approval: bool | Callable[[Any], Any] = False
    on_reject: str | None = None
    preview: Callable[[Any], Any] | tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class BranchSpec:
    """A conditional edge: ``path(state)`` picks the next node(s)."""

    source: str
    path: Callable[..., Any]
    path_map: Mapping[Hashable, str] | None
    is_async: bool

    @property
    def name(self) -> str:
        """The routing function's name."""
        return getattr(self.path, "__name__", type(self.path).__name__)


@dataclass(frozen=True, slots=True)
class GraphSpec:
    """Everything ``compile()`` validated, in declaration order."""

    schema: StateSchema
    nodes: Mapping[str, NodeSpec]
    edges: Mapping[str, tuple[str, ...]]
    joins: tuple[tuple[tuple[str, ...], str], ...]
    branches: Mapping[str, tuple[BranchSpec, ...]]
    version: str
    order: Mapping[str, int] = field(default_factory=dict)
    max_tasks_per_step: int = DEFAULT_MAX_TASKS_PER_STEP
    """The most tasks one step may start (``compile(max_tasks_per_step=...)``); not part of
    ``version``: raising it lets a graph resume a thread a lower limit refused."""


class StateGraph(Generic[StateT]):
    """A graph of nodes over a typed state.

    Example:
        >>> builder = StateGraph(State)
        >>> builder.add_node("classify", classify)
        >>> builder.add_edge(START, "classify")
        >>> builder.add_edge("classify", END)
        >>> graph = builder.compile()

    Args:
        state_schema: A ``TypedDict``, pydantic ``BaseModel`` or dataclass. Keys annotated
            ``Annotated[T, reducer]`` fold updates with the reducer; others keep the last value.
    """

    def __init__(self, state_schema: type[StateT]) -> None:
        self._schema = StateSchema(state_schema)
        self._nodes: dict[str, NodeSpec] = {}
        self._edges: list[tuple[str, str]] = []
        self._joins: list[tuple[tuple[str, ...], str]] = []
        self._branches: list[BranchSpec] = []
        self._compiled = False

    # -- nodes ----------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        fn: Callable[..., Any] | CompiledGraph[Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        destinations: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        needs_approval: bool | Callable[[Any], Any] = False,
        on_reject: str | None = None,
        preview: Callable[[Any], Any] | Sequence[str] | None = None,
    ) -> StateGraph[StateT]:
        """Add a node.

        Args:
            name: Unique node name. Not ``START``/``END``, not starting with ``__``, without
                ``|`` or ``:``.
            fn: ``fn(state)`` or ``fn(state, ctx)``, sync or async, returning a partial update
                (dict or model), ``None``, a :class:`~graphexec.Command` or a list of
                :class:`~graphexec.Send`; or a compiled graph to run as a subgraph. When
                omitted, ``name`` must be a function and its ``__name__`` is used.
            retry: Retry policy for failures of this node.
            timeout: Seconds each attempt may take before :class:`NodeTimeoutError`.
            destinations: Nodes this node may route to with ``Command(goto=...)``, declared so
                that ``compile()`` can check reachability and draw the edges.
            metadata: Free-form metadata recorded with the node.
            needs_approval: ``True``, or a predicate ``(state) -> bool`` (sync or async): before
                the node runs, the run pauses with an ``Interruption(kind="approval")`` until a
                human approves (optionally with edits) or rejects.
            on_reject: Where a rejected run goes: a node name, ``END`` (this branch stops, the
                run goes on), or ``None`` (the default: the run ends with status
                ``"rejected"``).
            preview: What the approver sees: a callable ``(state) -> value``, or state keys to
                show. Default: the whole state (or the ``Send`` argument).

        Returns:
            The builder, for chaining.
        """
        if fn is None and callable(name):
            fn, name = name, getattr(name, "__name__", "")
        self._check_name(name)
        if name in self._nodes:
            raise GraphBuildError(
                f"node {name!r} is already defined; node names must be unique", node=name
            )
        if fn is None:
            raise GraphBuildError(f"node {name!r}: pass the function to run", node=name)
        if timeout is not None and timeout <= 0:
            raise GraphBuildError(f"node {name!r}: timeout must be > 0 (got {timeout})", node=name)
        if on_reject is not None and needs_approval is False:
            raise GraphBuildError(
                f"node {name!r}: on_reject= only applies with needs_approval=", node=name
            )
        if not (isinstance(needs_approval, bool) or callable(needs_approval)):
            raise GraphBuildError(
                f"node {name!r}: needs_approval must be True/False or a predicate(state)",
                node=name,
            )
        shown = preview if preview is None or callable(preview) else tuple(preview)
        from graphexec._graph import CompiledGraph

        if isinstance(fn, CompiledGraph):
            spec = NodeSpec(
                name,
                None,
                fn,
                True,
                True,
                retry,
                timeout,
                tuple(destinations),
                dict(metadata or {}),
                needs_approval,
                on_reject,
                shown,
            )
        elif callable(fn):
            spec = NodeSpec(
                name,
                fn,
                None,
                _is_async(fn),
                _accepts_ctx(fn, f"node {name!r}", name),
                retry,
                timeout,
                tuple(destinations),
                dict(metadata or {}),
                needs_approval,
                on_reject,
                shown,
            )
        else:
            raise GraphBuildError(
                f"node {name!r}: {fn!r} is not callable; pass a function or a compiled graph",
                node=name,
            )
        self._nodes[name] = spec
        return self

    def _check_name(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise GraphBuildError(f"node name {name!r} must be a non-empty string")
        if name in (START, END):
            raise GraphBuildError(f"node name {name!r} is reserved", node=name)
        if name.startswith("__"):
            raise GraphBuildError(
                f"node name {name!r} is reserved: names starting with '__' belong to graphexec",
                node=name,
            )
        for ch in _RESERVED_CHARS:
            if ch in name:
                raise GraphBuildError(
                    f"node name {name!r} contains reserved character {ch!r} (used in "
                    "checkpoint namespaces)",
                    node=name,
                )

    # -- edges ----------------------------------------------------------------------------

    def add_edge(self, start: str | Sequence[str], end: str) -> StateGraph[StateT]:
        """Run ``end`` after ``start``.

        With a list of start nodes, ``end`` is a join: it runs once after *all* of them have
        finished, even when they finish in different supersteps.
        """
        if isinstance(start, str):
            if start == END:
                raise GraphBuildError("END cannot be the start of an edge", edge=(start, end))
            if end == START:
                raise GraphBuildError("START cannot be the end of an edge", edge=(start, end))
            self._edges.append((start, end))
            return self
        sources = tuple(start)
        if not sources:
            raise GraphBuildError(f"add_edge([], {end!r}): a join needs at least one source")
        if START in sources or END in sources or end in (START, END):
            raise GraphBuildError(
                f"join {list(sources)} -> {end!r}: joins connect ordinary nodes only"
            )
        self._joins.append((sources, end))
        return self

    def add_conditional_edges(
        self,
        source: str,
        path: Callable[..., Any],
        path_map: Mapping[Hashable, str] | Sequence[str] | None = None,
    ) -> StateGraph[StateT]:
        """After ``source``, call ``path(state)`` to pick what runs next.

        ``path`` returns a node name, ``END``, a :class:`~graphexec.Send`, or a list of these;
        with ``path_map`` it returns keys of the map instead. Without a map, the graph cannot
        know the targets ahead of time, so drawing and reachability checks treat every node as
        a possible target.
        """
        if source == END:
            raise GraphBuildError("END cannot have outgoing conditional edges")
        if not callable(path):
            raise GraphBuildError(f"conditional edge from {source!r}: path must be callable")
        if _required_positional(path, f"conditional edge from {source!r}", source) != 1:
            raise GraphBuildError(
                f"conditional edge from {source!r}: the path function must take exactly one "
                "required parameter, the state",
                node=source,
            )
        mapping: dict[Hashable, str] | None
        if path_map is None:
            mapping = None
        elif isinstance(path_map, Mapping):
            mapping = dict(path_map)
        else:
            mapping = {name: name for name in path_map}
        self._branches.append(
            BranchSpec(
                source,
                path,
                mapping,
                _is_async(path),
            )
        )
        return self

    def add_sequence(
        self, steps: Sequence[str | Callable[..., Any] | tuple[str, Callable[..., Any]]]
    ) -> StateGraph[StateT]:
        """Chain steps with edges: names of existing nodes, functions, or ``(name, fn)`` pairs."""
        if not steps:
            raise GraphBuildError("add_sequence() needs at least one step")
        names: list[str] = []
        for step in steps:
            if isinstance(step, str):
                names.append(step)
            elif isinstance(step, tuple):
                self.add_node(step[0], step[1])
                names.append(step[0])
            else:
                name = getattr(step, "__name__", "")
                self.add_node(name, step)
                names.append(name)
        for a, b in itertools.pairwise(names):
            self.add_edge(a, b)
        return self

    def set_entry_point(self, node: str) -> StateGraph[StateT]:
        """Same as ``add_edge(START, node)``."""
        return self.add_edge(START, node)

    def set_finish_point(self, node: str) -> StateGraph[StateT]:
        """Same as ``add_edge(node, END)``."""
        return self.add_edge(node, END)

    # -- compile --------------------------------------------------------------------------

    def _validate(self, max_tasks_per_step: int) -> GraphSpec:
        nodes = self._nodes
        known = set(nodes)

        def check(name: str, what: str, edge: tuple[str, str] | None = None) -> None:
            if name not in known:
                hint = f"; defined nodes: {', '.join(sorted(known)) or '(none)'}"
                raise GraphBuildError(
                    f"{what} refers to unknown node {name!r}{hint}", node=name, edge=edge
                )

        if not nodes:
            raise GraphBuildError("the graph has no nodes; add_node() first")
        for a, b in self._edges:
            if a != START:
                check(a, f"edge {a!r} -> {b!r}", (a, b))
            if b != END:
                check(b, f"edge {a!r} -> {b!r}", (a, b))
        for sources, target in self._joins:
            for s in sources:
                check(s, f"join {list(sources)} -> {target!r}", (s, target))
            check(target, f"join {list(sources)} -> {target!r}", (sources[0], target))
        for br in self._branches:
            if br.source != START:
                check(br.source, f"conditional edge from {br.source!r}")
            for key, target in (br.path_map or {}).items():
                if target != END and target not in known:
                    raise GraphBuildError(
                        f"conditional edge from {br.source!r}: path map entry {key!r} points "
                        f"to unknown node {target!r}",
                        node=br.source,
                        edge=(br.source, target),
                    )
        for spec in nodes.values():
            for d in spec.destinations:
                if d != END:
                    check(d, f"destinations of node {spec.name!r}", (spec.name, d))
            if spec.on_reject not in (None, END):
                assert spec.on_reject is not None
                check(
                    spec.on_reject, f"on_reject of node {spec.name!r}", (spec.name, spec.on_reject)
                )
        g = self._analysis_graph()
        if not any(True for _ in g.successors(START)):
            raise GraphBuildError(
                "the graph has no entry point; add_edge(START, <first node>)", node=START
            )
        reachable = nx.descendants(g, START)
        for name in nodes:
            if name not in reachable:
                raise GraphBuildError(
                    f"node {name!r} is unreachable from START; connect it with add_edge or a "
                    "conditional edge (or declare it in another node's destinations=)",
                    node=name,
                )
        for name in nodes:
            if END not in nx.descendants(g, name):
                raise GraphBuildError(
                    f"node {name!r} has no path to END; add_edge({name!r}, END), a conditional "
                    "edge, or declare destinations=[...] if it routes with Command(goto=...)",
                    node=name,
                )
        edges: dict[str, list[str]] = {}
        for a, b in self._edges:
            if b not in edges.setdefault(a, []):
                edges[a].append(b)
        branches: dict[str, list[BranchSpec]] = {}
        for br in self._branches:
            branches.setdefault(br.source, []).append(br)
        order = {name: i for i, name in enumerate(nodes)}
        return GraphSpec(
            schema=self._schema,
            nodes=dict(nodes),
            edges={k: tuple(v) for k, v in edges.items()},
            joins=tuple(self._joins),
            branches={k: tuple(v) for k, v in branches.items()},
            version=self._fingerprint(),
            order=order,
            max_tasks_per_step=max_tasks_per_step,
        )

    def _analysis_graph(self) -> nx.DiGraph[str]:
        g: nx.DiGraph[str] = nx.DiGraph()
        g.add_nodes_from([START, *self._nodes, END])
        g.add_edges_from(self._edges)
        for sources, target in self._joins:
            g.add_edges_from((s, target) for s in sources)
        for br in self._branches:
            targets = list(br.path_map.values()) if br.path_map is not None else [*self._nodes, END]
            g.add_edges_from((br.source, t) for t in targets)
        for spec in self._nodes.values():
            g.add_edges_from((spec.name, d) for d in spec.destinations)
            if spec.on_reject is not None:
                g.add_edge(spec.name, spec.on_reject)
        return g

    def _fingerprint(self) -> str:
        parts = [f"schema={self._schema.fingerprint()}"]
        for name, spec in self._nodes.items():
            sub = spec.subgraph.version if spec.subgraph is not None else ""
            approval = "" if spec.needs_approval is False else f"approval->{spec.on_reject}"
            parts.append(f"node={name}:{sub}:{','.join(spec.destinations)}:{approval}")
        parts += [f"edge={a}->{b}" for a, b in sorted(self._edges)]
        parts += [f"join={','.join(s)}->{t}" for s, t in sorted(self._joins)]
        for br in self._branches:
            targets = (
                "*"
                if br.path_map is None
                else ",".join(
                    f"{k}={v}" for k, v in sorted(br.path_map.items(), key=lambda kv: repr(kv[0]))
                )
            )
            parts.append(f"branch={br.source}:{targets}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]

    def compile(
        self,
        checkpointer: BaseCheckpointer | None = None,
        *,
        memory: Any = None,
        name: str | None = None,
        recursion_limit: int = 25,
        interrupt_before: Sequence[str] = (),
        interrupt_after: Sequence[str] = (),
        lease_ttl: float = 30.0,
        max_tasks_per_step: int = DEFAULT_MAX_TASKS_PER_STEP,
    ) -> CompiledGraph[StateT]:
        """Validate the graph and return a runnable :class:`~graphexec.CompiledGraph`.

        Args:
            checkpointer: Where checkpoints go. Without one, runs are not durable and no
                thread state survives the run.
            memory: A memory object (for example ``SqliteMemory``) nodes reach as
                ``ctx.memory``.
            name: A name for the graph (shown in drawings and worker registries).
            recursion_limit: Default maximum supersteps per run.
            interrupt_before: Static breakpoints: pause before a step that would run one of
                these nodes (``"*"`` for every node). Continue with ``invoke(None, ...)``.
            interrupt_after: Pause after a step that ran one of these nodes.
            lease_ttl: Seconds a run's ownership of its thread lasts without a heartbeat (it is
                renewed every third of that). After a crash, another process can take the
                thread over once this has passed.
            max_tasks_per_step: The most tasks one superstep may start: ``Send`` tasks plus
                nodes triggered by edges. A step whose nodes would start more raises
                :class:`~graphexec.TaskLimitError` and is not checkpointed; the thread stays
                resumable. Send batches of items rather than one task per item to stay under
                it, or raise it.

        Raises:
            GraphBuildError: naming the node or edge at fault.
        """
        from graphexec._graph import CompiledGraph

        if recursion_limit < 1:
            raise GraphBuildError(f"recursion_limit must be >= 1 (got {recursion_limit})")
        if lease_ttl <= 0:
            raise GraphBuildError(f"lease_ttl must be > 0 seconds (got {lease_ttl})")
        if (
            not isinstance(max_tasks_per_step, int)
            or isinstance(max_tasks_per_step, bool)
            or max_tasks_per_step < 1
        ):
            raise GraphBuildError(
                f"max_tasks_per_step must be an int >= 1 (got {max_tasks_per_step!r})"
            )
        spec = self._validate(max_tasks_per_step)
        for option, names in (
            ("interrupt_before", interrupt_before),
            ("interrupt_after", interrupt_after),
        ):
            if isinstance(names, str):
                raise GraphBuildError(f"{option} takes a list of node names, not a string")
            for n in names:
                if n != "*" and n not in spec.nodes:
                    raise GraphBuildError(f"{option} names unknown node {n!r}", node=n)
        return CompiledGraph(
            spec,
            checkpointer=checkpointer,
            memory=memory,
            name=name or "graph",
            recursion_limit=recursion_limit,
            analysis=self._analysis_graph(),
            interrupt_before=frozenset(interrupt_before),
            interrupt_after=frozenset(interrupt_after),
            lease_ttl=lease_ttl,
        )
