"""SQLite long-term facts and core-memory blocks."""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from checkpointers._sqlite_db import SqliteDatabase, fetch
from graphexec.errors import MemoryStoreError
from memory._base import BlockStore, Fact, FactStore, FactVersion, Namespace
from memory._blocks import Block, conflict, occurrences, render_blocks
from memory._blocks import check_label as _check_label
from memory._blocks import occurrences as _occurrences  # noqa: F401 - kept for old imports
from memory._sqlite_common import (
    MAX_INT,
    OP_GET,
    OP_PUT,
    Row,
    SqliteHandle,
    Synchronous,
    check_count,
    check_json,
    check_namespace,
    check_text,
    decode_namespace,
    dumps,
    encode_namespace,
    from_micros,
    fts_terms,
    now_micros,
    open_database,
    ranked_search,
)

__all__ = ["SqliteBlockStore", "SqliteFactStore", "render_fact_lines"]

# -- facts ---------------------------------------------------------------------------------------

_FACT = "namespace, key, value, source, updated_at, version"
_GET_FACT = f"SELECT {_FACT} FROM graphexec_mem_facts WHERE namespace = :namespace AND key = :key"
_LIST_FACTS = (
    f"SELECT {_FACT} FROM graphexec_mem_facts WHERE namespace = :namespace ORDER BY last_write DESC"
)
_LAST_VERSION = (
    "SELECT coalesce(max(version), 0) FROM graphexec_mem_fact_history"
    " WHERE namespace = :namespace AND key = :key"
)
_RECORD = (
    "INSERT INTO graphexec_mem_fact_history (namespace, key, version, value, source, at, deleted)"
    " VALUES (:namespace, :key, :version, :value, :source, :at, :deleted) RETURNING id"
)
_UPSERT_FACT = (
    "INSERT INTO graphexec_mem_facts"
    " (namespace, key, value, source, updated_at, version, last_write)"
    " VALUES (:namespace, :key, :value, :source, :at, :version, :last_write)"
    " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
    " source = excluded.source, updated_at = excluded.updated_at,"
    " version = excluded.version, last_write = excluded.last_write"
    " RETURNING id"
)
_DELETE_FACT = (
    "DELETE FROM graphexec_mem_facts WHERE namespace = :namespace AND key = :key RETURNING id"
)
_DELETE_FACT_TERMS = "DELETE FROM graphexec_mem_facts_fts WHERE rowid = :id"
_INSERT_FACT_TERMS = "INSERT INTO graphexec_mem_facts_fts (rowid, terms) VALUES (:id, :terms)"
_HISTORY = (
    "SELECT value, source, at, version, deleted FROM graphexec_mem_fact_history"
    " WHERE namespace = :namespace AND key = :key ORDER BY version"
)
_SEARCH_FACTS = (
    "SELECT f.id, f.namespace, f.key, f.value, f.source, f.updated_at, f.version,"
    " bm25(graphexec_mem_facts_fts)"
    " FROM graphexec_mem_facts_fts JOIN graphexec_mem_facts AS f"
    " ON f.id = graphexec_mem_facts_fts.rowid"
    " WHERE graphexec_mem_facts_fts MATCH :q AND f.namespace = :namespace"
    " ORDER BY bm25(graphexec_mem_facts_fts), f.last_write DESC LIMIT :limit"
)
_FACT_TIER = "fact"


def _fact(row: Row) -> Fact:
    namespace, key, value, source, updated_at, version = row
    return Fact(
        namespace=decode_namespace(namespace),
        key=str(key),
        value=json.loads(value),
        source=source,
        updated_at=from_micros(int(updated_at)),
        version=int(version),
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_fact_lines(facts: Sequence[Fact], max_chars: int) -> str:
    r"""``- key: value`` lines in the order given, as many as fit in ``max_chars``.

    Each fact is one line: whitespace runs (newlines included) in the key and the value are
    collapsed to one space, so no value can start a line of its own; non-string values are
    compact JSON. A line that does not fit in the room left is skipped whole (never cut), and
    the following, shorter lines still get their chance, so one oversized fact cannot push
    every other fact out of the prompt. Lines are joined with ``"\n"``; the result is never
    longer than ``max_chars`` (empty when nothing fits).
    """
    lines: list[str] = []
    used = 0
    for fact in facts:
        value = fact.value if isinstance(fact.value, str) else dumps(fact.value)
        value = _one_line(value)
        line = f"- {_one_line(fact.key)}: {value}" if value else f"- {_one_line(fact.key)}:"
        cost = len(line) + (1 if lines else 0)
        if used + cost <= max_chars:
            lines.append(line)
            used += cost
    return "\n".join(lines)


class SqliteFactStore(SqliteHandle, FactStore):
    """Long-term key-value facts in SQLite: exact-match namespaces, full history, FTS5 search.

    - A namespace is stored as one canonical JSON array and compared with ``=``, so
      ``("a", "b")``, ``("a|b",)``, ``("a", "b", "c")`` and ``("a",)`` never meet, whatever
      characters the parts contain.
    - Last write wins. Every put and delete is kept in the history with its time and source;
      versions keep increasing across a deletion.
    - :meth:`search` ranks with FTS5's BM25 over the key and the value's text; user text is
      tokenised and quoted, never parsed as FTS5 syntax.

    Made by :class:`~memory.SqliteMemory` (``mem.facts``), or standalone on a file.

    Args:
        path: The database file; ``None`` for a private in-memory database.
        synchronous: SQLite's ``synchronous`` pragma.
        busy_timeout: Seconds a write waits for another connection's lock before retrying.
        loop_writes: Small writes (a fact's put) run on the event loop's
            thread in ``synchronous="NORMAL"`` (see :class:`~checkpointers.SqliteCheckpointer`);
            ``False`` keeps every statement on the connection's thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
    ) -> None:
        db = open_database(
            path,
            owner=f"SqliteFactStore({None if path is None else os.fspath(path)!r})",
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
        )
        self._init_handle(db, owns=True)

    @classmethod
    def _attach(cls, db: SqliteDatabase) -> Self:
        store = cls.__new__(cls)
        store._init_handle(db, owns=False)
        return store

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.where!r})"

    async def put(
        self,
        namespace: Namespace,
        key: str,
        value: Any,
        *,
        source: str | None = None,
        op_key: str | None = None,
    ) -> Fact:
        """Set a fact (creating or replacing it) and return it.

        Args:
            namespace: Exact-match namespace, e.g. ``("user", "42")``.
            key: The fact's key (non-empty).
            value: Any JSON-compatible value (checked like session items).
            source: Where the value came from; kept in the history.
            op_key: Idempotency key, scoped to ``(namespace, key)``: a repeated put with it
                writes nothing and returns the first put's fact.

        Raises:
            MemoryStoreError: Bad namespace, key, value, source or op_key; nothing is written.
        """
        ns = encode_namespace(namespace)
        check_text(key, "fact key")
        check_json(value, f"fact {key!r} value")
        if source is not None:
            check_text(source, "fact source", empty=True)
        op = None if op_key is None else check_text(op_key, "op_key")
        text = dumps(value)
        terms = fts_terms(f"{key} {value if isinstance(value, str) else text}")
        ids = {"namespace": ns, "key": key}
        op_params = {"tier": _FACT_TIER, "scope": dumps([json.loads(ns), key]), "op_key": op}

        def body(db: sqlite3.Connection) -> dict[str, Any]:
            if op is not None:
                done = fetch(db, OP_GET, op_params)
                if done:
                    first: dict[str, Any] = json.loads(done[0][0])
                    return first
            [(last,)] = fetch(db, _LAST_VERSION, ids)
            version = int(last) + 1
            now = now_micros()
            row = {**ids, "value": text, "source": source, "at": now, "version": version}
            [(history_id,)] = fetch(db, _RECORD, {**row, "deleted": 0})
            [(fact_id,)] = fetch(db, _UPSERT_FACT, {**row, "last_write": history_id})
            db.execute(_DELETE_FACT_TERMS, {"id": fact_id})
            db.execute(_INSERT_FACT_TERMS, {"id": fact_id, "terms": terms})
            result = {"version": version, "at": now, "value": text, "source": source}
            if op is not None:
                fetch(db, OP_PUT, {**op_params, "result": dumps(result), "at": now})
            return result

        # A repeated op_key returns the first put's fact, whatever this call passed.
        result = await self._db.write("fact put", body, size=len(text) + len(terms))
        return Fact(
            namespace=check_namespace(namespace),
            key=key,
            value=json.loads(result["value"]),
            source=result["source"],
            updated_at=from_micros(int(result["at"])),
            version=int(result["version"]),
        )

    async def get(self, namespace: Namespace, key: str) -> Fact | None:
        """The fact, or ``None``."""
        ns = encode_namespace(namespace)
        check_text(key, "fact key")
        rows = await self._db.read("fact get", _GET_FACT, {"namespace": ns, "key": key})
        return _fact(rows[0]) if rows else None

    async def delete(self, namespace: Namespace, key: str, *, source: str | None = None) -> bool:
        """Delete a fact; its history records the deletion (with ``source``).

        Returns:
            Whether the fact existed (a missing fact records nothing).
        """
        ns = encode_namespace(namespace)
        check_text(key, "fact key")
        if source is not None:
            check_text(source, "fact source", empty=True)
        ids = {"namespace": ns, "key": key}

        def body(db: sqlite3.Connection) -> bool:
            rows = fetch(db, _DELETE_FACT, ids)
            if not rows:
                return False
            db.execute(_DELETE_FACT_TERMS, {"id": rows[0][0]})
            [(last,)] = fetch(db, _LAST_VERSION, ids)
            fetch(
                db,
                _RECORD,
                {
                    **ids,
                    "version": int(last) + 1,
                    "value": None,
                    "source": source,
                    "at": now_micros(),
                    "deleted": 1,
                },
            )
            return True

        return await self._db.write("fact delete", body)

    async def list(self, namespace: Namespace) -> list[Fact]:
        """Every fact of exactly this namespace, most recently written first."""
        ns = encode_namespace(namespace)
        rows = await self._db.read("fact list", _LIST_FACTS, {"namespace": ns})
        return [_fact(row) for row in rows]

    async def search(
        self, namespace: Namespace, query: str, *, limit: int = 10
    ) -> builtins.list[Fact]:
        """Facts of exactly this namespace whose key or value matches ``query``, best first.

        Facts holding every query term come first, then those holding some, each group by
        BM25. A query without content words (only stopwords or punctuation) matches nothing.
        """
        ns = encode_namespace(namespace)
        check_text(query, "query", empty=True)
        n = check_count(limit, "limit") or 0

        async def read(params: Mapping[str, Any]) -> list[Row]:
            return await self._db.read("fact search", _SEARCH_FACTS, params)

        hits = await ranked_search(read, query, {"namespace": ns}, limit=n)
        return [_fact(row[1:-1]) for row, _ in hits]

    async def history(self, namespace: Namespace, key: str) -> builtins.list[FactVersion]:
        """Every value the fact had, oldest first, deletions included (empty if never set)."""
        ns = encode_namespace(namespace)
        check_text(key, "fact key")
        rows = await self._db.read("fact history", _HISTORY, {"namespace": ns, "key": key})
        return [
            FactVersion(
                value=None if value is None else json.loads(value),
                source=source,
                at=from_micros(int(at)),
                version=int(version),
                deleted=bool(deleted),
            )
            for value, source, at, version, deleted in rows
        ]

    async def summary(self, namespace: Namespace, max_chars: int) -> str:
        """``- key: value`` lines, most recently written first, within ``max_chars``.

        See :func:`render_fact_lines` for the layout: one line per fact, and a line that does
        not fit is skipped, not cut.
        """
        budget = check_count(max_chars, "max_chars") or 0
        facts = await self.list(namespace)
        return render_fact_lines(facts, budget)


# -- blocks --------------------------------------------------------------------------------------

_BLOCK = "label, value, char_limit, description, read_only, version"
_GET_BLOCK = (
    f"SELECT {_BLOCK} FROM graphexec_mem_blocks"
    " WHERE namespace = :namespace AND label = :label AND deleted = 0"
)
_BLOCK_STATE = (
    "SELECT version, deleted FROM graphexec_mem_blocks"
    " WHERE namespace = :namespace AND label = :label"
)
_LIST_BLOCKS = (
    f"SELECT {_BLOCK} FROM graphexec_mem_blocks"
    " WHERE namespace = :namespace AND deleted = 0 ORDER BY label"
)
_CREATE_BLOCK = (
    "INSERT INTO graphexec_mem_blocks (namespace, label, value, char_limit, description,"
    " read_only, version, deleted, created_at, updated_at)"
    " VALUES (:namespace, :label, :value, :char_limit, :description, :read_only, :version, 0,"
    " :now, :now)"
    " ON CONFLICT (namespace, label) DO UPDATE SET value = excluded.value,"
    " char_limit = excluded.char_limit, description = excluded.description,"
    " read_only = excluded.read_only, version = excluded.version, deleted = 0,"
    " created_at = excluded.created_at, updated_at = excluded.updated_at"
)
_SET_BLOCK = (
    "UPDATE graphexec_mem_blocks SET value = :value, version = :version, updated_at = :now"
    " WHERE namespace = :namespace AND label = :label"
)
_DELETE_BLOCK = (
    "UPDATE graphexec_mem_blocks SET deleted = 1, version = version + 1, updated_at = :now"
    " WHERE namespace = :namespace AND label = :label AND deleted = 0 RETURNING version"
)


def _block(row: Row) -> Block:
    label, value, limit, description, read_only, version = row
    return Block(
        label=label,
        value=value,
        limit=int(limit),
        description=description,
        read_only=bool(read_only),
        version=int(version),
    )


class SqliteBlockStore(SqliteHandle, BlockStore):
    """Core-memory blocks in SQLite: one record per ``(namespace, label)``, version-checked.

    Every object on the same file and namespace sees the same blocks, so a block attached to
    several graphs (or processes) is one record and an update is seen by all. Each edit is a
    read-modify-write done inside one ``BEGIN IMMEDIATE`` transaction: two concurrent appends
    both land, and an ``expected_version`` that no longer matches fails loudly instead of
    overwriting the other writer's change.

    Made by :class:`~memory.SqliteMemory` (``mem.blocks``, ``mem.blocks_for(namespace)``), or
    standalone on a file.

    Args:
        path: The database file; ``None`` for a private in-memory database.
        namespace: Scope of the labels (``()`` by default): stores with different namespaces
            never see each other's blocks.
        synchronous: SQLite's ``synchronous`` pragma.
        busy_timeout: Seconds a write waits for another connection's lock before retrying.
        loop_writes: Small writes (a new block) run on the event loop's
            thread in ``synchronous="NORMAL"`` (see :class:`~checkpointers.SqliteCheckpointer`);
            ``False`` keeps every statement on the connection's thread.
    """

    namespace: Namespace
    """The scope of this store's labels."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        namespace: Namespace = (),
        synchronous: Synchronous = "NORMAL",
        busy_timeout: float = 5.0,
        loop_writes: bool = True,
    ) -> None:
        self.namespace = check_namespace(namespace)
        self._ns = encode_namespace(self.namespace)
        db = open_database(
            path,
            owner=(
                f"SqliteBlockStore({None if path is None else os.fspath(path)!r}, "
                f"namespace={self.namespace!r})"
            ),
            synchronous=synchronous,
            busy_timeout=busy_timeout,
            loop_writes=loop_writes,
        )
        self._init_handle(db, owns=True)

    @classmethod
    def _attach(cls, db: SqliteDatabase, namespace: Namespace) -> Self:
        store = cls.__new__(cls)
        store.namespace = check_namespace(namespace)
        store._ns = encode_namespace(store.namespace)
        store._init_handle(db, owns=False)
        return store

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._db.where!r}, namespace={self.namespace!r})"

    def _name(self, label: str) -> str:
        return f"block {label!r}" + (f" in namespace {self.namespace!r}" if self.namespace else "")

    async def create(self, block: Block) -> Block:
        """Store a new block at version 1 and return it.

        The block's own ``version`` is ignored. A label deleted earlier may be created again;
        its version then continues from the deleted block's.

        Raises:
            MemoryStoreError: The label exists, or the value is over the block's limit.
        """
        if not isinstance(block, Block):
            raise MemoryStoreError(f"create() takes a Block, got {type(block).__name__}")
        check_text(block.value, f"{self._name(block.label)} value", empty=True)
        check_text(block.description, f"{self._name(block.label)} description", empty=True)
        if block.limit > MAX_INT:
            raise MemoryStoreError(f"{self._name(block.label)}: limit {block.limit} is too large")
        block.check()
        name = self._name(block.label)
        params = {
            "namespace": self._ns,
            "label": block.label,
            "value": block.value,
            "char_limit": block.limit,
            "description": block.description,
            "read_only": int(block.read_only),
        }

        def body(db: sqlite3.Connection) -> int:
            rows = fetch(db, _BLOCK_STATE, params)
            version = 1
            if rows:
                old_version, deleted = rows[0]
                if not deleted:
                    raise MemoryStoreError(
                        f"{name} already exists (version {old_version}); use update() to "
                        "change it or delete() it first"
                    )
                version = int(old_version) + 1
            db.execute(_CREATE_BLOCK, {**params, "version": version, "now": now_micros()})
            return version

        size = len(block.value) + len(block.description)
        version = await self._db.write("block create", body, size=size)
        return dataclasses.replace(block, version=version)

    async def get(self, label: str) -> Block | None:
        """The block, or ``None``.

        Raises:
            MemoryStoreError: ``label`` is not a valid block label.
        """
        _check_label(label)
        rows = await self._db.read("block get", _GET_BLOCK, {"namespace": self._ns, "label": label})
        return _block(rows[0]) if rows else None

    async def list(self) -> list[Block]:
        """Every block of this namespace, by label."""
        rows = await self._db.read("block list", _LIST_BLOCKS, {"namespace": self._ns})
        return [_block(row) for row in rows]

    async def _edit(
        self,
        op: str,
        label: str,
        edit: Callable[[Block], str],
        *,
        agent: bool,
        expected_version: int | None,
    ) -> Block:
        """Read, check, change and write one block in one transaction."""
        _check_label(label)
        if expected_version is not None:
            check_count(expected_version, "expected_version")
        name = self._name(label)
        ids = {"namespace": self._ns, "label": label}

        def body(db: sqlite3.Connection) -> Block:
            rows = fetch(db, _GET_BLOCK, ids)
            if not rows:
                raise MemoryStoreError(f"{name} does not exist; create() it first")
            block = _block(rows[0])
            if expected_version is not None and block.version != expected_version:
                raise conflict(name, expected_version, block.version)
            if agent and block.read_only:
                raise MemoryStoreError(
                    f"{name} is read-only: agent tools cannot change it (the developer API "
                    "update(..., force=True) can)"
                )
            new = dataclasses.replace(block, value=edit(block), version=block.version + 1)
            if agent:
                new.check()
            db.execute(
                _SET_BLOCK, {**ids, "value": new.value, "version": new.version, "now": now_micros()}
            )
            return new

        return await self._db.write(op, body)

    async def update(
        self, label: str, value: str, *, force: bool = False, expected_version: int | None = None
    ) -> Block:
        """Replace a block's value (developer API).

        Args:
            label: The block.
            value: The new value.
            force: Bypass ``read_only`` and the limit.
            expected_version: Fail unless the block is still at this version.

        Raises:
            MemoryStoreError: The block is missing, read-only or would exceed its limit
                (without ``force``), or its version is not ``expected_version``.
        """
        check_text(value, f"{self._name(label)} value", empty=True)
        return await self._edit(
            "block update",
            label,
            lambda _: value,
            agent=not force,
            expected_version=expected_version,
        )

    async def append(self, label: str, text: str, *, expected_version: int | None = None) -> Block:
        """Agent tool: append ``text`` on a new line (no newline before it in an empty block).

        Raises:
            MemoryStoreError: ``text`` is empty, the block is missing or read-only, the result
                is over the limit, or its version is not ``expected_version``.
        """
        check_text(text, f"text to append to {self._name(label)}")

        def edit(block: Block) -> str:
            return f"{block.value}\n{text}" if block.value else text

        return await self._edit(
            "block append", label, edit, agent=True, expected_version=expected_version
        )

    async def replace(
        self, label: str, old: str, new: str, *, expected_version: int | None = None
    ) -> Block:
        """Agent tool: replace ``old``, which must occur exactly once, with ``new``.

        Raises:
            MemoryStoreError: ``old`` occurs 0 or several times (overlaps count), the block is
                missing or read-only, the result is over the limit, or its version is not
                ``expected_version``.
        """
        name = self._name(label)
        check_text(old, f"text to replace in {name}")
        check_text(new, f"replacement text for {name}", empty=True)

        def edit(block: Block) -> str:
            count = occurrences(block.value, old)
            if count == 0:
                raise MemoryStoreError(
                    f"{name} does not contain the text to replace ({old!r}); copy it exactly "
                    "from the block's current value"
                )
            if count > 1:
                raise MemoryStoreError(
                    f"{name} contains the text to replace ({old!r}) {count} times; it must "
                    "occur exactly once: include more of the surrounding text"
                )
            return block.value.replace(old, new, 1)

        return await self._edit(
            "block replace", label, edit, agent=True, expected_version=expected_version
        )

    async def delete(self, label: str) -> bool:
        """Delete a block. Whether it existed."""
        _check_label(label)
        params = {"namespace": self._ns, "label": label}

        def body(db: sqlite3.Connection) -> bool:
            return bool(fetch(db, _DELETE_BLOCK, {**params, "now": now_micros()}))

        return await self._db.write("block delete", body)

    async def render(self, labels: Sequence[str] | None = None) -> str:
        """The ``<memory_blocks>`` XML (:func:`memory._blocks.render_blocks`) for these blocks.

        Args:
            labels: Which blocks, in this order (repeats are rendered once); all blocks by
                label when ``None``.

        Raises:
            MemoryStoreError: A label is invalid or names no block.
        """
        wanted: list[str] | None = None
        if labels is not None:
            if isinstance(labels, str):
                raise MemoryStoreError(f"labels must be a list of labels, got the str {labels!r}")
            wanted = list(dict.fromkeys(_check_label(label) for label in labels))
        blocks = await self.list()
        if wanted is None:
            return render_blocks(blocks)
        by_label = {block.label: block for block in blocks}
        missing = [label for label in wanted if label not in by_label]
        if missing:
            raise MemoryStoreError(
                f"no block labelled {', '.join(map(repr, missing))}"
                + (f" in namespace {self.namespace!r}" if self.namespace else "")
                + f"; existing labels: {sorted(by_label) or 'none'}"
            )
        return render_blocks(by_label[label] for label in wanted)
