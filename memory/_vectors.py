"""Vector candidates for both archival stores: brute-force cosine similarity.

With numpy (:data:`np`), a store keeps each namespace's vectors in a :class:`VectorCache`
(loaded by :func:`load_vector_cache`, then extended with new rows only) and ranks them with
:func:`top_vectors`. Without numpy, :func:`scan_vectors` reads the filtered vectors in chunks
and scores them in pure Python. Both rank alike: similarities rounded to float32 precision,
positive ones only, ties to the older passage. The SQL comes from the store, as a
:data:`VectorReader`.
"""

from __future__ import annotations

import heapq
import importlib
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from memory._archival_common import NamespaceState, Seqs
from memory.embedders import Embedder, cosine_many

__all__ = [
    "PARALLEL_ROWS",
    "VectorCache",
    "VectorReader",
    "load_vector_cache",
    "np",
    "scan_vectors",
    "top_vectors",
]

try:
    np: Any = importlib.import_module("numpy")
except ImportError:  # pragma: no cover - numpy is installed wherever the tests run
    np = None
"""numpy, or ``None`` where it is not installed (stores then use :func:`scan_vectors`)."""

_CHUNK = 4096
_DIGITS = 6  # similarity digits that count: float32 carries about seven
PARALLEL_ROWS = 20_000  # score bigger matrices in a worker thread, off the event loop
_Heap = list[tuple[float, int]]

VectorReader = Callable[[dict[str, Any]], Awaitable[Sequence[Sequence[Any]]]]
"""Runs a store's vector statement (its ``VECTORS`` with its filters) with these parameters."""


class VectorCache:
    """One namespace's vectors in memory (numpy), grown in place as rows are appended.

    Rows are kept in ``seq`` order, L2-normalised. Appends never move rows a reader already
    holds (a full buffer is copied to a new, larger one), so snapshots stay valid while a
    worker thread scores them.
    """

    def __init__(self, *, embedder: str, dim: int, epoch: int, capacity: int) -> None:
        self.embedder = embedder
        self.dim = dim
        self.epoch = epoch
        self.version = -1
        self._lock = threading.Lock()
        capacity = max(capacity, 1024)
        self._matrix: Any = np.empty((capacity, dim), dtype=np.float32)
        self._seqs: Any = np.empty(capacity, dtype=np.int64)
        self._created: Any = np.empty(capacity, dtype=np.int64)
        self._n = 0

    def last_seq(self) -> int:
        with self._lock:
            return int(self._seqs[self._n - 1]) if self._n else 0

    def append(self, rows: Sequence[Sequence[Any]]) -> None:
        """Add ``(seq, created_at, vector bytes)`` rows, ascending; known seqs are skipped."""
        with self._lock:
            last = int(self._seqs[self._n - 1]) if self._n else 0
            fresh = [r for r in rows if r[0] > last]
            if not fresh:
                return
            end = self._n + len(fresh)
            if end > len(self._seqs):
                capacity = max(end, 2 * len(self._seqs))
                matrix = np.empty((capacity, self.dim), dtype=np.float32)
                seqs = np.empty(capacity, dtype=np.int64)
                created = np.empty(capacity, dtype=np.int64)
                matrix[: self._n] = self._matrix[: self._n]
                seqs[: self._n] = self._seqs[: self._n]
                created[: self._n] = self._created[: self._n]
                self._matrix, self._seqs, self._created = matrix, seqs, created
            block = np.frombuffer(b"".join(r[2] for r in fresh), dtype="<f4")
            block = block.reshape(len(fresh), self.dim).astype(np.float64)  # no underflow
            norms = np.linalg.norm(block, axis=1, keepdims=True)
            self._matrix[self._n : end] = block / np.where(norms > 0, norms, 1.0)
            self._seqs[self._n : end] = [r[0] for r in fresh]
            self._created[self._n : end] = [r[1] for r in fresh]
            self._n = end

    def snapshot(self) -> tuple[Any, Any, Any]:
        """``(matrix, seqs, created_at)`` views of the rows loaded so far."""
        with self._lock:
            n = self._n
            return self._matrix[:n], self._seqs[:n], self._created[:n]


def top_vectors(
    snapshot: tuple[Any, Any, Any],
    query: Sequence[float],
    *,
    allowed: Sequence[int] | None,
    after: int | None,
    before: int | None,
    depth: int,
) -> list[int]:
    """The ``depth`` most similar rows (positive cosine only), best first, as seqs."""
    matrix, seqs, created = snapshot
    q = np.asarray(query, dtype=np.float64)
    norm = float(np.linalg.norm(q))
    if norm == 0.0 or not len(seqs):
        return []
    q = (q / norm).astype(np.float32)
    idx: Any = None
    if allowed is not None:
        wanted = np.asarray(sorted(allowed), dtype=np.int64)
        pos = np.minimum(np.searchsorted(seqs, wanted), len(seqs) - 1)
        idx = pos[seqs[pos] == wanted]
    if after is not None or before is not None:
        times = created if idx is None else created[idx]
        keep = np.ones(len(times), dtype=bool)
        if after is not None:
            keep &= times > after
        if before is not None:
            keep &= times < before
        idx = np.flatnonzero(keep) if idx is None else idx[keep]
    # einsum, not ``matrix @ q``: the product is memory-bound, and a multi-threaded BLAS
    # spends twice the CPU for it and stalls when the cores are busy (measured at 100k rows:
    # 5 ms CPU single-threaded vs 11-15 ms with OpenBLAS threads; see benchmarks/).
    if idx is None:
        raw, cands = np.einsum("ij,j->i", matrix, q), seqs
    elif 8 * len(idx) > len(seqs):  # cheaper to score every row than to copy a big subset
        raw, cands = np.einsum("ij,j->i", matrix, q)[idx], seqs[idx]
    else:
        raw, cands = np.einsum("ij,j->i", matrix[idx], q), seqs[idx]
    # Rounded to float32 precision: equal vectors tie whatever row BLAS computed them in, and
    # ties go to the older passage (lower seq), as in the pure-Python scan.
    scores = np.round(raw, _DIGITS)
    positive = scores > 0
    scores, cands = scores[positive], cands[positive]
    if len(scores) > depth:
        part = np.argpartition(-scores, depth - 1)[:depth]
        scores, cands = scores[part], cands[part]
    order = np.lexsort((cands, -scores))
    return [int(s) for s in cands[order]]


def _merge_top(
    heap: list[tuple[float, int]], rows: Sequence[Sequence[Any]], sims: Sequence[float], depth: int
) -> None:
    """Keep the ``depth`` best ``(score, -seq)`` pairs of a chunk scan in a min-heap."""
    for row, sim in zip(rows, sims, strict=True):
        score = round(sim, _DIGITS)
        if score <= 0:
            continue
        item = (score, -int(row[0]))
        if len(heap) < depth:
            heapq.heappush(heap, item)
        elif item > heap[0]:
            heapq.heapreplace(heap, item)


async def load_vector_cache(
    caches: dict[int, VectorCache],
    embedder: Embedder,
    state: NamespaceState,
    read: VectorReader,
) -> VectorCache:
    """The namespace's vector cache in ``caches``, brought up to ``state``.

    Loads, in ``_CHUNK``-row reads of the unfiltered vector statement, only the rows after the
    last one cached; starts over when the embedder or the namespace's epoch changed.
    """
    cache = caches.get(state.nsid)
    if cache is not None and (cache.embedder, cache.dim, cache.epoch) == (
        embedder.name,
        embedder.dim,
        state.epoch,
    ):
        if cache.version == state.version:
            return cache
    else:
        cache = VectorCache(
            embedder=embedder.name, dim=embedder.dim, epoch=state.epoch, capacity=state.passages
        )
    params: dict[str, Any] = {
        "nsid": state.nsid,
        "embedder": embedder.name,
        "dim": embedder.dim,
        "chunk": _CHUNK,
        "start": cache.last_seq(),
    }
    while True:
        rows = await read(params)
        cache.append(rows)
        if len(rows) < _CHUNK:
            break
        params["start"] = rows[-1][0]
    # Rows read after ``state`` was taken may be newer than it: labelling the cache with the
    # older state is safe (the next search loads again from the last seq); never the reverse.
    cache.version = state.version
    caches[state.nsid] = cache
    return cache


async def scan_vectors(
    read: VectorReader,
    filter_params: Mapping[str, Any],
    embedder: Embedder,
    qvec: Sequence[float],
    depth: int,
) -> Seqs:
    """Pure-Python vector candidates (no numpy): score the filtered vectors chunk by chunk."""
    params: dict[str, Any] = {
        **filter_params,
        "embedder": embedder.name,
        "dim": embedder.dim,
        "chunk": _CHUNK,
        "start": 0,
    }
    heap: _Heap = []
    while True:
        rows = await read(params)
        if rows:
            vectors = [bytes(r[2]) for r in rows]
            _merge_top(heap, rows, cosine_many(qvec, vectors, embedder.dim, use_numpy=False), depth)
        if len(rows) < _CHUNK:
            break
        params["start"] = rows[-1][0]
    return [-neg for _, neg in sorted(heap, key=lambda item: (-item[0], -item[1]))]
