"""Text helpers for the memory layer: tokens, lexical ranking, token budgets, summaries.

Everything here is pure Python and deterministic, so the offline defaults (the hashing embedder,
keyword ranking, compaction summaries and the core-memory prompt) give the same output on every
machine and in every process.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "STOPWORDS",
    "EstimatingTokenCounter",
    "TokenCounter",
    "bm25_scores",
    "concepts",
    "content_tokens",
    "estimate_tokens",
    "extractive_summary",
    "item_text",
    "rrf",
    "stem",
    "words",
]

_T = TypeVar("_T", bound=Hashable)

# --------------------------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------------------------

_WORD_RE = re.compile(r"[^\W_]+(?:['\u2019-][^\W_]+)*")
_POSSESSIVE_RE = re.compile(r"['\u2019]s$")

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours ourselves out
    over own same she should so some such than that the their theirs them themselves then there
    these they this those through to too under until up very was we were what when where which
    while who whom why will with would you your yours yourself yourselves s t also us may might
    must shall get gets got let lets via per whose whenever wherever
    """.split()
)
"""Common English function words, dropped before lexical matching and hashing."""


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    decomposed = unicodedata.normalize("NFKD", text)
    # Drop accents, then recompose (Hangul syllables and the like come back whole).
    return unicodedata.normalize(
        "NFC", "".join(c for c in decomposed if not unicodedata.combining(c))
    )


def words(text: str) -> list[str]:
    """Split text into lowercase, accent-free words.

    Possessive ``'s`` is dropped and other apostrophes removed (``don't`` → ``dont``). A hyphenated
    compound yields its parts and the joined form (``wi-fi`` → ``wi``, ``fi``, ``wifi``), so both
    spellings of a compound match.

    Args:
        text: Any text.

    Returns:
        The words in order of appearance.
    """
    out: list[str] = []
    for match in _WORD_RE.finditer(_normalise(text)):
        word = _POSSESSIVE_RE.sub("", match.group()).replace("'", "").replace("\u2019", "")
        if "-" in word:
            parts = [p for p in word.split("-") if p]
            out.extend(parts)
            out.append("".join(parts))
        elif word:
            out.append(word)
    return out


_VOWELS = frozenset("aeiouy")


def _has_vowel(word: str) -> bool:
    return any(c in _VOWELS for c in word)


def stem(word: str) -> str:
    """Strip common English suffixes: a light, deterministic stemmer.

    It folds plurals, ``-ing``/``-ed`` (undoubling ``running`` → ``run``), ``-ly``, ``-ness``,
    ``-ment``, ``-ation`` and a final ``e``, so that ``flights``/``flight`` and ``changes``/
    ``changed``/``change`` share a stem. It is deliberately simpler than Porter's: the stems only
    need to agree with each other, not to be words.

    Args:
        word: One lowercase word as produced by :func:`words`.

    Returns:
        The stem (the word itself when it is short or not alphabetic).
    """
    w = word
    if len(w) <= 3 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ingly", "edly", "ing", "ed"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and _has_vowel(w[: -len(suffix)]):
            w = w[: -len(suffix)]
            if w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]
            break
    for suffix, repl, keep in (
        ("ational", "ate", 3),
        ("ization", "ize", 3),
        ("ation", "ate", 3),
        ("ness", "", 3),
        ("ment", "", 4),
        ("ly", "", 4),
    ):
        if w.endswith(suffix) and len(w) - len(suffix) >= keep:
            w = w[: -len(suffix)] + repl
            break
    if w.endswith("e") and len(w) > 3:
        w = w[:-1]
    return w


def content_tokens(text: str) -> list[str]:
    """Words of ``text`` minus :data:`STOPWORDS`, stemmed: the tokens lexical ranking uses.

    Args:
        text: Any text.

    Returns:
        Stemmed content words in order (duplicates kept, for term frequencies).
    """
    return [stem(w) for w in words(text) if w not in STOPWORDS]


# A small, generic English concept table: each line is one group of words that often stand in for
# each other (synonyms, hypernyms, a country with its capital and demonym). It was written by hand
# from general vocabulary, not from any evaluation set; see benchmarks/archival_eval.py for how its
# effect is measured on held-out paraphrases. A word may sit in several groups (``train``).
_CONCEPT_GROUPS = """
money cash funds dollar dollars euro euros currency cents
pay payment payments paid paying payout remittance
refund refunds reimburse reimbursement repay repayment rebate
price prices cost costs fee fees charge charges fare fares rate tariff pricing expensive cheap
bill bills invoice invoices receipt receipts statement
buy buys bought purchase purchases order orders shop shopping acquire
sell sells sold sale sales selling revenue turnover
budget spend spending expense expenses expenditure allowance
salary salaries wage wages payroll income earnings paycheck
tax taxes taxation vat duty customs
bank banking deposit withdrawal
loan loans debt credit mortgage borrow lend
invest investment investor funding capital shares stock
finance financial accounting accountant fiscal bookkeeping
discount coupon voucher deal bargain
card visa mastercard debit
dispute disputes contest complaint complaints complain grievance objection
day days daily
week weeks weekly fortnight
month months monthly
year years yearly annual annually
quarter quarters quarterly
hour hours hourly
minute minutes
second seconds instant moment
morning mornings dawn sunrise forenoon
afternoon afternoons noon midday
evening evenings dusk sunset night nights tonight overnight nightly
weekend weekends saturday saturdays sunday sundays
weekday weekdays monday tuesday wednesday thursday friday
spring summer autumn fall winter season seasons seasonal
january february march april june july august september october november december
holiday holidays vacation vacations leave timeoff dayoff
schedule schedules calendar timetable agenda plan plans planning
deadline deadlines due cutoff
early soon beforehand advance ahead
late delay delays delayed postpone postponed reschedule rescheduled
often frequently regularly repeatedly routinely usually
always every each whenever
never rarely seldom
child children kid kids son sons daughter daughters boy boys girl girls toddler infant baby babies
parent parents mother father mom dad mum mama papa
grandmother grandma granny grandfather grandpa grandparent grandparents elderly
sibling siblings brother brothers sister sisters
wife husband spouse partner
family families relative relatives household
friend friends buddy pal
person people human humans individual someone somebody
woman women lady ladies
man men gentleman guy
teenager teenagers teen teens adolescent youth minor minors
student students pupil pupils learner learners
teacher teachers instructor tutor professor coach trainer
employee employees staff worker workers personnel colleague colleagues coworker hire hires hired
intern interns trainee trainees apprentice junior newcomer
manager managers boss supervisor lead
executive executives ceo cfo cto president chairman director directors leadership management
customer customers client clients buyer buyers shopper consumer user users
neighbor neighbors neighbour neighbours
doctor doctors physician dr medic nurse surgeon dentist
agent agents representative operator assistant
meeting meetings gathering session sessions conference assembly standup
report reports summary summaries digest recap overview briefing
approve approval approved signoff authorize authorization permission consent allow allowed
reject rejected deny denied refuse refused block blocked forbid prohibit ban
rule rules policy policies regulation regulations requirement requirements guideline
contract contracts agreement agreements lease terms
company companies business firm organization enterprise startup corporation employer
office offices workplace headquarters
project projects task tasks ticket tickets issue issues
support helpdesk service assistance help
reply replies respond response responses answer answers
escalate escalation handover transfer forward
deliver delivery deliveries shipping ship shipment shipped courier dispatch
warehouse depot stockroom inventory
package packages parcel parcels box boxes shipment shipments
hire hiring recruit recruiting onboarding
job jobs career employment position role work
sign signature signed
document documents paper papers form forms file files paperwork record records
email emails mail letter letters message messages correspondence inbox
phone phones telephone mobile cellphone smartphone
write writes written writing text
talk speak speech say tell discuss conversation chat
polite courteous formal respectful
computer computers laptop laptops pc desktop notebook
server servers host hosts node nodes instance instances
network networks networking internet online web wifi wireless router
password passwords passcode passphrase pin credential credentials secret secrets
key keys token tokens
account accounts username profile login logins signin
security secure protect protected protection safety safe
encrypt encrypted encryption cipher
firewall port ports traffic
database databases db sql
disk disks storage drive drives ssd
full exhausted capacity space
memory ram cache
backup backups copy copies snapshot snapshots archive
deploy deployment deployments release releases rollout launch
pipeline pipelines build builds
fail fails failed failure failures break breaks broke broken crash crashed error errors outage bug
fix fixed repair repaired repairs patch patched mend
code program programming software script developer developers python java javascript
app apps application applications
website websites site webpage portal
api endpoint request requests call calls
limit limits quota cap maximum threshold
data information info
model models predictor algorithm
train training trained retrain learn learning
cloud cluster clusters container containers
scale scaling grow grows shrink resize
old older outdated legacy ancient obsolete
batch job cron scheduled
log logs logging
update updates upgrade upgrades
flight flights fly flying flew plane planes airplane aircraft airline airlines jet
airport airports terminal gate
trip trips travel travels traveling travelling journey tour
hotel hotels inn motel lodging accommodation
arrive arrives arrived arrival land lands landed checkin
depart departs departure leave leaves left checkout
passport passports visa identification
seat seats seating chair chairs sofa couch bench
train trains rail railway subway metro
bus buses shuttle coach
car cars vehicle vehicles automobile
bike bikes bicycle bicycles cycling cyclist
tire tires tyre tyres wheel wheels
road roads street streets highway avenue
island islands
booking bookings reservation reservations reserve reserved book booked appointment appointments
cancel cancels cancelled canceled cancellation terminate terminated termination
long far distant international
nearby close local
japan japanese tokyo osaka kyoto
korea korean koreans seoul
china chinese beijing shanghai
france french paris
germany german germans berlin munich
britain british england english london uk
america american americans usa washington
italy italian italians rome milan
spain spanish madrid barcelona
canada canadian canadians toronto ottawa vancouver
australia australian sydney melbourne
india indian delhi mumbai
brazil brazilian rio
mexico mexican
russia russian moscow
city cities town towns village villages urban downtown metropolis
port ports harbor harbour
country countries nation national state government federal public
home house houses apartment apartments flat residence
room rooms bedroom kitchen bathroom lounge
cook cooking chef cuisine culinary
garden gardens yard backyard lawn plant plants flower flowers
library libraries book books bookstore
school schools elementary primary kindergarten education class classes lesson lessons course
university universities college campus
hospital hospitals clinic clinics
museum museums gallery galleries exhibition
restaurant restaurants diner eatery cafe bistro
bakery bakeries pastry pastries bread cake cakes baker
store stores shop shops market mall
gym gyms fitness workout exercise
pool pools swimming swim swimmer
food foods meal meals dish dishes eat eating dinner lunch breakfast supper
spicy hot chili pepper
sweet sugary sugar dessert desserts candy treat treats chocolate
drink drinks beverage beverages juice
coffee caffeine espresso latte
tea teas
milk dairy cheese butter cream
vegan vegetarian veggie plantbased
meat beef pork chicken
fish seafood salmon tuna
nut nuts peanut peanuts almond almonds
fruit fruits apple apples banana
allergy allergies allergic
medicine medicines medication medications drug drugs pill pills prescription
sick ill illness disease infection
injury injuries injured hurt wound
pain ache aches
sleep sleeping slept rest nap asleep bedtime insomnia
health healthy wellness
emergency urgent ambulance
vaccine vaccines vaccination immunization shot shots dose doses
weather climate forecast
storm storms thunderstorm thunderstorms thunder lightning hurricane cyclone tornado blizzard
rain raining rainy downpour shower showers flood floods flooding
snow snowing snowy ice icy frozen freeze
heat hot warm heatwave scorching
cold chilly cool
sun sunny solar sunlight sunshine
wind windy breeze
energy power electricity electric electrical
panel panels module modules
water watering irrigation irrigate
tree trees forest woods
animal animals pet pets
cat cats kitten kittens
dog dogs puppy puppies
bird birds
hide hides hiding hid conceal conceals concealed
scared afraid fear fears frightened fearful anxious nervous
music musical song songs
instrument instruments violin viola guitar piano drums strings
play plays playing played
learn learns learned learnt study studies studied studying practice teach teaches taught teaching
sport sports game games match
run runs running runner race races jog jogging
read reads reading
movie movies film films cinema
hobby hobbies pastime
like likes love loves enjoy enjoys prefer prefers preference preferences favorite favourite fond
dislike dislikes hate hates avoid avoids
want wants wish desire
need needs require requires required necessary
big large huge major massive
small little tiny minor
fast quick quickly rapid rapidly speedy express
slow slowly sluggish
new fresh recent latest modern
former previous prior
begin begins began start starts started commence
end ends ended finish finishes finished close closes closed closing stop stops
open opens opened opening
change changes changed switch switched switching replace replaced swap modify alter rotate
move moves moved relocate relocating relocation reschedule rescheduled
keep keeps kept store stores stored retain retention hold
remove removes delete deleted erase purge
increase increases grow rise raise raised expand doubled
decrease decreases reduce reduced lower cut drop
many multiple several numerous various
peak maximum highest top most
minimum lowest least
broken cracked damaged shattered defective faulty
guarantee guaranteed promise promises commitment
tooth teeth dental dentist checkup
printer printers copier copiers print printing toner ink cartridge scanner
floor floors upstairs downstairs storey level
badge badges keycard pass access
video videos recording recorded youtube clip footage
upload uploaded uploading download downloaded post posted publish published
presentation presentations talk talks lecture speech keynote slides
send sends sent submit submits submitted return returned
electronic electronically digital online
walk walks walking walked stroll outside outdoors
party parties celebration celebrations celebrate festival
statistics statistical analysis analyses analytics analyze analyse analyst
border borders customs immigration frontier
notice notices notification notify warning warn alert
elevator elevators lift lifts escalator
again twice double
first 1st initial
one 1 single once
two 2 pair couple
three 3 third
four 4 fourth
five 5 fifth
six 6
seven 7
eight 8
nine 9
ten 10
eleven 11
twelve 12 dozen
fourteen 14
fifteen 15
twenty 20
thirty 30
forty 40
fifty 50
hundred 100
thousand 1000
million millions
"""


def _build_concepts() -> dict[str, tuple[str, ...]]:
    index: dict[str, list[str]] = {}
    for line in _CONCEPT_GROUPS.strip().splitlines():
        members = line.split()
        group = members[0]
        for member in members:
            for token in words(member):
                groups = index.setdefault(stem(token), [])
                if group not in groups:
                    groups.append(group)
    return {key: tuple(value) for key, value in index.items()}


_CONCEPTS = _build_concepts()


def concepts(token: str) -> tuple[str, ...]:
    """Concept groups a stemmed token belongs to, from the built-in generic table.

    Args:
        token: A token from :func:`content_tokens`.

    Returns:
        Group ids (the first word of each group), empty when the token is not in the table.
    """
    return _CONCEPTS.get(token, ())


# --------------------------------------------------------------------------------------------
# Lexical ranking
# --------------------------------------------------------------------------------------------


def bm25_scores(
    query_tokens: Sequence[str],
    docs_tokens: Sequence[Sequence[str]],
    *,
    k1: float = 1.2,
    b: float = 0.75,
    min_coverage: float = 0.0,
) -> list[float]:
    """Okapi BM25 score of every document for a query.

    Uses the Lucene idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``, which is never negative.

    Args:
        query_tokens: Query tokens (e.g. from :func:`content_tokens`); repeats count once.
        docs_tokens: Tokens of each document, in the same tokenisation.
        k1: Term-frequency saturation.
        b: Length normalisation strength (0: none, 1: full).
        min_coverage: Fraction of the distinct query terms a document must contain to score at
            all (0: any one term, as an OR query; 1: every term, as an AND query). Gating keeps
            single incidental word matches out of a hybrid fusion.

    Returns:
        One score per document, in the order given (0.0 when nothing matches).
    """
    n = len(docs_tokens)
    if n == 0:
        return []
    terms = set(query_tokens)
    df: Counter[str] = Counter()
    tfs: list[Counter[str]] = []
    for doc in docs_tokens:
        tf = Counter(t for t in doc if t in terms)
        tfs.append(tf)
        df.update(tf.keys())
    avgdl = sum(len(d) for d in docs_tokens) / n or 1.0
    idf = {t: math.log(1.0 + (n - df[t] + 0.5) / (df[t] + 0.5)) for t in terms}
    scores: list[float] = []
    needed = min_coverage * len(terms)
    for doc, tf in zip(docs_tokens, tfs, strict=True):
        if not tf or len(tf) < needed:
            scores.append(0.0)
            continue
        norm = k1 * (1.0 - b + b * len(doc) / avgdl)
        scores.append(sum(idf[t] * f * (k1 + 1.0) / (f + norm) for t, f in tf.items()))
    return scores


def rrf(
    rankings: Sequence[Sequence[_T]], k: int = 60, *, weights: Sequence[float] | None = None
) -> list[tuple[_T, float]]:
    """Reciprocal rank fusion: merge several rankings into one.

    Each item scores ``sum(weight / (k + rank))`` over the rankings it appears in (rank from 1).
    An item found by two rankings beats one ranked first by a single ranking, so a ranking that
    covers every document (a full vector ranking) should be cut to a candidate depth first, and a
    weaker ranking can be given a lower weight.

    Args:
        rankings: Rankings, best first; an item may be missing from some.
        k: Damping constant; 60 is the value from Cormack et al. (2009).
        weights: One weight per ranking (default: all 1.0).

    Returns:
        ``(item, score)`` pairs, best first; ties keep the order of first appearance.

    Raises:
        ValueError: When ``weights`` and ``rankings`` differ in length.
    """
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[_T, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


# --------------------------------------------------------------------------------------------
# Token budgets
# --------------------------------------------------------------------------------------------

_TOKEN_WORD_RE = re.compile(r"[^\W\d_]+|\d{1,3}")
_WIDE_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
_SYMBOL_RE = re.compile(r"[^\w\s]")


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a text for a model; plug a real tokenizer in here.

    Example, with tiktoken::

        class TiktokenCounter:
            def __init__(self) -> None:
                self._enc = tiktoken.get_encoding("o200k_base")

            def count(self, text: str) -> int:
                return len(self._enc.encode(text))
    """

    def count(self, text: str) -> int:
        """Return the number of tokens in ``text``."""
        ...


def estimate_tokens(text: str) -> int:
    """Estimate the tokens an LLM tokenizer would produce for ``text``, without a tokenizer.

    The estimate is ``max(ceil(chars / 4), floor)``. About four characters per token is the usual
    figure for English prose under BPE tokenizers (OpenAI's rule of thumb). The floor covers text
    that the character rule undercounts: every word, every group of up to three digits, every
    punctuation mark and every CJK/kana/Hangul character is at least one token. Estimates err on
    the high side for code and non-Latin scripts, which is the safe side for a context budget.

    Args:
        text: Any text.

    Returns:
        The estimated token count (0 for an empty string).
    """
    if not text:
        return 0
    wide = len(_WIDE_RE.findall(text))
    narrow = _WIDE_RE.sub(" ", text)
    floor = len(_TOKEN_WORD_RE.findall(narrow)) + len(_SYMBOL_RE.findall(narrow)) + wide
    return max(math.ceil(len(text) / 4), floor)


class EstimatingTokenCounter:
    """The default :class:`TokenCounter`: :func:`estimate_tokens`, no dependencies."""

    def count(self, text: str) -> int:
        """Return :func:`estimate_tokens` of ``text``."""
        return estimate_tokens(text)


# --------------------------------------------------------------------------------------------
# Extractive summary (the default compaction summariser)
# --------------------------------------------------------------------------------------------

_SENTENCE_RE = re.compile(r"[^.!?\n]+(?:[.!?]+|$)", re.MULTILINE)
_SPACE_RE = re.compile(r"\s+")


def item_text(item: Mapping[str, Any]) -> str:
    """Plain text of a session item (message, tool call or tool output).

    Reads ``content`` (a string, or a list of parts with ``text``), else ``output``, else
    ``arguments``; anything else gives an empty string.

    Args:
        item: A JSON-compatible session item.

    Returns:
        The item's text, whitespace as stored.
    """
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        return "\n".join(p for p in parts if isinstance(p, str))
    for key in ("output", "arguments"):
        value = item.get(key)
        if isinstance(value, str):
            return value
    return ""


def _item_role(item: Mapping[str, Any]) -> str:
    role = item.get("role") or item.get("type") or "item"
    return _SPACE_RE.sub(" ", str(role)).strip() or "item"


def extractive_summary(items: Sequence[Mapping[str, Any]], max_chars: int) -> str:
    """Summarise session items by picking their most informative sentences.

    Deterministic and offline: the default summariser for compaction. Sentences are scored by the
    sum of the (stemmed, stopword-free) term frequencies of their distinct words across all items,
    divided by the square root of their length in terms, plus a bonus for an item's first sentence
    (where topics are usually stated). The best sentences are taken greedily while they fit, and
    printed in their original order, one line per item: ``role: sentence sentence``. Exact repeats
    are skipped.

    Args:
        items: Session items (``role``/``content`` messages, tool calls and outputs).
        max_chars: Budget for the result; the result is never longer.

    Returns:
        The summary, or an empty string when nothing fits or there is no text.
    """
    if max_chars <= 0:
        return ""
    sentences: list[tuple[int, int, str, list[str]]] = []  # (item, position, text, terms)
    tf: Counter[str] = Counter()
    roles: list[str] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        roles.append(_item_role(item))
        for pos, match in enumerate(_SENTENCE_RE.finditer(item_text(item))):
            text = _SPACE_RE.sub(" ", match.group()).strip()
            if not text or text.casefold() in seen:
                continue
            seen.add(text.casefold())
            terms = content_tokens(text)
            tf.update(terms)
            sentences.append((i, pos, text, terms))
    if not sentences:
        return ""

    def score(entry: tuple[int, int, str, list[str]]) -> float:
        distinct = set(entry[3])
        base = sum(tf[t] for t in distinct) / math.sqrt(len(distinct) + 1)
        return base * (1.25 if entry[1] == 0 else 1.0)

    ranked = sorted(range(len(sentences)), key=lambda j: (-score(sentences[j]), j))
    chosen: set[int] = set()
    used = 0
    for j in ranked:
        # Adding a sentence costs at least its length plus a separator: skip the render if not.
        if used + len(sentences[j][2]) + (1 if chosen else 0) > max_chars:
            continue
        rendered = len(_render_summary(sentences, roles, chosen | {j}))
        if rendered <= max_chars:
            chosen.add(j)
            used = rendered
    if not chosen:
        # Nothing fits whole: cut the best sentence to the budget.
        owner, _, text, _ = sentences[ranked[0]]
        prefix = f"{roles[owner]}: "
        room = max_chars - len(prefix) - 1
        if room <= 0:
            return ""
        return prefix + text[:room].rstrip() + "\u2026"
    return _render_summary(sentences, roles, chosen)


def _render_summary(
    sentences: Sequence[tuple[int, int, str, list[str]]], roles: Sequence[str], chosen: set[int]
) -> str:
    lines: list[str] = []
    current: int | None = None
    for j in sorted(chosen):
        item, _, text, _ = sentences[j]
        if item != current:
            lines.append(f"{roles[item]}: {text}")
            current = item
        else:
            lines[-1] += " " + text
    return "\n".join(lines)
