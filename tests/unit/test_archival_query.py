"""The archival stores' pure parts: FTS5 query terms, cursors, validation, vector ranking."""

from __future__ import annotations

import json
import sqlite3
from array import array
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memory._archival_common as common
import memory._sqlite_passages as passages
from graphexec.errors import MemoryStoreError
from memory import _vectors
from memory.embedders import cosine_many, to_bytes

# -- FTS5 terms --------------------------------------------------------------------------------


def test_terms_are_quoted_words_without_stopwords() -> None:
    assert passages.fts_terms("Which seat does she like when flying far?") == [
        '"seat"',
        '"like"',
        '"flying"',
        '"far"',
    ]


def test_terms_drop_syntax_and_repeat_stems() -> None:
    assert passages.fts_terms('NEAR(a b) AND "x" OR y* -z ^w col:v') == [
        '"near"',
        '"b"',
        '"x"',
        '"y"',
        '"z"',
        '"w"',
        '"col"',
        '"v"',
    ]
    assert passages.fts_terms("flights flight FLIGHTS") == ['"flights"']
    assert passages.fts_terms("the and of") == []
    assert passages.fts_terms("") == []
    assert passages.fts_terms("?! -- ** ::") == []


def test_hyphenated_compounds_match_either_spelling() -> None:
    assert passages.fts_terms("Wi-Fi password") == ['("wi fi" OR "wifi")', '"password"']
    assert passages.fts_terms("e-mail email") == ['("e mail" OR "email")']


def test_terms_are_capped() -> None:
    query = " ".join(f"word{i}" for i in range(100))
    assert len(passages.fts_terms(query)) == common.MAX_QUERY_TERMS


@pytest.fixture(scope="module")
def fts() -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(text, tokenize='porter unicode61')")
    db.executemany(
        "INSERT INTO t (text) VALUES (?)",
        [
            ("The Wi-Fi password rotates monthly",),
            ("near and or not",),
            ("café 東京 naïve",),
            ("email me the wifi code",),
        ],
    )
    yield db
    db.close()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_gives_valid_fts5_queries(fts: sqlite3.Connection, text: str) -> None:
    terms = passages.fts_terms(text)
    if terms:
        fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (" OR ".join(terms),)).fetchall()
        for term in terms:
            fts.execute("SELECT count(*) FROM t WHERE t MATCH ?", (term,)).fetchall()


def test_terms_match_stems_and_compounds(fts: sqlite3.Connection) -> None:
    def hits(query: str) -> list[int]:
        match = " OR ".join(passages.fts_terms(query))
        return [r[0] for r in fts.execute("SELECT rowid FROM t WHERE t MATCH ?", (match,))]

    assert hits("rotating passwords") == [1]
    assert hits("wi-fi") == [1, 4]
    assert hits("e-mail") == [4]
    assert hits("wifi") == [4]
    assert hits("NEAR(") == [2]
    assert hits("cafe naive") == [3]


def test_select_terms_drops_common_words_and_keeps_the_rarest() -> None:
    terms = [f"t{i}" for i in range(12)]
    counts = [5, 1, 90_000, 3, 0, 7, 2, 4, 6, 8, 9, 30_000]
    chosen = passages.select_terms(terms, counts, total=100_000)
    assert chosen == ["t4", "t1", "t6", "t3", "t7", "t0", "t8", "t5"]
    assert passages.select_terms(["a", "b"], [4000, 10], total=4000) == ["b", "a"]
    assert passages.select_terms(["a"], [90_000], total=100_000) == []


# -- cursors -----------------------------------------------------------------------------------


def test_cursor_round_trip_and_misuse() -> None:
    cursor = common.encode_cursor({"k": "search", "h": "abc", "o": 10, "d": 50})
    assert common.decode_cursor(cursor, "search", "abc", ("o", "d")) == [10, 50]
    with pytest.raises(MemoryStoreError, match="different search"):
        common.decode_cursor(cursor, "search", "xyz", ("o", "d"))
    with pytest.raises(MemoryStoreError, match="invalid archival cursor for list"):
        common.decode_cursor(cursor, "list", "abc", ("at", "s"))


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "bm90IGpzb24",
        common.encode_cursor({"k": "search", "h": "abc", "o": -1, "d": 50}),
        common.encode_cursor({"k": "search", "h": "abc", "o": True, "d": 50}),
        common.encode_cursor({"k": "search", "h": "abc", "o": "1", "d": 50}),
        common.encode_cursor({"k": "search", "h": "abc", "o": 1}),
        json.dumps([1, 2]),
        42,
    ],
)
def test_bad_cursors_are_refused(cursor: Any) -> None:
    with pytest.raises(MemoryStoreError):
        common.decode_cursor(cursor, "search", "abc", ("o", "d"))


# -- validation --------------------------------------------------------------------------------


def test_tags_are_deduplicated_in_order() -> None:
    assert common.check_tags(["b", "a", "b", "c", "a"]) == ("b", "a", "c")
    assert common.check_tags(iter(["x"])) == ("x",)
    with pytest.raises(MemoryStoreError, match=r"for one tag write \['travel'\]"):
        common.check_tags("travel")


def test_metadata_must_round_trip_as_json() -> None:
    assert json.loads(common.check_metadata({"a": [1, 2.5, None, True, {"b": "é"}]})) == {
        "a": [1, 2.5, None, True, {"b": "é"}]
    }
    assert common.check_metadata(None) == "{}"
    for bad in ({"x": float("inf")}, {"x": b"bytes"}, {("t",): 1}, {"x": "\udc00"}, [1]):
        with pytest.raises(MemoryStoreError):
            common.check_metadata(bad)


def test_times_must_be_aware() -> None:
    moment = datetime(2025, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    shifted = moment.astimezone(timezone(timedelta(hours=9)))
    assert common.check_time(moment, "after") == common.check_time(shifted, "after")
    assert common._EPOCH + common.check_time(moment, "after") * common._US == moment  # type: ignore[operator]
    assert common.check_time(None, "after") is None
    with pytest.raises(MemoryStoreError, match="timezone-aware"):
        common.check_time(datetime(2025, 5, 1), "after")


def test_clock_is_strictly_increasing() -> None:
    stamps = [common.now_us() for _ in range(1000)]
    assert stamps == sorted(set(stamps))


# -- vector ranking ----------------------------------------------------------------------------


def _rows(vectors: list[list[float]], start: int = 1) -> list[tuple[int, int, bytes]]:
    return [(start + i, 1000 + start + i, to_bytes(array("f", v))) for i, v in enumerate(vectors)]


vectors_st = st.lists(
    st.lists(st.floats(-1, 1, width=32, allow_subnormal=False), min_size=4, max_size=4),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(
    vectors_st,
    st.lists(st.floats(-1, 1, width=32, allow_subnormal=False), min_size=4, max_size=4),
    st.integers(1, 10),
)
def test_numpy_and_pure_rankings_agree(
    vectors: list[list[float]], query: list[float], depth: int
) -> None:
    rows = _rows(vectors)
    cache = _vectors.VectorCache(embedder="e", dim=4, epoch=0, capacity=1)
    cache.append(rows)
    fast = _vectors.top_vectors(
        cache.snapshot(), query, allowed=None, after=None, before=None, depth=depth
    )
    heap: list[tuple[float, int]] = []
    sims = cosine_many(query, [r[2] for r in rows], 4, use_numpy=False)
    _vectors._merge_top(heap, rows, sims, depth)
    slow = [-neg for _, neg in sorted(heap, key=lambda item: (-item[0], -item[1]))]
    # Scores computed in float32 and float64 may order near-ties differently.
    assert len(fast) == len(slow) or abs(len(fast) - len(slow)) <= 1
    score = dict(zip([r[0] for r in rows], sims, strict=True))
    for a, b in zip(fast, slow, strict=False):
        assert score[a] == pytest.approx(score[b], abs=1e-5)


def test_vector_filters_apply_before_the_depth() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(500, 8)).astype(np.float32).tolist()
    rows = _rows(vectors)
    cache = _vectors.VectorCache(embedder="e", dim=8, epoch=0, capacity=10)
    cache.append(rows)
    query = vectors[0]
    allowed = [250, 499, 9999]
    got = _vectors.top_vectors(
        cache.snapshot(), query, allowed=allowed, after=None, before=None, depth=1
    )
    sims = {r[0]: s for r, s in zip(rows, cosine_many(query, [r[2] for r in rows], 8), strict=True)}
    positive = [s for s in (250, 499) if sims[s] > 0]
    assert got == sorted(positive, key=lambda s: -sims[s])[:1]
    windowed = _vectors.top_vectors(
        cache.snapshot(), query, allowed=None, after=1000 + 100, before=1000 + 103, depth=10
    )
    assert set(windowed) <= {101, 102}
    assert (
        _vectors.top_vectors(
            cache.snapshot(), [0.0] * 8, allowed=None, after=None, before=None, depth=5
        )
        == []
    )


def test_cache_appends_only_new_rows_and_grows() -> None:
    cache = _vectors.VectorCache(embedder="e", dim=2, epoch=0, capacity=1)
    rows = _rows([[1.0, 0.0]] * 1500)
    cache.append(rows[:1000])
    before = cache.snapshot()
    cache.append(rows[500:])  # overlapping: known seqs are skipped
    matrix, seqs, created = cache.snapshot()
    assert seqs.tolist() == list(range(1, 1501))
    assert created.tolist() == [1000 + s for s in range(1, 1501)]
    assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0)
    assert before[1].tolist() == list(range(1, 1001)), "an old snapshot must stay valid"
    assert cache.last_seq() == 1500
