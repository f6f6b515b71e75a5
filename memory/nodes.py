"""Ready-made graph nodes that wire the memory tiers into a workflow with ``add_node``.

Every factory returns an async node function ``(state, ctx) -> dict`` that reads the memory
object given to ``compile(memory=...)`` as ``ctx.memory`` (a :class:`~memory.SqliteMemory`, or
any object with the same tier attributes: ``session(id)``, ``facts``, ``blocks``,
``archival``). A graph compiled without memory makes these nodes raise
:class:`~graphexec.errors.MemoryStoreError`.

A typical chat turn::

    from memory import SqliteMemory
    from memory.nodes import compact, load_facts_summary, load_history, save_items

    b = StateGraph(Chat)
    b.add_node("load", load_history())
    b.add_node("facts", load_facts_summary(lambda s: ("user", s["user_id"])))
    b.add_node("agent", agent)  # appends the user's message and the reply to "messages"
    b.add_node("save", save_items())
    b.add_node("compact", compact(budget_tokens=4000))
    b.add_sequence(["load", "facts", "agent", "save", "compact"])
    graph = b.compile(checkpointer=cp, memory=SqliteMemory("memory.db"))

Crash safety: every write passes an ``op_key`` derived from ``ctx.idempotency_key`` (stable
across re-runs of the same task), so a step re-run after a crash or a retry does not store the
same item, fact or passage twice.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from graphexec import NodeContext
from graphexec.errors import MemoryStoreError
from memory._base import Namespace
from memory._text import EstimatingTokenCounter, TokenCounter, extractive_summary, item_text

__all__ = [
    "MemoryNode",
    "NamespaceSpec",
    "archival_insert",
    "archival_search",
    "compact",
    "load_facts_summary",
    "load_history",
    "render_blocks",
    "save_items",
    "sleeptime",
    "upsert_facts",
]

MemoryNode = Callable[[Mapping[str, Any], NodeContext], Awaitable[dict[str, Any]]]
"""The type of every node these factories return."""

NamespaceSpec = Namespace | Callable[[Mapping[str, Any]], Namespace]
"""A fixed namespace tuple, or a function of the state returning one."""

Summarizer = Callable[[Sequence[Mapping[str, Any]], int], str | Awaitable[str]]
Extractor = Callable[[Mapping[str, Any]], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]
Consolidator = Callable[[Any, Mapping[str, Any]], Any]


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _memory(ctx: NodeContext) -> Any:
    mem = ctx.memory
    if mem is None:
        raise MemoryStoreError(
            f"node {ctx.node!r} needs memory: compile the graph with compile(memory=...)"
        )
    return mem


def _state_value(state: Mapping[str, Any], key: str, node: str) -> Any:
    try:
        return state[key]
    except (KeyError, TypeError):
        raise MemoryStoreError(f"node {node!r}: the state has no {key!r}") from None


def _session_id(state: Mapping[str, Any], key: str, node: str) -> str:
    value = _state_value(state, key, node)
    if not isinstance(value, str) or not value:
        raise MemoryStoreError(
            f"node {node!r}: state[{key!r}] must be a non-empty session id str, got {value!r}"
        )
    return value


def _namespace(spec: NamespaceSpec, state: Mapping[str, Any]) -> Namespace:
    return tuple(spec(state)) if callable(spec) else spec


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _named(fn: MemoryNode, name: str) -> MemoryNode:
    # add_node(fn) without a name uses __name__: make it the factory's name.
    fn.__name__ = name
    fn.__qualname__ = name
    return fn


def _overlap(stored: Sequence[Any], current: Sequence[Any]) -> int:
    """The largest k such that the last k stored items equal the first k current items."""
    for k in range(min(len(stored), len(current)), 0, -1):
        if list(stored[len(stored) - k :]) == list(current[:k]):
            return k
    return 0


# --------------------------------------------------------------------------------------------
# sessions
# --------------------------------------------------------------------------------------------


def load_history(
    session_key: str = "session_id",
    into: str = "messages",
    limit: int | None = None,
    *,
    count_key: str | None = None,
) -> MemoryNode:
    """A node loading a session's history into the state.

    Args:
        session_key: State key holding the session id.
        into: State key that receives the items (replaced, oldest first).
        limit: Load only the latest ``limit`` items (all when ``None``).
        count_key: If given, also write the number of loaded items there, for
            :func:`save_items` ``since_key``.

    Returns:
        An async node ``(state, ctx) -> {into: items}``.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        items = await mem.session(_session_id(state, session_key, ctx.node)).get_items(limit)
        update: dict[str, Any] = {into: items}
        if count_key is not None:
            update[count_key] = len(items)
        return update

    return _named(node, "load_history")


def save_items(
    session_key: str = "session_id",
    source: str = "messages",
    since_key: str | None = None,
) -> MemoryNode:
    """A node appending the run's new items of ``state[source]`` to the session.

    Which items are new:

    - With ``since_key``: ``state[since_key]`` is the number of leading items that came from
      the store (as written by :func:`load_history` ``count_key``); the items after them are new.
    - Without: the session's latest items are compared with the start of ``state[source]``;
      the longest overlap (the tail of the stored history equal to the head of the list) is
      taken as already stored and the rest is new. This is right whenever ``state[source]``
      is the output of :func:`load_history` (with any ``limit``) followed by new items, and
      stores nothing when run twice. Run it before :func:`compact` in the same turn: after a
      compaction the stored tail no longer matches what was loaded.

    The write uses ``op_key=ctx.idempotency_key + ":save"``: a re-run of the step after a crash
    stores nothing more.

    Args:
        session_key: State key holding the session id.
        source: State key holding the list of items.
        since_key: Optional state key with the count of already-stored leading items.

    Returns:
        An async node returning ``{}`` (read the session for the result).
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        session = mem.session(_session_id(state, session_key, ctx.node))
        items = list(_state_value(state, source, ctx.node) or [])
        if since_key is not None:
            start = state.get(since_key) or 0
            if not isinstance(start, int) or start < 0:
                raise MemoryStoreError(
                    f"node {ctx.node!r}: state[{since_key!r}] must be a count, got {start!r}"
                )
        else:
            stored = await session.get_items(len(items)) if items else []
            start = _overlap(stored, items)
        new = items[start:]
        if new:
            await session.add_items(new, op_key=f"{ctx.idempotency_key}:save")
        return {}

    return _named(node, "save_items")


def compact(
    session_key: str = "session_id",
    budget_tokens: int = 4000,
    threshold: float = 0.7,
    summarizer: Summarizer | None = None,
    counter: TokenCounter | None = None,
    keep_last: int = 4,
    *,
    target: float = 0.4,
    summary_chars: int = 1200,
    into: str | None = None,
) -> MemoryNode:
    """A node compacting a session under memory pressure.

    The session's context items are counted with ``counter`` (default: the documented
    estimate :func:`memory._text.estimate_tokens` of each item's text). When the total exceeds
    ``threshold * budget_tokens``, the oldest items are evicted — as few as needed for the rest
    to fit in ``target * budget_tokens``, always leaving the newest ``keep_last`` — and replaced
    by one ``{"role": "system", "content": summary}`` item whose ``replaces`` lists the evicted
    ids. The summary is ``summarizer(evicted_items, summary_chars)`` (sync or async; default
    :func:`memory._text.extractive_summary`). Evicted items stay searchable through recall.

    Args:
        session_key: State key holding the session id.
        budget_tokens: The context budget, in tokens.
        threshold: Fraction of the budget past which compaction happens.
        summarizer: ``(items, max_chars) -> str``, sync or async.
        counter: Token counter (an object with ``count(text) -> int``).
        keep_last: Items never evicted.
        target: Fraction of the budget the remaining items should fit in.
        summary_chars: ``max_chars`` passed to the summarizer.
        into: If given, a state key receiving ``{"evicted": [ids], "summary": text}`` when a
            compaction happened, or ``None``. Otherwise the node returns ``{}``; read the
            session to see the result.

    Returns:
        An async node.

    Raises:
        ValueError: Bad budget, threshold, target or keep_last.
    """
    if budget_tokens <= 0:
        raise ValueError("compact: budget_tokens must be positive")
    if not 0 < threshold <= 1 or not 0 <= target <= threshold:
        raise ValueError("compact: need 0 < threshold <= 1 and 0 <= target <= threshold")
    if keep_last < 0:
        raise ValueError("compact: keep_last must be >= 0")
    tokens = counter or EstimatingTokenCounter()
    summarise: Summarizer = summarizer or extractive_summary

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        session = mem.session(_session_id(state, session_key, ctx.node))
        items = await session.get_items()
        sizes = [tokens.count(item_text(item)) for item in items]
        total = sum(sizes)
        report: dict[str, Any] | None = None
        if total > threshold * budget_tokens:
            goal = target * budget_tokens
            count = 0
            evictable = max(0, len(items) - keep_last)
            while count < evictable and total > goal:
                total -= sizes[count]
                count += 1
            # Evicting a single item for a summary of it gains nothing.
            if count >= 2 or (count == 1 and evictable == 1):
                text = await _maybe_await(summarise(items[:count], summary_chars))
                text = text or f"({count} earlier items were compacted)"
                ids = await session.evict_oldest(
                    count, summary={"role": "system", "content": str(text)}
                )
                report = {"evicted": ids, "summary": str(text)}
        return {} if into is None else {into: report}

    return _named(node, "compact")


# --------------------------------------------------------------------------------------------
# facts
# --------------------------------------------------------------------------------------------


def load_facts_summary(
    namespace: NamespaceSpec,
    into: str = "facts",
    max_chars: int = 1000,
) -> MemoryNode:
    """A node loading a facts summary (``- key: value`` lines) into the state.

    Args:
        namespace: The facts' namespace, or a function of the state returning it.
        into: State key receiving the summary text.
        max_chars: Budget for the summary.

    Returns:
        An async node ``(state, ctx) -> {into: summary}``.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        return {into: await mem.facts.summary(_namespace(namespace, state), max_chars)}

    return _named(node, "load_facts_summary")


def upsert_facts(extractor: Extractor, namespace: NamespaceSpec) -> MemoryNode:
    """A node writing the facts ``extractor(state)`` returns.

    Each ``key: value`` is written with ``source=ctx.node`` and
    ``op_key=f"{ctx.idempotency_key}:fact:{key}"``, so a re-run of the step writes nothing twice
    (no duplicate history entry, no version bump).

    Args:
        extractor: ``(state) -> {key: value}`` (sync or async); values JSON-compatible.
        namespace: The namespace, or a function of the state returning it.

    Returns:
        An async node returning ``{}``.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        facts = await _maybe_await(extractor(state))
        if not isinstance(facts, Mapping):
            raise MemoryStoreError(
                f"node {ctx.node!r}: the extractor must return a mapping, got "
                f"{type(facts).__name__}"
            )
        ns = _namespace(namespace, state)
        for key, value in facts.items():
            await mem.facts.put(
                ns, key, value, source=ctx.node, op_key=f"{ctx.idempotency_key}:fact:{key}"
            )
        return {}

    return _named(node, "upsert_facts")


# --------------------------------------------------------------------------------------------
# archival and blocks
# --------------------------------------------------------------------------------------------


def _archival(mem: Any, namespace: NamespaceSpec | None, state: Mapping[str, Any]) -> Any:
    if namespace is None:
        return mem.archival
    return mem.archival_for(_namespace(namespace, state))


def archival_search(
    query_key: str,
    into: str,
    top_k: int = 5,
    tags: Sequence[str] | None = None,
    *,
    tag_mode: str = "any",
    namespace: NamespaceSpec | None = None,
) -> MemoryNode:
    """A node searching archival memory with the text in ``state[query_key]``.

    The hits go to ``state[into]`` as JSON-compatible dicts, best first:
    ``{"id", "text", "tags", "metadata", "score"}``. An empty query gives ``[]``.

    Args:
        query_key: State key holding the query text.
        into: State key receiving the hits.
        top_k: How many hits.
        tags: Only passages with these tags (``tag_mode`` "any" or "all").
        tag_mode: ``"any"`` or ``"all"``.
        namespace: Archival namespace (``mem.archival_for``); the default one when ``None``.

    Returns:
        An async node.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        query = _state_value(state, query_key, ctx.node)
        if not query:
            return {into: []}
        page = await _archival(mem, namespace, state).search(
            str(query), tags=tags, tag_mode=tag_mode, top_k=top_k
        )
        return {
            into: [
                {
                    "id": hit.passage.id,
                    "text": hit.passage.text,
                    "tags": list(hit.passage.tags),
                    "metadata": dict(hit.passage.metadata),
                    "score": hit.score,
                }
                for hit in page.hits
            ]
        }

    return _named(node, "archival_search")


def archival_insert(
    text_key: str,
    tags: Sequence[str] = (),
    *,
    into: str | None = None,
    namespace: NamespaceSpec | None = None,
) -> MemoryNode:
    """A node inserting ``state[text_key]`` (a str, or a list of str) into archival memory.

    Each passage uses ``op_key=f"{ctx.idempotency_key}:archival:{i}"``: a re-run of the step
    inserts nothing twice and finds the same ids. Empty texts are skipped.

    Args:
        text_key: State key holding the text (or texts).
        tags: Tags for the passages.
        into: If given, a state key receiving the list of passage ids.
        namespace: Archival namespace; the default one when ``None``.

    Returns:
        An async node.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        value = _state_value(state, text_key, ctx.node)
        texts = [value] if isinstance(value, str) else list(value or [])
        store = _archival(mem, namespace, state)
        ids: list[str] = []
        for i, text in enumerate(texts):
            if not text:
                continue
            ids.append(
                await store.insert(
                    str(text), tags=tuple(tags), op_key=f"{ctx.idempotency_key}:archival:{i}"
                )
            )
        return {} if into is None else {into: ids}

    return _named(node, "archival_insert")


def render_blocks(into: str = "core_memory", labels: Sequence[str] | None = None) -> MemoryNode:
    """A node rendering core-memory blocks (``<memory_blocks>`` XML) into the state.

    Args:
        into: State key receiving the XML.
        labels: Only these blocks (all when ``None``).

    Returns:
        An async node ``(state, ctx) -> {into: xml}``.
    """

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        return {into: await mem.blocks.render(None if labels is None else list(labels))}

    return _named(node, "render_blocks")


# --------------------------------------------------------------------------------------------
# sleep-time consolidation
# --------------------------------------------------------------------------------------------

SLEEPTIME_NAMESPACE: Namespace = ("graphexec", "sleeptime")
"""Facts namespace (plus the node name) where :func:`sleeptime` keeps its run counters."""


def sleeptime(
    consolidate: Consolidator,
    every: int = 5,
    *,
    session_key: str | None = "session_id",
) -> MemoryNode:
    """A node running ``consolidate(memory, state)`` every ``every``-th time it runs.

    The runs are counted per session (``state[session_key]``; one global count when
    ``session_key`` is ``None``) in the facts store, namespace
    ``("graphexec", "sleeptime", <node name>)``, key the session id (or ``"*"``). The count is
    written with an op_key from ``ctx.idempotency_key``, and the consolidation runs inside
    ``ctx.effect``: a step re-run after a crash neither counts twice nor consolidates again
    once the consolidation finished. Use it, for example, to merge or prune facts.

    Args:
        consolidate: ``(memory, state) -> Any``, sync or async; its result is ignored.
        every: Run the consolidation on runs ``every``, ``2 * every``, ...
        session_key: State key holding the session id, or ``None``.

    Returns:
        An async node returning ``{}``.

    Raises:
        ValueError: ``every`` is below 1.
    """
    if every < 1:
        raise ValueError("sleeptime: every must be >= 1")

    async def node(state: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        mem = _memory(ctx)
        key = "*" if session_key is None else _session_id(state, session_key, ctx.node)
        ns = (*SLEEPTIME_NAMESPACE, ctx.node)
        current = await mem.facts.get(ns, key)
        runs = (current.value if current is not None else 0) + 1
        fact = await mem.facts.put(
            ns, key, runs, source=ctx.node, op_key=f"{ctx.idempotency_key}:sleeptime"
        )
        if int(fact.value) % every == 0:

            async def run() -> None:
                await _maybe_await(consolidate(mem, state))

            await ctx.effect("sleeptime", run)
        return {}

    return _named(node, "sleeptime")
