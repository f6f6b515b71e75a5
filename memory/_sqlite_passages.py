"""Schema, statements, filters, keyword terms and write bodies of the SQLite archival store.

The store itself is :mod:`memory._sqlite_archival`. Only these constant fragments are ever put
together; every caller value is a parameter.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from checkpointers._sqlite_db import fetch
from memory._archival_common import (
    MAX_QUERY_TERMS,
    PassageRow,
    check_embedder,
    now_us,
    state_of,
)
from memory._base import Namespace
from memory._text import STOPWORDS, stem, words

__all__ = [
    "MIGRATIONS",
    "VERSION_TABLE",
    "BUMP",
    "BY_ID",
    "BY_SEQS",
    "COMMON_TERM_FLOOR",
    "COMMON_TERM_SHARE",
    "COVERAGE",
    "INSERT_TAG",
    "KEYWORD",
    "KEYWORD_WHOLE_FILE",
    "LIST",
    "LIST_AFTER_CURSOR",
    "LIST_TAGS",
    "MAX_KEYWORD_TERMS",
    "MIN_COVERAGE",
    "SEARCH_STATE",
    "STATE",
    "TAGS_ALL",
    "TAGS_ALL_FTS",
    "TAGS_ANY",
    "TAGS_ANY_FTS",
    "TERM_COUNTS",
    "VECTORS",
    "Filters",
    "fts_terms",
    "insert_rows",
    "select_terms",
]

MIN_COVERAGE = 0.5
"""Fraction of the query's distinct terms a passage needs to be a keyword candidate."""
MAX_KEYWORD_TERMS = 8
"""Of the query's words (up to :data:`~memory._archival_common.MAX_QUERY_TERMS`), the most
selective ones (fewest passages) that the keyword query uses."""
COMMON_TERM_SHARE = 0.25
COMMON_TERM_FLOOR = 5000
"""A word found in more than ``max(COMMON_TERM_FLOOR, COMMON_TERM_SHARE * passages)`` passages
is dropped from keyword search, like a stopword: its BM25 weight there is below a sixth of a
rare word's, and scoring every passage that holds it would dominate the search's cost."""

# -- schema ----------------------------------------------------------------------------------

VERSION_TABLE = "graphexec_archival_schema"

MIGRATIONS: tuple[str, ...] = (
    # 0: the version table (SqliteDatabase creates it before reading it)
    f"""CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
        version INTEGER PRIMARY KEY,
        applied_at REAL NOT NULL
    )""",
    # 1: one row per namespace: its exact name (JSON array), embedder and change counters.
    # ``version`` is bumped by every write, ``epoch`` by every write that changes or removes
    # a vector; in-process vector caches compare both.
    """CREATE TABLE archival_namespaces (
        nsid INTEGER PRIMARY KEY,
        ns TEXT NOT NULL UNIQUE,
        embedder TEXT,
        dim INTEGER,
        passages INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 0,
        epoch INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE archival_passages (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        nsid INTEGER NOT NULL REFERENCES archival_namespaces (nsid),
        text TEXT NOT NULL,
        metadata TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        embedder TEXT NOT NULL,
        dim INTEGER NOT NULL,
        vector BLOB NOT NULL
    )""",
    "CREATE INDEX archival_passages_by_ns ON archival_passages (nsid)",
    "CREATE INDEX archival_passages_by_time ON archival_passages (nsid, created_at)",
    # Keyword search checks namespace and dates for every full-text match: this covering index
    # answers that from small entries instead of the rows, which carry the vectors (2x faster).
    "CREATE INDEX archival_passages_filter ON archival_passages (seq, nsid, created_at)",
    """CREATE TABLE archival_tags (
        nsid INTEGER NOT NULL,
        tag TEXT NOT NULL,
        passage INTEGER NOT NULL,
        pos INTEGER NOT NULL,
        PRIMARY KEY (nsid, tag, passage)
    ) WITHOUT ROWID""",
    "CREATE INDEX archival_tags_by_passage ON archival_tags (passage, pos)",
    """CREATE TABLE archival_op_keys (
        nsid INTEGER NOT NULL,
        op_key TEXT NOT NULL,
        passage_id TEXT NOT NULL,
        PRIMARY KEY (nsid, op_key)
    ) WITHOUT ROWID""",
    """CREATE VIRTUAL TABLE archival_fts USING fts5(
        text, content='archival_passages', content_rowid='seq', tokenize='porter unicode61'
    )""",
    """CREATE TRIGGER archival_fts_insert AFTER INSERT ON archival_passages BEGIN
        INSERT INTO archival_fts (rowid, text) VALUES (new.seq, new.text);
    END""",
    """CREATE TRIGGER archival_fts_delete AFTER DELETE ON archival_passages BEGIN
        INSERT INTO archival_fts (archival_fts, rowid, text) VALUES ('delete', old.seq, old.text);
    END""",
    """CREATE TRIGGER archival_fts_update AFTER UPDATE OF text ON archival_passages BEGIN
        INSERT INTO archival_fts (archival_fts, rowid, text) VALUES ('delete', old.seq, old.text);
        INSERT INTO archival_fts (rowid, text) VALUES (new.seq, new.text);
    END""",
)
"""The schema, index = version (the scheme of :class:`~checkpointers._sqlite_db.SqliteDatabase`)."""

# -- SQL -------------------------------------------------------------------------------------

STATE = (
    "SELECT nsid, embedder, dim, passages, version, epoch FROM archival_namespaces WHERE ns = :ns"
)
# The same, with the whole file's passage count and write counter (for the term-count cache).
SEARCH_STATE = """SELECT nsid, embedder, dim, passages, version, epoch,
    (SELECT sum(passages) FROM archival_namespaces), (SELECT sum(version) FROM archival_namespaces)
    FROM archival_namespaces WHERE ns = :ns"""
_PASSAGE_COLUMNS = """p.seq, p.id, p.text, p.metadata, p.created_at,
    (SELECT json_group_array(tag) FROM (
        SELECT t.tag FROM archival_tags AS t WHERE t.passage = p.seq ORDER BY t.pos))"""
BY_SEQS = f"""SELECT {_PASSAGE_COLUMNS} FROM archival_passages AS p
    WHERE p.nsid = :nsid AND p.seq IN (SELECT value FROM json_each(:seqs))"""
BY_ID = f"""SELECT {_PASSAGE_COLUMNS} FROM archival_passages AS p
    JOIN archival_namespaces AS n ON n.nsid = p.nsid WHERE n.ns = :ns AND p.id = :id"""
TAGS_ANY = """SELECT passage FROM archival_tags
    WHERE nsid = :nsid AND tag IN (SELECT value FROM json_each(:tags))"""
TAGS_ALL = TAGS_ANY + " GROUP BY passage HAVING count(*) = :ntags"
_AFTER = " AND p.created_at > :after"
_BEFORE = " AND p.created_at < :before"
# CROSS JOIN fixes the loop order (full-text matches outside): the planner may otherwise run
# the MATCH once per passage of the namespace, a hundred times slower.
KEYWORD = """SELECT archival_fts.rowid FROM archival_fts
    CROSS JOIN archival_passages AS p INDEXED BY archival_passages_filter
    ON p.seq = archival_fts.rowid
    WHERE archival_fts MATCH :match AND p.nsid = :nsid{filters}
    ORDER BY bm25(archival_fts), archival_fts.rowid LIMIT :depth"""
TERM_COUNTS = """SELECT j.value,
    (SELECT count(*) FROM archival_fts WHERE archival_fts MATCH j.value)
    FROM json_each(:terms) AS j"""
# When the namespace holds every passage of the file and no date filter applies, the join that
# checks namespace and dates is redundant: full-text matches are candidates as they are.
KEYWORD_WHOLE_FILE = """SELECT archival_fts.rowid FROM archival_fts
    WHERE archival_fts MATCH :match{filters}
    ORDER BY bm25(archival_fts), archival_fts.rowid LIMIT :depth"""
# The unary + keeps SQLite from driving the full-text lookup from the tag list (once per row).
TAGS_ANY_FTS = """ AND +archival_fts.rowid IN (SELECT passage FROM archival_tags
    WHERE nsid = :nsid AND tag IN (SELECT value FROM json_each(:tags)))"""
TAGS_ALL_FTS = """ AND +archival_fts.rowid IN (SELECT passage FROM archival_tags
    WHERE nsid = :nsid AND tag IN (SELECT value FROM json_each(:tags))
    GROUP BY passage HAVING count(*) = :ntags)"""
COVERAGE = """ AND +archival_fts.rowid IN (
    SELECT g.rowid FROM json_each(:terms) AS j
    JOIN archival_fts AS g ON g.archival_fts MATCH j.value
    GROUP BY g.rowid HAVING count(*) >= :need)"""
VECTORS = """SELECT p.seq, p.created_at, p.vector FROM archival_passages AS p
    WHERE p.nsid = :nsid AND p.embedder = :embedder AND p.dim = :dim AND p.seq > :start{filters}
    ORDER BY p.seq LIMIT :chunk"""

LIST = f"""SELECT {_PASSAGE_COLUMNS} FROM archival_passages AS p
    JOIN archival_namespaces AS n ON n.nsid = p.nsid WHERE n.ns = :ns{{filters}}
    ORDER BY p.created_at DESC, p.seq DESC LIMIT :limit"""
LIST_TAGS = """ AND p.seq IN (SELECT passage FROM archival_tags
    WHERE nsid = n.nsid AND tag IN (SELECT value FROM json_each(:tags)))"""
LIST_AFTER_CURSOR = " AND (p.created_at < :at OR (p.created_at = :at AND p.seq < :seq))"
_INSERT = """INSERT INTO archival_passages
    (id, nsid, text, metadata, created_at, embedder, dim, vector)
    VALUES (:id, :nsid, :text, :metadata, :created_at, :embedder, :dim, :vector) RETURNING seq"""
INSERT_TAG = "INSERT INTO archival_tags (nsid, tag, passage, pos) VALUES (?, ?, ?, ?)"
BUMP = """UPDATE archival_namespaces SET passages = passages + :added, version = version + 1,
    epoch = epoch + :vectors_changed, embedder = coalesce(:embedder, embedder),
    dim = coalesce(:dim, dim) WHERE nsid = :nsid"""


# -- search filters and keyword terms --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filters:
    """A search's tag and date filters, as SQL fragments (constants) and their parameters."""

    tags: tuple[str, ...] | None
    tag_mode: Literal["any", "all"]
    after: int | None
    before: int | None

    def sql(self) -> str:
        out = ""
        if self.tags:
            out += f" AND p.seq IN ({TAGS_ALL if self.tag_mode == 'all' else TAGS_ANY})"
        if self.after is not None:
            out += _AFTER
        if self.before is not None:
            out += _BEFORE
        return out

    def params(self, nsid: int) -> dict[str, Any]:
        params: dict[str, Any] = {"nsid": nsid}
        if self.tags:
            params["tags"] = json.dumps(self.tags)
            params["ntags"] = len(self.tags)
        if self.after is not None:
            params["after"] = self.after
        if self.before is not None:
            params["before"] = self.before
        return params


def _quote(token: str) -> str:
    return '"' + token.replace('"', '""') + '"'


def fts_terms(query: str) -> list[str]:
    """The FTS5 expressions, one per distinct content word of ``query``, for keyword search.

    Every word is quoted, so nothing a user types can become FTS5 syntax (operators, column
    filters, prefix stars). Stopwords are dropped. A hyphenated compound becomes one term that
    matches either spelling (``wi-fi``: ``"wi fi" OR "wifi"``). Words sharing a stem count once.

    Args:
        query: Any text.

    Returns:
        Up to :data:`~memory._archival_common.MAX_QUERY_TERMS` FTS5 expressions (empty when
        nothing is searchable).
    """
    terms: dict[str, str] = {}
    for chunk in query.split():
        found = words(chunk)
        if len(found) >= 3 and found[-1] == "".join(found[:-1]):
            joined = found[-1]
            if joined not in STOPWORDS:
                expr = f"({_quote(' '.join(found[:-1]))} OR {_quote(joined)})"
                terms.setdefault(stem(joined), expr)
            continue
        for word in found:
            if word not in STOPWORDS:
                terms.setdefault(stem(word), _quote(word))
    return list(terms.values())[:MAX_QUERY_TERMS]


def select_terms(terms: Sequence[str], counts: Sequence[int], total: int) -> list[str]:
    """Choose the keyword query's terms by how many passages hold each.

    Args:
        terms: FTS5 expressions from :func:`fts_terms`.
        counts: Passages (in the whole file) matching each term.
        total: Passages in the whole file.

    Returns:
        Up to :data:`MAX_KEYWORD_TERMS` terms, fewest matches first, without the common ones
        (see :data:`COMMON_TERM_FLOOR`).
    """
    limit = max(COMMON_TERM_FLOOR, COMMON_TERM_SHARE * total)
    kept = sorted(
        (count, i) for i, count in enumerate(counts) if count <= limit
    )  # ties keep query order
    return [terms[i] for _, i in kept[:MAX_KEYWORD_TERMS]]


# -- writes ----------------------------------------------------------------------------------


def insert_rows(
    db: sqlite3.Connection,
    *,
    ns: str,
    namespace: Namespace,
    embedder: str,
    dim: int,
    rows: Sequence[tuple[PassageRow, bytes]],
) -> list[str]:
    """Transaction body: insert rows (skipping known op keys) and bump the namespace."""
    state = state_of(fetch(db, STATE, {"ns": ns}))
    check_embedder(state, embedder, dim, namespace)
    if state is None:
        [(nsid,)] = fetch(
            db, "INSERT INTO archival_namespaces (ns) VALUES (:ns) RETURNING nsid", {"ns": ns}
        )
    else:
        nsid = state.nsid
    ids: list[str] = []
    added = 0
    for row, vector in rows:
        if row.op_key is not None:
            known = fetch(
                db,
                "SELECT passage_id FROM archival_op_keys WHERE nsid = :nsid AND op_key = :op_key",
                {"nsid": nsid, "op_key": row.op_key},
            )
            if known:
                ids.append(known[0][0])
                continue
            fetch(
                db,
                "INSERT INTO archival_op_keys (nsid, op_key, passage_id) "
                "VALUES (:nsid, :op_key, :id)",
                {"nsid": nsid, "op_key": row.op_key, "id": row.id},
            )
        [(seq,)] = fetch(
            db,
            _INSERT,
            {
                "id": row.id,
                "nsid": nsid,
                "text": row.text,
                "metadata": row.metadata,
                "created_at": now_us(),
                "embedder": embedder,
                "dim": dim,
                "vector": vector,
            },
        )
        db.executemany(INSERT_TAG, [(nsid, tag, seq, i) for i, tag in enumerate(row.tags)])
        ids.append(row.id)
        added += 1
    if added:
        fetch(
            db,
            BUMP,
            {"nsid": nsid, "added": added, "vectors_changed": 0, "embedder": embedder, "dim": dim},
        )
    return ids
