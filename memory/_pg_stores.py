"""PostgreSQL long-term facts and core-memory blocks, as in :mod:`memory._sqlite_stores`."""

from __future__ import annotations

import builtins
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self

from checkpointers._pg_db import PostgresDatabase
from graphexec.errors import MemoryStoreError
from memory._base import BlockStore, Fact, FactStore, FactVersion, Namespace
from memory._blocks import Block, check_label, check_labels, conflict, edit_replace, render_selected
from memory._pg_common import (
    OP_GET,
    OP_PUT,
    Conn,
    PgHandle,
    Row,
    lock,
    no_nul,
    open_database,
    pg_namespace,
    pg_text,
    ranked_search,
    tsv_terms,
)
from memory._sqlite_common import (
    MAX_INT,
    check_count,
    check_json,
    check_text,
    decode_namespace,
    dumps,
    encode_namespace,
    from_micros,
    now_micros,
)
from memory._sqlite_stores import render_fact_lines

__all__ = ["PostgresBlockStore", "PostgresFactStore"]

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
    " (namespace, key, value, source, updated_at, version, last_write, tsv)"
    " VALUES (:namespace, :key, :value, :source, :at, :version, :last_write,"
    " to_tsvector('simple'::regconfig, :terms))"
    " ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,"
    " source = excluded.source, updated_at = excluded.updated_at,"
    " version = excluded.version, last_write = excluded.last_write, tsv = excluded.tsv"
)
_DELETE_FACT = (
    "DELETE FROM graphexec_mem_facts WHERE namespace = :namespace AND key = :key RETURNING id"
)
_HISTORY = (
    "SELECT value, source, at, version, deleted FROM graphexec_mem_fact_history"
    " WHERE namespace = :namespace AND key = :key ORDER BY version"
)
_SEARCH_FACTS = (
    f"SELECT id, {_FACT}, ts_rank(tsv, to_tsquery('simple'::regconfig, :q))"
    " FROM graphexec_mem_facts"
    " WHERE namespace = :namespace AND tsv @@ to_tsquery('simple'::regconfig, :q)"
    " ORDER BY 8 DESC, last_write DESC LIMIT :limit"
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


class PostgresFactStore(PgHandle, FactStore):
    """Long-term key-value facts in PostgreSQL: exact-match namespaces, history, full-text search.

    - A namespace is one canonical JSON array compared with ``=`` (never ``LIKE``), so
      ``("a", "b")``, ``("a|b",)`` and ``("a",)`` never meet.
    - Last write wins; every put and delete is kept in the history with its time and source.
    - :meth:`search` ranks with ``ts_rank`` over the key and the value's text.

    Made by :class:`~memory.PostgresMemory` (``mem.facts``), or standalone.

    Args:
        dsn: A libpq connection string or URI.
        schema: The schema holding the memory tables (created if missing).
    """

    def __init__(self, dsn: str, *, schema: str | None = None) -> None:
        self._init_handle(open_database(dsn, owner="PostgresFactStore", schema=schema), owns=True)

    @classmethod
    def _attach(cls, db: PostgresDatabase) -> Self:
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
            value: Any JSON-compatible value.
            source: Where the value came from; kept in the history.
            op_key: Idempotency key, scoped to ``(namespace, key)``: a repeated put with it
                writes nothing and returns the first put's fact.

        Raises:
            MemoryStoreError: Bad namespace, key, value, source or op_key; nothing is written.
        """
        ns = encode_namespace(pg_namespace(namespace))
        pg_text(key, "fact key")
        check_json(value, f"fact {key!r} value")
        if source is not None:
            pg_text(source, "fact source", empty=True)
        op = None if op_key is None else pg_text(op_key, "op_key")
        text = dumps(value)
        terms = tsv_terms(f"{key} {value if isinstance(value, str) else text}")
        ids = {"namespace": ns, "key": key}
        scope = dumps([json.loads(ns), key])
        op_params = {"tier": _FACT_TIER, "scope": scope, "op_key": op}

        async def body(s: Conn) -> dict[str, Any]:
            await lock(s, _FACT_TIER, scope)
            if op is not None:
                done = await s.fetch(OP_GET, op_params)
                if done:
                    first: dict[str, Any] = json.loads(done[0][0])
                    return first
            [(last,)] = await s.fetch(_LAST_VERSION, ids)
            version = int(last) + 1
            now = now_micros()
            row = {**ids, "value": text, "source": source, "at": now, "version": version}
            [(history_id,)] = await s.fetch(_RECORD, {**row, "deleted": False})
            await s.fetch(_UPSERT_FACT, {**row, "last_write": history_id, "terms": terms})
            result = {"version": version, "at": now, "value": text, "source": source}
            if op is not None:
                await s.fetch(OP_PUT, {**op_params, "result": dumps(result), "at": now})
            return result

        result = await self._db.transaction(f"fact put of {key!r} in {ns}", body)
        return Fact(
            namespace=pg_namespace(namespace),
            key=key,
            value=json.loads(result["value"]),
            source=result["source"],
            updated_at=from_micros(int(result["at"])),
            version=int(result["version"]),
        )

    async def get(self, namespace: Namespace, key: str) -> Fact | None:
        """The fact, or ``None``."""
        ns = encode_namespace(pg_namespace(namespace))
        pg_text(key, "fact key")
        rows = await self._db.fetch("fact get", _GET_FACT, {"namespace": ns, "key": key})
        return _fact(rows[0]) if rows else None

    async def delete(self, namespace: Namespace, key: str, *, source: str | None = None) -> bool:
        """Delete a fact; its history records the deletion (with ``source``).

        Returns:
            Whether the fact existed (a missing fact records nothing).
        """
        ns = encode_namespace(pg_namespace(namespace))
        pg_text(key, "fact key")
        if source is not None:
            pg_text(source, "fact source", empty=True)
        ids = {"namespace": ns, "key": key}
        scope = dumps([json.loads(ns), key])

        async def body(s: Conn) -> bool:
            await lock(s, _FACT_TIER, scope)
            if not await s.fetch(_DELETE_FACT, ids):
                return False
            [(last,)] = await s.fetch(_LAST_VERSION, ids)
            await s.fetch(
                _RECORD,
                {
                    **ids,
                    "version": int(last) + 1,
                    "value": None,
                    "source": source,
                    "at": now_micros(),
                    "deleted": True,
                },
            )
            return True

        return await self._db.transaction(f"fact delete of {key!r} in {ns}", body)

    async def list(self, namespace: Namespace) -> list[Fact]:
        """Every fact of exactly this namespace, most recently written first."""
        ns = encode_namespace(pg_namespace(namespace))
        rows = await self._db.fetch("fact list", _LIST_FACTS, {"namespace": ns})
        return [_fact(row) for row in rows]

    async def search(
        self, namespace: Namespace, query: str, *, limit: int = 10
    ) -> builtins.list[Fact]:
        """Facts of exactly this namespace whose key or value matches ``query``, best first.

        Facts holding every query term come first, then those holding some. A query without
        content words matches nothing; nothing in it is search syntax.
        """
        ns = encode_namespace(pg_namespace(namespace))
        check_text(query, "query", empty=True)  # tokenised: a NUL never reaches SQL
        n = check_count(limit, "limit") or 0

        async def read(params: Mapping[str, Any]) -> list[Row]:
            return await self._db.fetch("fact search", _SEARCH_FACTS, params)

        hits = await ranked_search(read, query, {"namespace": ns}, limit=n)
        return [_fact(row[1:-1]) for row, _ in hits]

    async def history(self, namespace: Namespace, key: str) -> builtins.list[FactVersion]:
        """Every value the fact had, oldest first, deletions included (empty if never set)."""
        ns = encode_namespace(pg_namespace(namespace))
        pg_text(key, "fact key")
        rows = await self._db.fetch("fact history", _HISTORY, {"namespace": ns, "key": key})
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

        See :func:`memory._sqlite_stores.render_fact_lines` for the layout.
        """
        budget = check_count(max_chars, "max_chars") or 0
        return render_fact_lines(await self.list(namespace), budget)


# -- blocks --------------------------------------------------------------------------------------

_BLOCK = "label, value, char_limit, description, read_only, version"
_GET_BLOCK = (
    f"SELECT {_BLOCK} FROM graphexec_mem_blocks"
    " WHERE namespace = :namespace AND label = :label AND NOT deleted"
)
_LOCK_BLOCK = _GET_BLOCK + " FOR UPDATE"
_BLOCK_STATE = (
    "SELECT version, deleted FROM graphexec_mem_blocks"
    " WHERE namespace = :namespace AND label = :label FOR UPDATE"
)
_LIST_BLOCKS = (
    f"SELECT {_BLOCK} FROM graphexec_mem_blocks"
    ' WHERE namespace = :namespace AND NOT deleted ORDER BY label COLLATE "C"'
)
_CREATE_BLOCK = (
    "INSERT INTO graphexec_mem_blocks (namespace, label, value, char_limit, description,"
    " read_only, version, deleted, created_at, updated_at)"
    " VALUES (:namespace, :label, :value, :char_limit, :description, :read_only, :version,"
    " false, :now, :now)"
    " ON CONFLICT (namespace, label) DO UPDATE SET value = excluded.value,"
    " char_limit = excluded.char_limit, description = excluded.description,"
    " read_only = excluded.read_only, version = excluded.version, deleted = false,"
    " created_at = excluded.created_at, updated_at = excluded.updated_at"
)
_SET_BLOCK = (
    "UPDATE graphexec_mem_blocks SET value = :value, version = :version, updated_at = :now"
    " WHERE namespace = :namespace AND label = :label"
)
_DELETE_BLOCK = (
    "UPDATE graphexec_mem_blocks SET deleted = true, version = version + 1, updated_at = :now"
    " WHERE namespace = :namespace AND label = :label AND NOT deleted RETURNING version"
)
_BLOCK_TIER = "block"


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


class PostgresBlockStore(PgHandle, BlockStore):
    """Core-memory blocks in PostgreSQL: one row per ``(namespace, label)``, version-checked.

    Every edit is a read-modify-write in one transaction that locks the block's row
    (``SELECT ... FOR UPDATE``): concurrent appends from any number of processes all land, and
    an ``expected_version`` that no longer matches raises
    :class:`~graphexec.errors.MemoryConflictError` instead of overwriting the other writer.

    Made by :class:`~memory.PostgresMemory` (``mem.blocks``, ``mem.blocks_for(namespace)``),
    or standalone.

    Args:
        dsn: A libpq connection string or URI.
        namespace: Scope of the labels (``()`` by default), matched exactly.
        schema: The schema holding the memory tables (created if missing).
    """

    namespace: Namespace
    """The scope of this store's labels."""

    def __init__(self, dsn: str, *, namespace: Namespace = (), schema: str | None = None) -> None:
        self.namespace = pg_namespace(namespace)
        self._ns = encode_namespace(self.namespace)
        self._init_handle(
            open_database(
                dsn, owner=f"PostgresBlockStore(namespace={self.namespace!r})", schema=schema
            ),
            owns=True,
        )

    @classmethod
    def _attach(cls, db: PostgresDatabase, namespace: Namespace) -> Self:
        store = cls.__new__(cls)
        store.namespace = pg_namespace(namespace)
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
        name = self._name(block.label)
        pg_text(block.value, f"{name} value", empty=True)
        pg_text(block.description, f"{name} description", empty=True)
        if block.limit > MAX_INT:
            raise MemoryStoreError(f"{name}: limit {block.limit} is too large")
        block.check()
        params = {
            "namespace": self._ns,
            "label": block.label,
            "value": block.value,
            "char_limit": block.limit,
            "description": block.description,
            "read_only": bool(block.read_only),
        }

        async def body(s: Conn) -> int:
            await lock(s, _BLOCK_TIER, self._ns, block.label)
            rows = await s.fetch(_BLOCK_STATE, params)
            version = 1
            if rows:
                old_version, deleted = rows[0]
                if not deleted:
                    raise MemoryStoreError(
                        f"{name} already exists (version {old_version}); use update() to "
                        "change it or delete() it first"
                    )
                version = int(old_version) + 1
            await s.fetch(_CREATE_BLOCK, {**params, "version": version, "now": now_micros()})
            return version

        version = await self._db.transaction(f"create of {name}", body)
        return dataclasses.replace(block, version=version)

    async def get(self, label: str) -> Block | None:
        """The block, or ``None``.

        Raises:
            MemoryStoreError: ``label`` is not a valid block label.
        """
        check_label(label)
        rows = await self._db.fetch(
            "block get", _GET_BLOCK, {"namespace": self._ns, "label": label}
        )
        return _block(rows[0]) if rows else None

    async def list(self) -> list[Block]:
        """Every block of this namespace, by label."""
        rows = await self._db.fetch("block list", _LIST_BLOCKS, {"namespace": self._ns})
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
        """Lock, read, check, change and write one block in one transaction."""
        check_label(label)
        if expected_version is not None:
            check_count(expected_version, "expected_version")
        name = self._name(label)
        ids = {"namespace": self._ns, "label": label}

        async def body(s: Conn) -> Block:
            rows = await s.fetch(_LOCK_BLOCK, ids)
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
            no_nul(new.value, f"{name} value")
            await s.fetch(
                _SET_BLOCK, {**ids, "value": new.value, "version": new.version, "now": now_micros()}
            )
            return new

        return await self._db.transaction(f"{op} of {name}", body)

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
            MemoryConflictError: The block's version is not ``expected_version``.
            MemoryStoreError: The block is missing, read-only or would exceed its limit
                (without ``force``).
        """
        pg_text(value, f"{self._name(label)} value", empty=True)
        return await self._edit(
            "update",
            label,
            lambda _: value,
            agent=not force,
            expected_version=expected_version,
        )

    async def append(self, label: str, text: str, *, expected_version: int | None = None) -> Block:
        """Agent tool: append ``text`` on a new line (no newline before it in an empty block).

        Raises:
            MemoryConflictError: The block's version is not ``expected_version``.
            MemoryStoreError: ``text`` is empty, the block is missing or read-only, or the
                result is over the limit.
        """
        pg_text(text, f"text to append to {self._name(label)}")

        def edit(block: Block) -> str:
            return f"{block.value}\n{text}" if block.value else text

        return await self._edit(
            "append", label, edit, agent=True, expected_version=expected_version
        )

    async def replace(
        self, label: str, old: str, new: str, *, expected_version: int | None = None
    ) -> Block:
        """Agent tool: replace ``old``, which must occur exactly once, with ``new``.

        Raises:
            MemoryConflictError: The block's version is not ``expected_version``.
            MemoryStoreError: ``old`` occurs 0 or several times, the block is missing or
                read-only, or the result is over the limit.
        """
        name = self._name(label)
        pg_text(old, f"text to replace in {name}")
        pg_text(new, f"replacement text for {name}", empty=True)
        return await self._edit(
            "replace",
            label,
            lambda block: edit_replace(name, block.value, old, new),
            agent=True,
            expected_version=expected_version,
        )

    async def delete(self, label: str) -> bool:
        """Delete a block. Whether it existed."""
        check_label(label)
        params = {"namespace": self._ns, "label": label, "now": now_micros()}

        async def body(s: Conn) -> bool:
            return bool(await s.fetch(_DELETE_BLOCK, params))

        return await self._db.transaction(f"delete of {self._name(label)}", body)

    async def render(self, labels: Sequence[str] | None = None) -> str:
        """The ``<memory_blocks>`` XML (:func:`memory._blocks.render_blocks`) for these blocks.

        Args:
            labels: Which blocks, in this order (repeats are rendered once); all blocks by
                label when ``None``.

        Raises:
            MemoryStoreError: A label is invalid or names no block.
        """
        wanted = check_labels(labels)
        return render_selected(await self.list(), wanted, self.namespace)
