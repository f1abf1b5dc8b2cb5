"""A seeded fictional world rendered into documents (nothing here can be known without search).

Entities and their facts::

    place   region, founded, population, elevation*
    org     field, founded, headquarters → place, founder → person, employees*
    person  birth_year, birth_place → place, occupation, employer → org, award, award_year,
            first work → work, hobby*
    work    kind, genre, year, creator → person, publisher → org, stars*
    event   kind, year, location → place, organiser → org, attendance*

(* = *minor* facts: never asked by a task, and contradicted on purpose by news digests.)

Documents (one passage = one paragraph; a search hit is a passage):

* one page per entity; its first paragraph (the *opening*) states the entity's main facts
  and is the passage indexed with the page title, so a search for the name ranks the
  opening first (title + text match; the page's other paragraphs say "it" or "she");
* list paragraphs: people born in a place (on the place's page), people who work at an
  organisation (on its page), recipients of an award in a year (one page per ceremony);
* news digests: paragraphs about random entities with minor facts, half of them
  contradicting the entity's page, many about near-identical names.

Distractors: ``twin_fraction`` of people / organisations have a one-vowel variant of another
entity's name (``Orlan Vesk`` / ``Orlan Vask``, ``Halvex Institute`` / ``Halvox Institute``).

Generation is vectorised (NumPy draws, grouping by ``argsort``) and linear in the number of
documents: 1,000,000 documents take well under a minute.

Why one module of ~700 lines: :func:`generate_world` is one pass whose sequence of NumPy
draws *is* the world — the same config gives the same bytes, and cached worlds are keyed by
a hash of the config (``provrl.env.build.world_key``), so reordering a single draw silently
changes every world. Kept in one readable top-to-bottom function, next to the renderers it
calls, a change to the draw order is visible in one diff.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.env.config import WorldConfig
from provrl.env.names import PLACE_SUFFIXES, NameSpace, variant

FORMAT_VERSION = 1


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


OCCUPATIONS = _words(
    "cartographer glassblower violinist botanist archivist clockmaker geologist translator "
    "architect beekeeper chemist sculptor astronomer librarian cellist potter surveyor "
    "linguist engineer photographer pharmacist weaver playwright historian mathematician "
    "ornithologist economist locksmith jeweller typographer navigator composer archaeologist "
    "volcanologist bookbinder lighthouse-keeper puppeteer perfumer falconer"
)
FIELDS = _words(
    "shipping astronomy textiles publishing mining brewing aviation robotics forestry "
    "insurance cartography acoustics ceramics banking medicine printing railways fisheries "
    "optics horticulture glassmaking telegraphy meteorology salt-making"
)
ORG_KINDS = _words(
    "Institute Foundation Works Company Guild Society Observatory Press Collective "
    "Laboratories Trust Academy"
)
GENRES = _words(
    "mystery historical satirical romantic pastoral gothic comic tragic epic experimental "
    "nautical political"
)
WORK_KINDS = _words("novel film album play opera poetry-collection")
EVENT_KINDS = _words(
    "festival summit regatta conference fair exhibition marathon congress tournament carnival"
)
HOBBIES = _words(
    "chess rowing falconry origami fencing beekeeping kite-flying birdwatching archery "
    "sailing calligraphy cycling juggling gardening astronomy knitting bouldering "
    "mushroom-hunting curling"
)
AWARD_NOUNS = _words("Medal Prize Award Cup Laurel Ribbon")
TITLE_ADJ = _words(
    "Amber Silent Crimson Hollow Distant Broken Golden Quiet Iron Pale Hidden Last Winter "
    "Burning Glass Salt Velvet Northern Bitter Lonely Paper Copper Frozen Wandering Scarlet "
    "Sunken Endless Gentle Restless Shattered Ivory Silver Ashen Drowned Emerald Midnight "
    "Painted Borrowed Forgotten"
)
TITLE_NOUN = _words(
    "Lantern Orchard Harbour Compass Meridian Archive Bell Garden Tide Mirror Staircase "
    "Kingdom Ledger Lighthouse Vineyard Canal Sparrow Ferry Tower Atlas Cathedral Furnace "
    "River Market Chorus Window Citadel Orchestra Labyrinth Clocktower Lagoon Monument "
    "Observatory Almanac Caravan Carousel Cipher Glacier Quarry Pavilion"
)
PRONOUNS = (("she", "her"), ("he", "his"))

# Shares of entity types (person, org, place, work, event).
TYPE_SHARES = (0.5, 0.15, 0.08, 0.17, 0.10)
LIST_CHUNK = 8  # at most this many names per list paragraph (lists are split evenly)


class WorldError(ValueError):
    """A world directory is missing files or holds something unreadable."""


@dataclass
class Document:
    """One document: a title and paragraphs (each paragraph is one searchable passage)."""

    doc_id: str
    title: str
    kind: str
    paragraphs: list[str]

    def passage_id(self, j: int) -> str:
        return f"{self.doc_id}#{j}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.doc_id,
            "title": self.title,
            "kind": self.kind,
            "paragraphs": self.paragraphs,
        }


@dataclass
class Table:
    """One entity type: names, integer-coded attributes, and the index of its page."""

    kind: str
    names: list[str]
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    doc: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, col: str) -> np.ndarray:
        return self.cols[col]

    def entity_id(self, i: int) -> str:
        return f"{self.kind}:{i}"


@dataclass
class World:
    """Entity tables, the documents, and where list facts live (for task evidence)."""

    config: WorldConfig
    regions: list[str]
    awards: list[str]
    places: Table
    orgs: Table
    people: Table
    works: Table
    events: Table
    docs: list[Document]
    born_list_para: np.ndarray
    """person → paragraph of their birth place's page that lists them."""
    staff_list_para: np.ndarray
    """person → paragraph of their employer's page that lists them."""
    ceremony_doc: np.ndarray
    """person → document of the ceremony where they received their award (−1: none)."""

    def doc_of(self, table: Table, i: int) -> Document:
        return self.docs[int(table.doc[i])]

    def opening(self, table: Table, i: int) -> str:
        """Passage id of the opening paragraph of entity ``i``'s page."""
        return self.doc_of(table, i).passage_id(0)


# ----------------------------------------------------------------------------- helpers
def _fmt_int(x: int) -> str:
    return f"{int(x):,}"


def _join_names(names: list[str]) -> str:
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _even_chunks(members: np.ndarray) -> list[np.ndarray]:
    """Split a list into ⌈n / LIST_CHUNK⌉ parts whose sizes differ by at most one (so a list
    of n ≥ 2 names never leaves a name alone in its paragraph)."""
    if len(members) == 0:
        return []
    return np.array_split(members, -(-len(members) // LIST_CHUNK))


def _add_lists(
    paras: list[str], lead: str, members: np.ndarray, names: list[str], para_of: np.ndarray
) -> None:
    """Append list paragraphs ``lead`` + names of ``members`` (even chunks) to ``paras``, and
    record in ``para_of`` which paragraph lists each member."""
    for chunk in _even_chunks(members):
        para_of[chunk] = len(paras)
        paras.append(f"{lead} {_join_names([names[int(p)] for p in chunk])}.")


def with_article(word: str) -> str:
    """``word`` with its indefinite article (``an astronomer``, ``a botanist``)."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def _groups(keys: np.ndarray, n_groups: int) -> list[np.ndarray]:
    """Indices with key g, for each g in range(n_groups) (stable order, O(n log n))."""
    order = np.argsort(keys, kind="stable")
    bounds = np.searchsorted(keys[order], np.arange(n_groups + 1))
    return [order[bounds[g] : bounds[g + 1]] for g in range(n_groups)]


def type_counts(entities: int) -> tuple[int, int, int, int, int]:
    """(people, orgs, places, works, events) for ``entities`` entities."""
    shares = np.array(TYPE_SHARES)
    raw = np.maximum(np.floor(shares * entities).astype(int), [10, 4, 4, 2, 2])
    raw[0] += max(0, entities - int(raw.sum()))
    return int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]), int(raw[4])


# ----------------------------------------------------------------------------- generation
def generate_world(cfg: WorldConfig) -> World:
    """Build the world for ``cfg`` (deterministic in ``cfg``)."""
    rng = np.random.default_rng(cfg.seed)
    ns = NameSpace(rng)
    n_people, n_orgs, n_places, n_works, n_events = type_counts(cfg.entities)
    n_regions = max(6, n_places // 12)
    n_awards = max(6, n_people // 60)

    # --- names
    regions = ns.words(n_regions)
    place_names = ns.words(n_places, suffixes=tuple(PLACE_SUFFIXES))
    awards_root = ns.words(n_awards)
    awards = [
        f"{r} {AWARD_NOUNS[int(k)]}"
        for r, k in zip(awards_root, rng.integers(0, len(AWARD_NOUNS), n_awards), strict=True)
    ]
    org_kind = rng.integers(0, len(ORG_KINDS), n_orgs)
    org_root = ns.words(n_orgs)
    org_names = _twin_orgs(org_root, org_kind, cfg.twin_fraction, rng, ns)
    person_names = _person_names(n_people, cfg.twin_fraction, rng, ns)
    work_titles = _work_titles(n_works, rng, ns)
    event_kind = rng.integers(0, len(EVENT_KINDS), n_events)
    event_names = [
        f"{r} {EVENT_KINDS[int(k)].capitalize()}"
        for r, k in zip(ns.words(n_events), event_kind, strict=True)
    ]

    # --- attributes (all vectorised draws)
    places = Table(
        "place",
        place_names,
        {
            "region": rng.integers(0, n_regions, n_places),
            "founded": rng.integers(800, 1900, n_places),
            "population": np.clip(np.exp(rng.normal(10.3, 1.1, n_places)), 800, 4e6).astype(
                np.int64
            ),
            "elevation": rng.integers(2, 2400, n_places),
        },
    )
    birth_year = rng.integers(1930, 2003, n_people)
    has_award = rng.random(n_people) < cfg.award_fraction
    award = np.where(has_award, rng.integers(0, n_awards, n_people), -1)
    # award year uniform in [birth + 20, 2024]
    span = 2024 - (birth_year + 20) + 1
    award_year = np.where(
        has_award, birth_year + 20 + (rng.random(n_people) * span).astype(np.int64), -1
    )
    people = Table(
        "person",
        person_names,
        {
            "pronoun": rng.integers(0, len(PRONOUNS), n_people),
            "birth_year": birth_year,
            "birth_place": rng.integers(0, n_places, n_people),
            "occupation": rng.integers(0, len(OCCUPATIONS), n_people),
            "employer": rng.integers(0, n_orgs, n_people),
            "hobby": rng.integers(0, len(HOBBIES), n_people),
            "award": award,
            "award_year": award_year,
        },
    )
    # founders are at least 20 years old when they found the organisation
    org_founded = rng.integers(1952, 2025, n_orgs)
    founder = _older_than(birth_year, org_founded - 20, rng)
    orgs = Table(
        "org",
        org_names,
        {
            "kind": org_kind,
            "field": rng.integers(0, len(FIELDS), n_orgs),
            "founder": founder,
            "founded": org_founded,
            "hq": rng.integers(0, n_places, n_orgs),
            "employees": np.exp(rng.normal(5.5, 1.2, n_orgs)).astype(np.int64) + 5,
        },
    )
    work_year = rng.integers(1950, 2025, n_works)
    creator = _older_than(birth_year, work_year - 18, rng)
    works = Table(
        "work",
        work_titles,
        {
            "kind": rng.integers(0, len(WORK_KINDS), n_works),
            "genre": rng.integers(0, len(GENRES), n_works),
            "creator": creator,
            "year": work_year,
            "publisher": rng.integers(0, n_orgs, n_works),
            "stars": rng.integers(1, 6, n_works),
        },
    )
    first_work = np.full(n_people, n_works, np.int64)
    np.minimum.at(first_work, creator, np.arange(n_works))
    people.cols["first_work"] = np.where(first_work == n_works, -1, first_work)
    organiser = rng.integers(0, n_orgs, n_events)
    ev_from = np.maximum(orgs["founded"][organiser], 1950)
    events = Table(
        "event",
        event_names,
        {
            "kind": event_kind,
            "organiser": organiser,
            "location": rng.integers(0, n_places, n_events),
            "year": ev_from + (rng.random(n_events) * (2025 - ev_from)).astype(np.int64),
            "attendance": (np.exp(rng.normal(7.5, 1.0, n_events))).astype(np.int64) + 20,
        },
    )

    # --- documents
    docs: list[Document] = []
    born_list_para = np.zeros(n_people, np.int64)
    staff_list_para = np.zeros(n_people, np.int64)
    ceremony_doc = np.full(n_people, -1, np.int64)

    def new_doc(title: str, kind: str, paragraphs: list[str]) -> int:
        docs.append(Document(f"d{len(docs):07d}", title, kind, paragraphs))
        return len(docs) - 1

    born_groups = _groups(people["birth_place"], n_places)
    places.doc = np.zeros(n_places, np.int64)
    for i in range(n_places):
        name = place_names[i]
        paras = [
            f"{name} is a city in the {regions[int(places['region'][i])]} region, founded in "
            f"{int(places['founded'][i])}. It has a population of "
            f"{_fmt_int(places['population'][i])}.",
            f"It lies at an elevation of {int(places['elevation'][i])} metres.",
        ]
        _add_lists(
            paras,
            f"Notable people born in {name} include",
            born_groups[i],
            person_names,
            born_list_para,
        )
        places.doc[i] = new_doc(name, "place", paras)

    staff_groups = _groups(people["employer"], n_orgs)
    orgs.doc = np.zeros(n_orgs, np.int64)
    for i in range(n_orgs):
        name = org_names[i]
        paras = [
            f"The {name} is {with_article(FIELDS[int(orgs['field'][i])])} organisation founded in "
            f"{int(orgs['founded'][i])} by {person_names[int(orgs['founder'][i])]}. It is "
            f"headquartered in {place_names[int(orgs['hq'][i])]}.",
            f"It employs about {_fmt_int(orgs['employees'][i])} people.",
        ]
        _add_lists(
            paras,
            f"Employees of the {name} include",
            staff_groups[i],
            person_names,
            staff_list_para,
        )
        orgs.doc[i] = new_doc(name, "org", paras)

    people.doc = np.zeros(n_people, np.int64)
    variants = rng.integers(0, 2, n_people)
    for i in range(n_people):
        name = person_names[i]
        she = PRONOUNS[int(people["pronoun"][i])][0]
        by, bp = int(birth_year[i]), place_names[int(people["birth_place"][i])]
        occ = OCCUPATIONS[int(people["occupation"][i])]
        org = org_names[int(people["employer"][i])]
        if variants[i] == 0:
            opening = f"{name} (born {by} in {bp}) is {with_article(occ)} who works at the {org}."
        else:
            opening = f"{name} is {with_article(occ)} at the {org}. {she.capitalize()} was born in {bp} in {by}."
        paras = [opening]
        second = []
        if award[i] >= 0:
            second.append(f"In {int(award_year[i])}, {she} received the {awards[int(award[i])]}.")
        w = int(people["first_work"][i])
        if w >= 0:
            second.append(
                f"{she.capitalize()} created {work_titles[w]}, {with_article(GENRES[int(works['genre'][w])])} "
                f"{WORK_KINDS[int(works['kind'][w])]}."
            )
        if second:
            paras.append(" ".join(second))
        paras.append(f"Outside work, {she} enjoys {HOBBIES[int(people['hobby'][i])]}.")
        people.doc[i] = new_doc(name, "person", paras)

    works.doc = np.zeros(n_works, np.int64)
    for i in range(n_works):
        title = work_titles[i]
        paras = [
            f"{title} is {with_article(GENRES[int(works['genre'][i])])} {WORK_KINDS[int(works['kind'][i])]} "
            f"by {person_names[int(creator[i])]}, released in {int(works['year'][i])} by the "
            f"{org_names[int(works['publisher'][i])]}.",
            f"Critics gave it {int(works['stars'][i])} stars out of five.",
        ]
        works.doc[i] = new_doc(title, "work", paras)

    events.doc = np.zeros(n_events, np.int64)
    for i in range(n_events):
        name = event_names[i]
        paras = [
            f"The {name} was {with_article(EVENT_KINDS[int(event_kind[i])])} held in "
            f"{place_names[int(events['location'][i])]} in {int(events['year'][i])}, organised "
            f"by the {org_names[int(organiser[i])]}.",
            f"About {_fmt_int(events['attendance'][i])} people attended.",
        ]
        events.doc[i] = new_doc(name, "event", paras)

    # award ceremonies: one page per (award, year) with recipients
    winners = np.flatnonzero(award >= 0)
    if len(winners):
        key = award[winners] * 10_000 + award_year[winners]
        order = np.argsort(key, kind="stable")
        keys_sorted = key[order]
        starts = np.flatnonzero(np.r_[True, keys_sorted[1:] != keys_sorted[:-1]])
        ends = np.r_[starts[1:], len(order)]
        venue = rng.integers(0, n_places, len(starts))
        for s, e, v in zip(starts, ends, venue, strict=True):
            group = winners[order[s:e]]
            a, y = int(award[group[0]]), int(award_year[group[0]])
            title = f"{y} {awards[a]}"
            paras = [
                f"The {y} {awards[a]} was presented to "
                f"{_join_names([person_names[int(p)] for p in group])}.",
                f"The ceremony was held in {place_names[int(v)]}.",
            ]
            ceremony_doc[group] = new_doc(title, "award", paras)

    _add_digests(docs, cfg, rng, places, orgs, people, works, events)
    return World(
        cfg,
        regions,
        awards,
        places,
        orgs,
        people,
        works,
        events,
        docs,
        born_list_para,
        staff_list_para,
        ceremony_doc,
    )


def _older_than(birth_year: np.ndarray, latest: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each bound, a random person born in or before it (vectorised)."""
    order = np.argsort(birth_year, kind="stable")
    eligible = np.searchsorted(birth_year[order], latest, side="right")
    eligible = np.maximum(eligible, 1)  # the oldest person if nobody is old enough
    return order[(rng.random(len(latest)) * eligible).astype(np.int64)]


def _person_names(
    n: int, twin_fraction: float, rng: np.random.Generator, ns: NameSpace
) -> list[str]:
    firsts = ns.words(max(60, n // 25))
    lasts = ns.words(max(120, n // 2))
    last_set = set(lasts)
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < n:
        m = n - len(names) + 16
        fi = rng.integers(0, len(firsts), m)
        li = rng.integers(0, len(lasts), m)
        for f, la in zip(fi, li, strict=True):
            s = f"{firsts[int(f)]} {lasts[int(la)]}"
            if s not in seen:
                seen.add(s)
                names.append(s)
                if len(names) == n:
                    break
    n_twins = int(twin_fraction * n)
    if n_twins:
        idx = rng.permutation(n)
        twins, sources = idx[:n_twins], idx[n_twins : 2 * n_twins]
        for t, s in zip(twins, sources, strict=True):
            first, last = names[int(s)].split(" ", 1)
            for _ in range(8):
                cand = variant(last, rng)
                full = f"{first} {cand}"
                if full not in seen and (cand in last_set or ns.claim(cand)):
                    last_set.add(cand)
                    seen.discard(names[int(t)])
                    seen.add(full)
                    names[int(t)] = full
                    break
    return names


def _twin_orgs(
    roots: list[str],
    kinds: np.ndarray,
    twin_fraction: float,
    rng: np.random.Generator,
    ns: NameSpace,
) -> list[str]:
    roots = list(roots)
    n = len(roots)
    n_twins = int(twin_fraction * n)
    if n_twins:
        idx = rng.permutation(n)
        for t, s in zip(idx[:n_twins], idx[n_twins : 2 * n_twins], strict=True):
            for _ in range(8):
                cand = variant(roots[int(s)], rng)
                if ns.claim(cand):
                    roots[int(t)] = cand
                    kinds[int(t)] = kinds[int(s)]
                    break
    return [f"{r} {ORG_KINDS[int(k)]}" for r, k in zip(roots, kinds, strict=True)]


def _work_titles(n: int, rng: np.random.Generator, ns: NameSpace) -> list[str]:
    titles: list[str] = []
    seen: set[str] = set()
    n_plain = len(TITLE_ADJ) * len(TITLE_NOUN) // 3
    while len(titles) < n:
        m = n - len(titles) + 16
        adj = rng.integers(0, len(TITLE_ADJ), m)
        noun = rng.integers(0, len(TITLE_NOUN), m)
        roots = ns.words(m) if len(titles) + m > n_plain else [""] * m
        for a, b, r in zip(adj, noun, roots, strict=True):
            t = f"The {TITLE_ADJ[int(a)]} {TITLE_NOUN[int(b)]}"
            if len(seen) >= n_plain:
                t = f"{t} of {r}"
            if t not in seen:
                seen.add(t)
                titles.append(t)
                if len(titles) == n:
                    break
    return titles


def _add_digests(
    docs: list[Document],
    cfg: WorldConfig,
    rng: np.random.Generator,
    places: Table,
    orgs: Table,
    people: Table,
    works: Table,
    events: Table,
) -> None:
    """Fill the corpus up to ``cfg.docs`` with news digests of minor (often wrong) facts."""
    n = max(0, cfg.docs - len(docs))
    if n == 0:
        return
    per = 3
    m = n * per
    which = rng.integers(0, 5, m)
    pick = rng.random(m)
    conflict = rng.random(m) < cfg.conflict_fraction
    jitter = rng.uniform(0.55, 0.9, m) * np.where(rng.random(m) < 0.5, 1, -1) + 1.0
    alt_hobby = rng.integers(1, len(HOBBIES), m)
    alt_stars = rng.integers(1, 5, m)
    paras: list[str] = []
    for j in range(m):
        w, c = int(which[j]), bool(conflict[j])
        if w == 0:
            i = int(pick[j] * len(places))
            e = int(places["elevation"][i])
            e = max(1, int(e * jitter[j])) if c else e
            paras.append(
                f"According to a regional survey published this month, {places.names[i]} sits "
                f"at {e} metres above sea level, a figure local officials have not confirmed."
            )
        elif w == 1:
            i = int(pick[j] * len(orgs))
            k = int(orgs["employees"][i])
            k = max(2, int(k * jitter[j])) if c else k
            paras.append(
                f"In its most recent annual filing, the {orgs.names[i]} reported a staff of "
                f"{_fmt_int(k)}, although the figure was disputed by several former members."
            )
        elif w == 2:
            i = int(pick[j] * len(people))
            h = int(people["hobby"][i])
            h = (h + int(alt_hobby[j])) % len(HOBBIES) if c else h
            paras.append(
                f"Readers wrote in to say that {people.names[i]} was spotted at a {HOBBIES[h]} "
                "club meeting on the weekend, chatting with other members about the season."
            )
        elif w == 3:
            i = int(pick[j] * len(works))
            s = int(works["stars"][i])
            s = (s - 1 + int(alt_stars[j])) % 5 + 1 if c else s
            paras.append(
                f"Writing in the weekend supplement, a reviewer gave {works.names[i]} {s} stars "
                "and called it one of the more talked-about releases of its year."
            )
        else:
            i = int(pick[j] * len(events))
            a = int(events["attendance"][i])
            a = max(5, int(a * jitter[j])) if c else a
            paras.append(
                f"Organisers said that {_fmt_int(a)} people came to the {events.names[i]}, "
                "though independent observers at the venue gave a rather different estimate."
            )
    for d in range(n):
        docs.append(
            Document(
                f"d{len(docs):07d}",
                f"Regional digest no. {d + 1}",
                "digest",
                paras[d * per : (d + 1) * per],
            )
        )


# ----------------------------------------------------------------------------- disk
CORPUS_FILE = "corpus.jsonl"
WORLD_FILE = "world.json"


def corpus_lines(docs: list[Document]) -> Iterator[bytes]:
    for d in docs:
        yield orjson.dumps(d.to_json()) + b"\n"


def save_world(world: World, out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Write ``corpus.jsonl`` (one document per line) and ``world.json`` (settings, counts,
    corpus sha256). Written to temporary names and renamed, so a crash leaves no half file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    tmp = out / (CORPUS_FILE + ".tmp")
    with open(tmp, "wb") as f:
        for line in corpus_lines(world.docs):
            h.update(line)
            f.write(line)
    tmp.replace(out / CORPUS_FILE)
    info = {
        "format": FORMAT_VERSION,
        "config": world.config.model_dump(mode="json"),
        "counts": {
            "docs": len(world.docs),
            "passages": sum(len(d.paragraphs) for d in world.docs),
            "people": len(world.people),
            "orgs": len(world.orgs),
            "places": len(world.places),
            "works": len(world.works),
            "events": len(world.events),
            "regions": len(world.regions),
            "awards": len(world.awards),
        },
        "corpus_sha256": h.hexdigest(),
    }
    (out / (WORLD_FILE + ".tmp")).write_text(json.dumps(info, indent=2, sort_keys=True))
    (out / (WORLD_FILE + ".tmp")).replace(out / WORLD_FILE)
    return info


def read_world_info(world_dir: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(world_dir) / WORLD_FILE
    if not p.is_file():
        raise WorldError(f"{p}: no world here (run `provrl world --out {world_dir}`)")
    try:
        info: dict[str, Any] = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise WorldError(f"{p}:{e.lineno}: invalid JSON ({e.msg})") from e
    return info


def iter_corpus(world_dir: str | os.PathLike[str]) -> Iterator[Document]:
    """Stream the documents of a saved world; a bad line raises naming file, line, field."""
    path = Path(world_dir) / CORPUS_FILE
    if not path.is_file():
        raise WorldError(f"{path}: no corpus (run `provrl world --out {world_dir}`)")
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise WorldError(f"{path}:{lineno}: invalid JSON ({e})") from e
            for key, typ in (("id", str), ("title", str), ("kind", str), ("paragraphs", list)):
                if not isinstance(d.get(key), typ):
                    raise WorldError(
                        f"{path}:{lineno}: field {key!r} missing or not {typ.__name__}"
                    )
            yield Document(d["id"], d["title"], d["kind"], d["paragraphs"])
