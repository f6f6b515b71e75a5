"""SQL and write bodies of the PostgreSQL archival store (:mod:`memory._pg_archival`).

Only these constant fragments are ever put together; every caller value is a bound parameter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from memory._archival_common import MAX_QUERY_TERMS, PassageRow, check_embedder, now_us, state_of
from memory._base import Namespace
from memory._pg_common import Conn
from memory._text import STOPWORDS, stem

__all__ = [
    "BUMP",
    "BY_ID",
    "BY_SEQS",
    "INSERT_TAGS",
    "KEYWORD",
    "LIST",
    "LIST_AFTER_CURSOR",
    "LIST_TAGS",
    "LOCK_STATE",
    "STATE",
    "TAGS_ALL",
    "TAGS_ANY",
    "VECTORS",
    "Filters",
    "insert_rows",
    "keyword_terms",
]

_WORD = re.compile(r"[^\W_]+")

STATE = (
    "SELECT nsid, embedder, dim, passages, version, epoch FROM graphexec_mem_archival_ns"
    " WHERE ns = :ns"
)
LOCK_STATE = STATE + " FOR UPDATE"
_NEW_NS = "INSERT INTO graphexec_mem_archival_ns (ns) VALUES (:ns) ON CONFLICT (ns) DO NOTHING"
_PASSAGE_COLUMNS = """p.seq, p.id, p.text, p.metadata, p.created_at,
    (SELECT coalesce(json_agg(t.tag ORDER BY t.pos), '[]'::json)::text
     FROM graphexec_mem_passage_tags AS t WHERE t.passage = p.seq)"""
BY_SEQS = f"""SELECT {_PASSAGE_COLUMNS} FROM graphexec_mem_passages AS p
    WHERE p.nsid = :nsid AND p.seq = ANY(:seqs::bigint[])"""
BY_ID = f"""SELECT {_PASSAGE_COLUMNS} FROM graphexec_mem_passages AS p
    JOIN graphexec_mem_archival_ns AS n ON n.nsid = p.nsid WHERE n.ns = :ns AND p.id = :id"""
TAGS_ANY = """SELECT passage FROM graphexec_mem_passage_tags
    WHERE nsid = :nsid AND tag = ANY(:tags::text[])"""
TAGS_ALL = TAGS_ANY + " GROUP BY passage HAVING count(*) = :ntags"
KEYWORD = """WITH terms AS (
        SELECT q FROM (SELECT plainto_tsquery('english'::regconfig, w) AS q
                       FROM unnest(:terms::text[]) AS w) AS t
        WHERE numnode(q) > 0)
    SELECT p.seq FROM graphexec_mem_passages AS p
    WHERE p.nsid = :nsid AND p.tsv @@ websearch_to_tsquery('english'::regconfig, :anyq){filters}
    AND 2 * (SELECT count(*) FROM terms WHERE p.tsv @@ terms.q) >= (SELECT count(*) FROM terms)
    ORDER BY ts_rank(p.tsv, websearch_to_tsquery('english'::regconfig, :anyq), 1) DESC, p.seq
    LIMIT :depth"""
VECTORS = """SELECT p.seq, p.created_at, p.vector FROM graphexec_mem_passages AS p
    WHERE p.nsid = :nsid AND p.embedder = :embedder AND p.dim = :dim AND p.seq > :start{filters}
    ORDER BY p.seq LIMIT :chunk"""
LIST = f"""SELECT {_PASSAGE_COLUMNS} FROM graphexec_mem_passages AS p
    JOIN graphexec_mem_archival_ns AS n ON n.nsid = p.nsid WHERE n.ns = :ns{{filters}}
    ORDER BY p.created_at DESC, p.seq DESC LIMIT :limit"""
LIST_TAGS = """ AND EXISTS (SELECT 1 FROM graphexec_mem_passage_tags AS t
    WHERE t.passage = p.seq AND t.tag = ANY(:tags::text[]))"""
LIST_AFTER_CURSOR = " AND (p.created_at, p.seq) < (:at, :seq)"
_INSERT = """INSERT INTO graphexec_mem_passages
    (id, nsid, text, metadata, created_at, embedder, dim, vector)
    SELECT u.id, :nsid, u.text, u.metadata, u.created_at, :embedder, :dim, u.vector
    FROM unnest(:ids::text[], :texts::text[], :metas::text[], :times::bigint[],
                :vectors::bytea[]) WITH ORDINALITY AS u(id, text, metadata, created_at, vector, n)
    ORDER BY u.n RETURNING seq, id"""
INSERT_TAGS = """INSERT INTO graphexec_mem_passage_tags (nsid, tag, passage, pos)
    SELECT :nsid, u.tag, u.passage, u.pos
    FROM unnest(:tags::text[], :passages::bigint[], :positions::integer[])
        AS u(tag, passage, pos)"""
_KNOWN_OPS = """SELECT op_key, passage_id FROM graphexec_mem_archival_ops
    WHERE nsid = :nsid AND op_key = ANY(:keys::text[])"""
_INSERT_OPS = """INSERT INTO graphexec_mem_archival_ops (nsid, op_key, passage_id)
    SELECT :nsid, u.k, u.id FROM unnest(:keys::text[], :ids::text[]) AS u(k, id)"""
BUMP = """UPDATE graphexec_mem_archival_ns SET passages = passages + :added,
    version = version + 1, epoch = epoch + :vectors_changed,
    embedder = coalesce(:embedder, embedder), dim = coalesce(:dim, dim) WHERE nsid = :nsid"""


def keyword_terms(query: str) -> list[str]:
    """The words keyword search looks for: distinct content words, letters and digits only.

    Words sharing a stem count once; stopwords are dropped. Being plain words, they can be
    joined with ``or`` for ``websearch_to_tsquery`` without any of them acting as an operator.

    Args:
        query: Any text.

    Returns:
        Up to :data:`~memory._archival_common.MAX_QUERY_TERMS` words.
    """
    terms: dict[str, str] = {}
    for word in _WORD.findall(query.casefold()):
        if word not in STOPWORDS:
            terms.setdefault(stem(word), word)
    return list(terms.values())[:MAX_QUERY_TERMS]


class Filters:
    """A search's tag and date filters, as SQL fragments (constants) and their parameters."""

    def __init__(
        self,
        tags: tuple[str, ...] | None,
        tag_mode: Literal["any", "all"],
        after: int | None,
        before: int | None,
    ) -> None:
        self.tags, self.tag_mode, self.after, self.before = tags, tag_mode, after, before

    def sql(self) -> str:
        out = ""
        if self.tags:
            out += f" AND p.seq IN ({TAGS_ALL if self.tag_mode == 'all' else TAGS_ANY})"
        if self.after is not None:
            out += " AND p.created_at > :after"
        if self.before is not None:
            out += " AND p.created_at < :before"
        return out

    def params(self, nsid: int) -> dict[str, Any]:
        params: dict[str, Any] = {"nsid": nsid}
        if self.tags:
            params["tags"] = list(self.tags)
            params["ntags"] = len(self.tags)
        if self.after is not None:
            params["after"] = self.after
        if self.before is not None:
            params["before"] = self.before
        return params


async def insert_rows(
    s: Conn,
    *,
    ns: str,
    namespace: Namespace,
    embedder: str,
    dim: int,
    rows: Sequence[tuple[PassageRow, bytes]],
) -> list[str]:
    """Transaction body: lock the namespace, insert rows (skipping known op keys), bump it."""
    await s.fetch(_NEW_NS, {"ns": ns})
    state = state_of(await s.fetch(LOCK_STATE, {"ns": ns}))
    assert state is not None
    check_embedder(state, embedder, dim, namespace)
    nsid = state.nsid
    keys = [row.op_key for row, _ in rows if row.op_key is not None]
    known: dict[str, str] = {}
    if keys:
        known = {
            str(k): str(pid)
            for k, pid in await s.fetch(_KNOWN_OPS, {"nsid": nsid, "keys": list(set(keys))})
        }
    ids: list[str] = []
    fresh: list[tuple[PassageRow, bytes]] = []
    new_ops: dict[str, str] = {}
    for row, vector in rows:
        if row.op_key is not None:
            first = known.get(row.op_key) or new_ops.get(row.op_key)
            if first is not None:
                ids.append(first)
                continue
            new_ops[row.op_key] = row.id
        fresh.append((row, vector))
        ids.append(row.id)
    if not fresh:
        return ids
    inserted = await s.fetch(
        _INSERT,
        {
            "nsid": nsid,
            "embedder": embedder,
            "dim": dim,
            "ids": [r.id for r, _ in fresh],
            "texts": [r.text for r, _ in fresh],
            "metas": [r.metadata for r, _ in fresh],
            "times": [now_us() for _ in fresh],
            "vectors": [v for _, v in fresh],
        },
    )
    seq_of = {str(pid): int(seq) for seq, pid in inserted}
    tags = [(tag, seq_of[r.id], i) for r, _ in fresh for i, tag in enumerate(r.tags)]
    if tags:
        await s.fetch(
            INSERT_TAGS,
            {
                "nsid": nsid,
                "tags": [t for t, _, _ in tags],
                "passages": [p for _, p, _ in tags],
                "positions": [i for _, _, i in tags],
            },
        )
    if new_ops:
        await s.fetch(
            _INSERT_OPS, {"nsid": nsid, "keys": list(new_ops), "ids": list(new_ops.values())}
        )
    await s.fetch(
        BUMP,
        {"nsid": nsid, "added": len(fresh), "vectors_changed": 0, "embedder": embedder, "dim": dim},
    )
    return ids
