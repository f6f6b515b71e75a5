"""Pure helpers of the SQLite memory tiers: JSON checks, namespaces, FTS5 queries, summaries."""

from __future__ import annotations

import json
import math
import sqlite3
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphexec.errors import MemoryStoreError
from memory import Fact
from memory._sqlite_common import (
    MIGRATIONS,
    check_count,
    check_json,
    check_namespace,
    decode_namespace,
    dumps,
    encode_namespace,
    fts_queries,
    fts_terms,
)
from memory._sqlite_stores import _occurrences, render_fact_lines

# -- JSON ---------------------------------------------------------------------------------------


def test_check_json_accepts_exact_json() -> None:
    value = {"a": [1, -0.0, 2**80, 1e308, True, None, "é\x00"], "b": {}, "c": []}
    check_json(value, "v")
    assert json.loads(dumps(value)) == value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"a": [1, {2, 3}]}, r"v\['a'\]\[1\] is a set"),
        ({"a": (1,)}, r"v\['a'\] is a tuple, .*use a list"),
        ({"a": math.nan}, r"v\['a'\] is nan"),
        ([math.inf], r"v\[0\] is inf"),
        ({1: "x"}, "has the key 1 .int."),
        ({"k": b"x"}, "bytes"),
        ({"k": "\udc80"}, "lone surrogate"),
        ({"\ud800": 1}, "lone surrogate"),
        ({"k": datetime(2024, 1, 1, tzinfo=UTC)}, "datetime"),
    ],
)
def test_check_json_names_the_offending_value(value: Any, message: str) -> None:
    with pytest.raises(MemoryStoreError, match=message):
        check_json(value, "v")


def test_check_json_refuses_cycles_and_runaway_nesting() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(MemoryStoreError, match="cycle"):
        check_json(cyclic, "v")
    shared = [1]
    check_json([shared, shared], "v")  # the same list twice is not a cycle
    deep: list[Any] = []
    node = deep
    for _ in range(300):
        node.append([])
        node = node[0]
    with pytest.raises(MemoryStoreError, match="nested"):
        check_json(deep, "v")


def test_check_count() -> None:
    assert check_count(0, "n") == 0
    assert check_count(None, "n", allow_none=True) is None
    for bad in (-1, True, 1.0, "1", None):
        with pytest.raises(MemoryStoreError, match="n must be"):
            check_count(bad, "n")


# -- namespaces ---------------------------------------------------------------------------------


@given(st.lists(st.text(st.characters(codec="utf-8"), min_size=1), max_size=4))
def test_namespace_encoding_is_injective(parts: list[str]) -> None:
    ns = tuple(parts)
    assert decode_namespace(encode_namespace(ns)) == ns
    assert encode_namespace(list(ns)) == encode_namespace(ns)
    joined = ("|".join(ns),) if len(ns) > 1 else (*ns, "x")
    assert encode_namespace(joined) != encode_namespace(ns)


def test_namespace_checks() -> None:
    assert check_namespace(()) == ()
    assert check_namespace(["a", "b"]) == ("a", "b")
    for bad in ("ab", b"ab", None, 3, ("a", ""), ("a", None), ("\ud800",)):
        with pytest.raises(MemoryStoreError, match="namespace"):
            check_namespace(bad)


# -- full text ----------------------------------------------------------------------------------


def test_fts_queries_quote_every_token() -> None:
    assert fts_queries("") == ()
    assert fts_queries("the of AND OR") == ()
    assert fts_queries('NEAR("x" *') == ('"near" AND "x"', '"near" OR "x"')
    assert fts_queries('say "hi*"') == ('"say" AND "hi"', '"say" OR "hi"')
    assert fts_queries("Flights to Lisbon") == ('"flight" AND "lisbon"', '"flight" OR "lisbon"')
    assert fts_queries("flight flights") == ('"flight"',)
    assert len(fts_queries(" ".join(f"w{i}" for i in range(100)))[0].split(" AND ")) == 32
    assert fts_terms("Héllo, WORLD's flights!") == "hello world flight"


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8")))
def test_any_user_text_is_a_valid_fts5_query(text: str) -> None:
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE t USING fts5(terms)")
        db.execute("INSERT INTO t (terms) VALUES (?)", (fts_terms(text),))
        for expression in fts_queries(text):
            rows = db.execute("SELECT rowid FROM t WHERE t MATCH ?", (expression,)).fetchall()
            if " OR " in expression or " AND " not in expression:
                assert rows == [(1,)]  # a text always matches its own query
    finally:
        db.close()


def test_migrations_are_single_statements() -> None:
    assert all(sqlite3.complete_statement(m + ";") for m in MIGRATIONS)
    assert all(";" not in m for m in MIGRATIONS)


# -- fact summaries -----------------------------------------------------------------------------


def _fact(key: str, value: Any) -> Fact:
    return Fact(("ns",), key, value, None, datetime(2024, 1, 1, tzinfo=UTC), 1)


def test_render_fact_lines_budget_and_layout() -> None:
    facts = [_fact("long", "x" * 50), _fact("a", "1"), _fact("b", {"k": [1, "é"]}), _fact("e", "")]
    assert render_fact_lines(facts, 1000) == (
        "- long: " + "x" * 50 + '\n- a: 1\n- b: {"k":[1,"é"]}\n- e:'
    )
    assert render_fact_lines(facts, 20) == "- a: 1\n- e:"  # the long line is skipped, not cut
    assert render_fact_lines(facts, 5) == "- e:"
    assert render_fact_lines(facts, 0) == ""
    weird = [_fact("multi\nline key", "v1\n\n- fake: fact\r\n\tend")]
    assert render_fact_lines(weird, 100) == "- multi line key: v1 - fake: fact end"


@given(st.lists(st.tuples(st.text(min_size=1), st.text()), max_size=6), st.integers(0, 80))
def test_render_fact_lines_never_exceeds_the_budget(
    pairs: list[tuple[str, str]], budget: int
) -> None:
    text = render_fact_lines([_fact(k, v) for k, v in pairs], budget)
    assert len(text) <= budget
    assert all(line.startswith("- ") for line in text.split("\n") if text)


def test_occurrences_count_overlaps() -> None:
    assert _occurrences("aaa", "aa") == 2
    assert _occurrences("abc", "d") == 0
    assert _occurrences("cat cat", "cat") == 2
