"""Archival search quality: recall@5 on paraphrased queries (SPEC §7).

``python -m benchmarks.archival_eval [--embedder hashing|hashing-plain|minilm|both|all]``

Protocol (``shared/eval/README.md``): put every passage of the eval file in one corpus together
with generic distractor passages, run each query with ``top_k=5`` and count the queries whose own
passage is among the hits. These rankings are scored:

* ``vector``: cosine similarity of the chosen embedder's vectors;
* ``bm25``: Okapi BM25 over :func:`memory._text.content_tokens` (stemmed, stopwords dropped), any
  query term matching (an OR query);
* ``hybrid``: reciprocal rank fusion (k=60) of the top 50 by vector and the top 50 by BM25 among
  passages holding at least half of the query's terms (``MIN_COVERAGE``);
* ``hybrid_ungated``: RRF of the full vector ranking and the OR BM25 ranking. Shown because it
  is the naive design and it loses: RRF ranks any passage found by both lists above the best
  passage of one list, so one incidental shared word lifts a distractor over the right answer.

Embedders: ``hashing`` is the built-in :class:`~memory.embedders.HashingEmbedder` with its generic
concept table, ``hashing-plain`` the same without the table, ``minilm`` the real model
(:class:`~memory.embedders.MiniLMEmbedder`, needs the ``embeddings`` extra).

Datasets (``--dataset``): ``eval`` is the shared file. ``dev`` and ``heldout`` are paraphrase
pairs written for this module, on varied everyday topics, before the concept table was written.
``dev`` was used for tuning: the hashing weights were chosen on it, and a few generic groups were
added to the table after looking at its misses. ``heldout`` was never used for tuning. The shared
eval file was visible while the table was written; the table is generic by construction (words
common in general English; niche words from the eval file such as product, place or medical
names left out) and its misses were not used to change it, but treat ``heldout`` as the number
that generalises (with the caveat that one author wrote both it and the table). ``keyword``
queries each eval passage by its two rarest words: the lexical side's sanity check.

Distractors: :func:`distractors` fills sentence templates from fixed word lists with
``random.Random(20260601)``, keeping the first 200 distinct sentences; they use everyday office,
home, travel and tech vocabulary, so they compete with the real passages on shared words.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memory._text import STOPWORDS, bm25_scores, content_tokens, rrf, stem, words
from memory.embedders import Embedder, HashingEmbedder, MiniLMEmbedder, cosine_many, to_bytes

__all__ = [
    "DEV_SET",
    "EMBEDDERS",
    "EVAL_PATH",
    "DATASETS",
    "HELDOUT_SET",
    "distractors",
    "keyword_queries",
    "load_eval",
    "main",
    "make_embedder",
    "run",
]

EVAL_PATH = Path(__file__).resolve().parents[2] / "shared/eval/archival_eval.jsonl"
TOP_K = 5
DEPTH = 50
"""Candidates taken from each ranking before fusion, as a store would fetch them."""
MIN_COVERAGE = 0.5
"""Fraction of the query's terms a passage must contain to enter the hybrid's lexical list."""
EMBEDDERS = ("hashing", "hashing-plain", "minilm")
DATASETS = ("eval", "dev", "heldout", "keyword")

# (passage, query) pairs: tuning set for the hashing embedder's weights.
DEV_SET: tuple[tuple[str, str], ...] = (
    ("The dentist appointment was moved to next Friday at nine.",
     "when is the rescheduled teeth checkup"),
    ("Our team uses Slack for chat and Jira for tickets.",
     "which messaging tool and issue tracker does the group rely on"),
    ("The car needs an oil change every ten thousand kilometres.",
     "how often should the vehicle get its engine lubricant replaced"),
    ("Maria is vegetarian and never eats fish.", "she avoids meat and seafood"),
    ("The printer on the third floor is out of toner.", "upstairs copier has no ink left"),
    ("New employees receive their badge on the first day.",
     "when do fresh hires get an access card"),
    ("The conference talk was recorded and uploaded to YouTube.",
     "video of the presentation is online"),
    ("His flight lands at Heathrow at 6 am on Sunday.", "when does his plane arrive in London"),
    ("The apartment lease ends in August and rent will rise.",
     "housing contract expires in late summer with higher payments"),
    ("The kids have a piano recital next Saturday.", "children's music performance this weekend"),
    ("The server crashed because of a memory leak in the cache.",
     "machine went down since RAM kept growing"),
    ("Please send the signed contract by email before Friday.",
     "return the agreement electronically by the end of the week"),
    ("The dog must be walked twice a day.", "how often does the puppy need to go outside"),
    ("Our budget for the holiday party is two thousand dollars.",
     "how much money can we spend on the year-end celebration"),
    ("The doctor prescribed antibiotics for the ear infection.",
     "medicine given for the ear illness"),
    ("Customers complained that the mobile app is too slow.",
     "users unhappy about sluggish phone application"),
    ("The museum is free on the first Sunday of each month.",
     "no-charge entry to the gallery once a month"),
    ("The training course teaches Python for data analysis.",
     "class on programming to study statistics"),
    ("He broke his wrist while skiing in the Alps.",
     "injured arm on a winter sports trip in the mountains"),
    ("The shipment was delayed at customs for a week.", "package held up at the border"),
    ("The manager approved two extra vacation days.", "boss allowed additional time off"),
    ("The restaurant requires a reservation for groups larger than six.",
     "booking needed for big parties at the eatery"),
    ("Our website traffic doubled after the marketing campaign.",
     "visitors increased twofold following the ad push"),
    ("The baby wakes up every three hours at night.", "infant sleep interrupted frequently"),
    ("The contract can be cancelled with thirty days notice.",
     "how to terminate the agreement: one month warning"),
    ("The kitchen sink is leaking under the cabinet.",
     "water dripping from the pipe below the basin"),
    ("She runs five kilometres every morning before work.", "daily jog at dawn"),
    ("All laptops must have disk encryption enabled.",
     "company computers need their drives protected"),
    ("The elevator is out of service until Tuesday.", "lift broken for a few days"),
    ("Train tickets are cheaper if booked a month in advance.",
     "rail fares lower with early purchase"),
)  # fmt: skip

# (passage, query) pairs never used for tuning: report only.
HELDOUT_SET: tuple[tuple[str, str], ...] = (
    ("The hospital visiting hours end at eight in the evening.",
     "until when can relatives see patients at the clinic"),
    ("My grandfather fought in the Korean War.",
     "elderly relative served in the military conflict in Asia"),
    ("The payroll system pays salaries on the 25th of each month.",
     "when do workers get their wages"),
    ("The puppy chewed through the charging cable.", "young dog bit the power cord"),
    ("We need more chairs for the wedding reception.",
     "extra seating for the marriage celebration"),
    ("The new smartphone battery lasts two full days.", "mobile phone power endurance"),
    ("The school closes when it snows heavily.", "classes cancelled during a blizzard"),
    ("Our landlord will repaint the apartment in spring.",
     "property owner plans to redecorate the flat"),
    ("The startup raised ten million dollars in its first funding round.",
     "young company secured investment capital"),
    ("The password reset link expires after one hour.",
     "how long the recovery email stays valid"),
    ("Grandpa takes his blood pressure pills every morning.",
     "elderly man's daily hypertension medication"),
    ("The bus to the airport leaves every twenty minutes.",
     "how frequent is the shuttle to the terminal"),
    ("The quarterly sales report is due next Monday.",
     "deadline for the three-month revenue summary"),
    ("The river flooded the village after days of rain.",
     "town underwater following a long downpour"),
    ("Her novel was translated into twelve languages.", "book published in many foreign editions"),
    ("The gym is closed for renovations until June.", "fitness center shut during remodeling"),
    ("The coffee machine in the break room is broken.",
     "espresso maker in the lounge does not work"),
    ("Teenagers under sixteen need parental consent to sign up.",
     "minors require permission from mom or dad to register"),
    ("The photographer charges extra for weekend shoots.", "additional fee for Saturday pictures"),
    ("Logs older than ninety days are deleted automatically.",
     "old records purged after three months"),
    ("The bridge will be closed to traffic for repairs.", "road crossing shut while it is fixed"),
    ("My sister is moving to Canada for a job.", "sibling relocating abroad for work"),
    ("The chef recommends the salmon with lemon butter.", "cook suggests the fish dish"),
    ("The conference room projector needs a new bulb.",
     "meeting space beamer lamp replacement"),
    ("Students must submit essays through the online portal.",
     "pupils hand in papers on the website"),
    ("The company matches retirement contributions up to five percent.",
     "employer pension savings match"),
    ("The lake freezes solid in January.", "pond covered with ice in midwinter"),
    ("Our neighbor's dog barks all night.", "noisy pet next door keeps us awake"),
    ("The vaccine requires two doses four weeks apart.",
     "immunization shots spaced a month apart"),
    ("Users can export their data as a CSV file.", "download information as a spreadsheet"),
)  # fmt: skip

_SUBJECTS = (
    "The finance team", "Our landlord", "The new hire", "The support desk", "My neighbour",
    "The marketing lead", "The night shift", "The school board", "Our travel agent", "The auditor",
    "The city council", "The IT department", "Her cousin", "The project manager", "The vendor",
)  # fmt: skip
_VERBS = (
    "reviewed", "postponed", "updated", "approved", "printed", "archived", "translated",
    "cancelled", "shared", "renamed", "measured", "repaired", "ordered", "summarised", "tested",
)  # fmt: skip
_OBJECTS = (
    "the parking permits", "the onboarding checklist", "the conference agenda",
    "the hallway lights", "the vendor contract", "the fire drill notes", "the expense policy",
    "the team photo", "the supply order", "the printer settings", "the garden fence",
    "the newsletter draft", "the visitor badges", "the spare keys", "the inventory sheet",
    "the recycling schedule", "the customer survey", "the storage boxes", "the dashboard colours",
    "the holiday card list",
)  # fmt: skip
_WHEN = (
    "last week", "this morning", "before lunch", "on Monday", "after the audit",
    "during the move", "at the end of the quarter", "yesterday afternoon", "in the spring",
    "over the weekend", "ahead of the launch", "twice this year",
)  # fmt: skip
_PLACES = (
    "The cafeteria", "The east parking lot", "The rooftop terrace", "The reception area",
    "The second-floor kitchen", "The community pool", "The print room", "The train station",
    "The public park", "The main lobby",
)  # fmt: skip
_STATES = (
    "is being repainted", "opens at seven", "gets crowded at noon", "has new furniture",
    "is closed for cleaning", "needs better signage", "was rearranged", "smells of fresh paint",
)  # fmt: skip


def distractors(n: int = 200, *, seed: int = 20260601) -> list[str]:
    """Generic passages that compete with the real ones, the same on every run.

    Args:
        n: How many distinct passages.
        seed: Seed of the ``random.Random`` that fills the templates.

    Returns:
        ``n`` distinct sentences.
    """
    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        if rng.random() < 0.7:
            text = (
                f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} "
                f"{rng.choice(_WHEN)}."
            )
        else:
            text = f"{rng.choice(_PLACES)} {rng.choice(_STATES)} {rng.choice(_WHEN)}."
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def keyword_queries(passages: Sequence[str], n_distractors: int = 200) -> list[str]:
    """Keyword-style queries: each passage's two rarest content words, as typed.

    Rarity is document frequency over the passages plus the distractors, ties broken by position.
    These check the other side of hybrid search: exact names and terms that lexical ranking finds.

    Args:
        passages: The real passages.
        n_distractors: Distractors counted for document frequencies (as in :func:`run`).

    Returns:
        One query per passage.
    """
    corpus = [*passages, *distractors(n_distractors)]
    df: dict[str, int] = {}
    for text in corpus:
        for token in set(content_tokens(text)):
            df[token] = df.get(token, 0) + 1
    queries: list[str] = []
    for text in passages:
        first: dict[str, str] = {}
        for word in words(text):
            if word not in STOPWORDS:
                first.setdefault(stem(word), word)
        ordered = sorted(first, key=lambda t: df.get(t, 0))  # sorted() is stable
        queries.append(" ".join(first[t] for t in ordered[:2]))
    return queries


def load_eval(path: Path = EVAL_PATH) -> list[tuple[str, str]]:
    """Read the shared eval file.

    Args:
        path: The JSON-lines file with ``passage`` and ``query`` per line.

    Returns:
        ``(passage, query)`` pairs in file order.
    """
    pairs: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                pairs.append((row["passage"], row["query"]))
    return pairs


def make_embedder(name: str) -> Embedder:
    """Build an embedder by benchmark name (see :data:`EMBEDDERS`).

    Args:
        name: ``hashing``, ``hashing-plain`` or ``minilm``.

    Returns:
        The embedder.

    Raises:
        ValueError: For an unknown name.
    """
    if name == "hashing":
        return HashingEmbedder()
    if name == "hashing-plain":
        return HashingEmbedder(concepts=False)
    if name == "minilm":
        return MiniLMEmbedder()
    raise ValueError(f"unknown embedder {name!r}: choose from {', '.join(EMBEDDERS)}")


def _lexical_rank(
    query_tokens: Sequence[str], docs_tokens: Sequence[Sequence[str]], *, min_coverage: float
) -> list[int]:
    scores = bm25_scores(query_tokens, docs_tokens, min_coverage=min_coverage)
    return sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))


def _recall(rankings: Sequence[Sequence[int]], top_k: int) -> float:
    hits = sum(1 for q, ranking in enumerate(rankings) if q in ranking[:top_k])
    return hits / len(rankings) if rankings else 0.0


def run(
    embedder_name: str,
    *,
    dataset: str = "eval",
    eval_path: Path | None = None,
    n_distractors: int = 200,
    embedder: Embedder | None = None,
) -> dict[str, Any]:
    """Score one embedder on one dataset.

    Args:
        embedder_name: One of :data:`EMBEDDERS` (used to build the embedder unless given).
        dataset: One of :data:`DATASETS`: ``eval`` (the shared file), ``dev``, ``heldout`` or
            ``keyword``.
        eval_path: Override of :data:`EVAL_PATH` for ``eval``.
        n_distractors: Distractor passages added to the corpus.
        embedder: A ready embedder (e.g. to reuse a loaded model across datasets).

    Returns:
        A JSON-compatible dict: the embedder's name, corpus size, recall@5 per ranking
        (``vector``, ``bm25``, ``hybrid``, ``hybrid_ungated``), the query indices each ranking
        missed, and timings.
    """
    if dataset == "eval":
        pairs = load_eval(eval_path or EVAL_PATH)
    elif dataset == "dev":
        pairs = list(DEV_SET)
    elif dataset == "heldout":
        pairs = list(HELDOUT_SET)
    elif dataset == "keyword":
        pairs = load_eval(eval_path or EVAL_PATH)
        passages = [p for p, _ in pairs]
        pairs = list(zip(passages, keyword_queries(passages, n_distractors), strict=True))
    else:
        raise ValueError(f"unknown dataset {dataset!r}: {', '.join(DATASETS)}")
    t0 = time.perf_counter()
    emb = embedder or make_embedder(embedder_name)
    load_s = time.perf_counter() - t0

    passages = [p for p, _ in pairs] + distractors(n_distractors)
    queries = [q for _, q in pairs]
    t1 = time.perf_counter()
    doc_blob = b"".join(to_bytes(v) for v in emb.embed(passages))
    query_vecs = emb.embed(queries)
    embed_s = time.perf_counter() - t1

    docs_tokens = [content_tokens(p) for p in passages]
    rankings: dict[str, list[list[int]]] = {
        "vector": [],
        "bm25": [],
        "hybrid": [],
        "hybrid_ungated": [],
    }
    for query, qvec in zip(queries, query_vecs, strict=True):
        sims = cosine_many(qvec, doc_blob, emb.dim)
        vector_rank = sorted(range(len(passages)), key=lambda i: (-sims[i], i))
        q_tokens = content_tokens(query)
        bm25_rank = _lexical_rank(q_tokens, docs_tokens, min_coverage=0.0)
        gated_rank = _lexical_rank(q_tokens, docs_tokens, min_coverage=MIN_COVERAGE)
        rankings["vector"].append(vector_rank)
        rankings["bm25"].append(bm25_rank)
        rankings["hybrid"].append([i for i, _ in rrf([vector_rank[:DEPTH], gated_rank[:DEPTH]])])
        rankings["hybrid_ungated"].append([i for i, _ in rrf([vector_rank, bm25_rank])])
    return {
        "embedder": embedder_name,
        "model": emb.name,
        "dataset": dataset,
        "queries": len(queries),
        "passages": len(passages),
        "top_k": TOP_K,
        "recall@5": {k: round(_recall(v, TOP_K), 4) for k, v in rankings.items()},
        "missed": {
            k: [q for q, r in enumerate(v) if q not in r[:TOP_K]] for k, v in rankings.items()
        },
        "load_seconds": round(load_s, 3),
        "embed_seconds": round(embed_s, 3),
        "texts_per_second": round((len(passages) + len(queries)) / embed_s, 1) if embed_s else None,
    }


def _table(results: Sequence[dict[str, Any]]) -> str:
    rows = [
        "| embedder | dataset | vector | bm25 | hybrid | hybrid (ungated) | passages |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rec = r["recall@5"]
        rows.append(
            f"| {r['embedder']} | {r['dataset']} | {rec['vector']:.3f} | {rec['bm25']:.3f} | "
            f"{rec['hybrid']:.3f} | {rec['hybrid_ungated']:.3f} | {r['passages']} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print a recall@5 table (or JSON with ``--json``)."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.archival_eval",
        description="Archival search recall@5 (vector, BM25, hybrid) per embedder.",
    )
    p.add_argument(
        "--embedder",
        choices=[*EMBEDDERS, "both", "all"],
        default="both",
        help="both = hashing and minilm; all adds hashing-plain (default: both)",
    )
    p.add_argument(
        "--dataset",
        choices=[*DATASETS, "all"],
        default="eval",
        help="eval = the shared file (default); dev/heldout = this module's own paraphrases; "
        "keyword = eval passages queried by their two rarest words",
    )
    p.add_argument("--eval-path", type=Path, default=None, help=f"default: {EVAL_PATH}")
    p.add_argument("--distractors", type=int, default=200, help="distractor passages (200)")
    p.add_argument(
        "--json", action="store_true", help="print the full results as JSON instead of a table"
    )
    args = p.parse_args(argv)

    names = {"both": ["hashing", "minilm"], "all": list(EMBEDDERS)}.get(
        args.embedder, [args.embedder]
    )
    datasets = list(DATASETS) if args.dataset == "all" else [args.dataset]
    results: list[dict[str, Any]] = []
    for name in names:
        try:
            emb = make_embedder(name)
        except ImportError as e:
            print(f"skipping {name}: {e}", file=sys.stderr)
            continue
        for dataset in datasets:
            results.append(
                run(
                    name,
                    dataset=dataset,
                    eval_path=args.eval_path,
                    n_distractors=args.distractors,
                    embedder=emb,
                )
            )
    print(json.dumps(results, indent=2) if args.json else _table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
