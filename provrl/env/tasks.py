"""Tasks in four tiers, their JSONL schema, and splits disjoint by answer entity.

Tiers (``min_searches`` = searches of the oracle's plan, one per evidence passage):

1. **lookup** — one fact from the opening of one entity's page (1 search: the name).
2. **two-hop** — a fact about an entity named on another entity's page (2 searches).
3. **multi-constraint** (BrowseComp style) — identify the person who satisfies 3–5 clues
   spread over different pages. The entry clue (an award ceremony, a birth city or an
   employer) yields a list of ≥ 2 candidates; only the intersection of all clues is unique.
   The oracle knows which candidate to check (3–4 searches); an agent has to try them.
4. **comparison / aggregation** — compare 2–3 entities and answer with a fact about the
   winner, or combine two numbers (2–3 searches plus arithmetic).

One task per line in ``tasks/{split}.jsonl``::

    {"task_id": "t00042", "split": "dev", "tier": 2, "kind": "employer_hq",
     "question": "...", "answer": "Dunmere", "aliases": ["Dunmere"],
     "answer_entity": "place:17", "evidence": ["d0000123", "d0000456"],
     "min_searches": 2,
     "oracle": [{"query": "Orlan Vesk", "passage": "d0000123#0", "reveals": "Halvex Institute"},
                {"query": "Halvex Institute", "passage": "d0000456#0", "reveals": "Dunmere"}]}

Plain question/answer records ``{"question": ..., "answer": "..." | [...], "id": ...}`` (a
user's own data) are read by :func:`read_task_file` as tier-0 tasks of kind ``plain``
without an oracle plan (docs/data.md).

The split of a task is a hash of ``answer_entity`` (the entity the answer names, or for a
number, the entity it is about), so train / dev / test never share an answer entity.
Answers never occur in their question (checked at generation, tested).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from provrl.env.config import WorldConfig
from provrl.env.rewards import contains_answer
from provrl.env.world import FIELDS, OCCUPATIONS, Table, World, with_article

SPLITS = ("train", "dev", "test")
TIER_NAMES = {1: "lookup", 2: "two-hop", 3: "multi-constraint", 4: "comparison"}


class TaskFileError(ValueError):
    """A task file is malformed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class OracleStep:
    """One search of the oracle's plan."""

    query: str
    """The query (built only from the question and text seen in earlier results)."""
    passage: str
    """Gold passage id ``doc_id#paragraph`` that this search must return."""
    reveals: str
    """What the passage shows that the next step needs (a name, a year, the answer)."""


@dataclass
class Task:
    task_id: str
    split: str
    tier: int
    kind: str
    question: str
    answer: str
    aliases: list[str]
    answer_entity: str
    evidence: list[str]
    min_searches: int
    oracle: list[OracleStep] = field(default_factory=list)

    @property
    def answers(self) -> list[str]:
        return [self.answer, *self.aliases]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- schema
_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "task_id": str,
    "split": str,
    "tier": int,
    "kind": str,
    "question": str,
    "answer": str,
    "aliases": list,
    "answer_entity": str,
    "evidence": list,
    "min_searches": int,
    "oracle": list,
}


MAX_TASK_LINE_BYTES = 1 << 20
"""Longest line of a task file (a task is ~1 KB)."""
MAX_TASKS = 1_000_000
"""Most tasks in one file."""
MAX_TEXT_CHARS = 8192
"""Longest question, answer, alias or other text field of a task."""
MAX_LIST_ITEMS = 64
"""Most aliases, evidence ids or oracle steps of one task."""


def _check_sizes(d: dict[str, Any], where: str) -> None:
    """Every text field ≤ MAX_TEXT_CHARS characters, every list ≤ MAX_LIST_ITEMS items."""
    for key, v in d.items():
        items = v if isinstance(v, list) else [v]
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise TaskFileError(
                f"{where}: field {key!r} has {len(v)} items; at most {MAX_LIST_ITEMS}"
            )
        for x in items:
            texts = x.values() if isinstance(x, dict) else [x]
            if any(isinstance(t, str) and len(t) > MAX_TEXT_CHARS for t in texts):
                raise TaskFileError(
                    f"{where}: field {key!r} is longer than {MAX_TEXT_CHARS} characters"
                )


def task_from_json(d: Any, where: str) -> Task:
    """Validate one decoded line; errors name ``where`` (``file:line``) and the field."""
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key, typ in _SCHEMA.items():
        if key not in d:
            raise TaskFileError(f"{where}: field {key!r} is missing")
        v = d[key]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise TaskFileError(
                f"{where}: field {key!r} must be {getattr(typ, '__name__', typ)}, "
                f"got {type(v).__name__} {v!r}"
            )
    unknown = set(d) - set(_SCHEMA)
    if unknown:
        raise TaskFileError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    _check_sizes(d, where)
    if d["split"] not in SPLITS:
        raise TaskFileError(f"{where}: field 'split' must be one of {SPLITS}, got {d['split']!r}")
    if d["tier"] not in TIER_NAMES:
        raise TaskFileError(f"{where}: field 'tier' must be 1-4, got {d['tier']!r}")
    if not d["question"].strip() or not d["answer"].strip():
        raise TaskFileError(
            f"{where}: field {'question' if not d['question'].strip() else 'answer'!r} is empty"
        )
    for key in ("aliases", "evidence"):
        if not all(isinstance(x, str) for x in d[key]):
            raise TaskFileError(f"{where}: field {key!r} must be a list of strings")
    steps = []
    for j, s in enumerate(d["oracle"]):
        if not isinstance(s, dict) or set(s) != {"query", "passage", "reveals"}:
            raise TaskFileError(
                f"{where}: field 'oracle[{j}]' must be an object with query, passage, reveals"
            )
        if not all(isinstance(s[k], str) for k in s):
            raise TaskFileError(f"{where}: field 'oracle[{j}]' values must be strings")
        steps.append(OracleStep(**s))
    if d["min_searches"] != len(steps):
        raise TaskFileError(
            f"{where}: field 'min_searches' is {d['min_searches']} but the oracle plan has "
            f"{len(steps)} searches"
        )
    return Task(**{**d, "oracle": steps})


def load_tasks(path: str | os.PathLike[str], *, split: str | None = None) -> list[Task]:
    """Read a task JSONL file. Malformed input raises :class:`TaskFileError` with line and
    field; blank lines are skipped. With ``split``, every task must belong to it (a train
    task in ``test.jsonl`` is an error, not a leak). Bounded: :data:`MAX_TASK_LINE_BYTES`
    per line, :data:`MAX_TASKS` per file, :data:`MAX_TEXT_CHARS` per text field,
    :data:`MAX_LIST_ITEMS` per list field."""
    p = Path(path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, d in _task_records(p):
        where = f"{p}:{lineno}"
        t = task_from_json(d, where)
        if split is not None and t.split != split:
            raise TaskFileError(
                f"{where}: field 'split' is {t.split!r} but {p.name} holds the {split!r} split"
            )
        if t.task_id in seen:
            raise TaskFileError(
                f"{where}: field 'task_id' {t.task_id!r} repeats line {seen[t.task_id]}"
            )
        seen[t.task_id] = lineno
        tasks.append(t)
    return tasks


def _task_records(p: Path) -> Iterator[tuple[int, Any]]:
    """The decoded lines of a task file, within the task-file bounds."""
    from provrl.env.jsonl import iter_records

    return iter_records(
        p, TaskFileError, "task file", max_line_bytes=MAX_TASK_LINE_BYTES, max_records=MAX_TASKS
    )


# ----------------------------------------------------------------------------- plain QA
PLAIN_KIND = "plain"
"""``Task.kind`` of a task read from a plain question/answer record (tier 0, no oracle)."""
PLAIN_ANSWER_KEYS = ("answer", "answers", "golden_answers")
"""Where a plain record may keep its answer(s): provrl's ``answer``, or the ``answers`` /
``golden_answers`` lists of QA datasets as Search-R1 and FlashRAG ship them."""


def plain_task_from_json(d: Any, where: str, lineno: int, split: str) -> Task:
    """A task from a plain record ``{"question": str, "answer": str | [str, ...], "id"?}``:
    the first answer is the reference, the rest are aliases (exact match accepts any).
    Other fields are ignored; errors name ``where`` and the field."""
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    q = d.get("question")
    if not isinstance(q, str) or not q.strip():
        got = "missing" if q is None else f"{type(q).__name__} {q!r}"[:80]
        raise TaskFileError(f"{where}: field 'question' must be a non-empty string, got {got}")
    key = next((k for k in PLAIN_ANSWER_KEYS if k in d), None)
    if key is None:
        raise TaskFileError(
            f"{where}: field 'answer' is missing (a string or a list of strings; "
            f"'answers' and 'golden_answers' are read too)"
        )
    raw = d[key]
    _check_sizes({"question": q, key: raw}, where)  # other fields are ignored, so not capped
    answers = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(answers, list)
        or not answers
        or not all(isinstance(a, str) and a.strip() for a in answers)
    ):
        raise TaskFileError(
            f"{where}: field {key!r} must be a non-empty string or a non-empty list of "
            f"non-empty strings, got {str(raw)[:80]!r}"
        )
    tid = d.get("id", d.get("task_id", f"q{lineno:06d}"))
    if not isinstance(tid, str | int) or isinstance(tid, bool):
        raise TaskFileError(f"{where}: field 'id' must be a string or an integer, got {tid!r}")
    return Task(
        task_id=str(tid),
        split=split,
        tier=0,
        kind=PLAIN_KIND,
        question=q.strip(),
        answer=answers[0],
        aliases=list(answers[1:]),
        answer_entity="",
        evidence=[],
        min_searches=0,
    )


def read_task_file(path: str | os.PathLike[str], split: str = "test") -> list[Task]:
    """Tasks from a JSONL file in either format, decided per file by its first record:
    provrl's own task records (``task_id``, ``tier``, ``oracle``, …: :func:`load_tasks`) or
    plain QA records (:func:`plain_task_from_json`, given ``split``). Blank lines are
    skipped; a malformed line raises :class:`TaskFileError` naming file, line and field;
    repeated ids are refused."""
    p = Path(path)
    records = list(_task_records(p))
    if not records:
        raise TaskFileError(f"{p}: no tasks (the file is empty)")
    first = records[0][1]
    if isinstance(first, dict) and "oracle" in first and "task_id" in first:
        return load_tasks(p)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, d in records:
        t = plain_task_from_json(d, f"{p}:{lineno}", lineno, split)
        if t.task_id in seen:
            raise TaskFileError(
                f"{p}:{lineno}: field 'id' {t.task_id!r} repeats line {seen[t.task_id]}"
            )
        seen[t.task_id] = lineno
        tasks.append(t)
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        for t in tasks:
            f.write(orjson.dumps(t.to_json()) + b"\n")
    tmp.replace(p)


def split_of(answer_entity: str, seed: int, fractions: tuple[float, float, float]) -> str:
    """Deterministic split of an answer entity: a hash in [0, 1) against the cumulative
    fractions."""
    h = hashlib.sha256(f"{seed}:{answer_entity}".encode()).digest()
    u = int.from_bytes(h[:8], "big") / 2**64
    total = sum(fractions)
    acc = 0.0
    for name, frac in zip(SPLITS, fractions, strict=True):
        acc += frac / total
        if u < acc:
            return name
    return SPLITS[-1]


# ----------------------------------------------------------------------------- generators
Fact = Callable[[int], tuple[str, ...]]
"""Row → (answer, answer entity, *aliases)."""


def _year(x: Any) -> str:
    return str(int(x))


@dataclass
class _Draft:
    kind: str
    question: str
    answer: str
    answer_entity: str
    steps: list[OracleStep]
    aliases: list[str] = field(default_factory=list)


class _Gen:
    """Task drafts from a world (each method returns a draft or None if it does not fit)."""

    def __init__(self, world: World, rng: np.random.Generator) -> None:
        self.w = world
        self.rng = rng
        P = world.people
        self.bp_region = world.places["region"][P["birth_place"]]
        self.emp_founded = world.orgs["founded"][P["employer"]]
        self.emp_field = world.orgs["field"][P["employer"]]
        self.born_count = np.bincount(P["birth_place"], minlength=len(world.places))
        self.staff_count = np.bincount(P["employer"], minlength=len(world.orgs))
        self.lookups = self._lookups()
        self.two_hops = self._two_hops()

    # small helpers -------------------------------------------------------------
    def _pick(self, n: int) -> int:
        return int(self.rng.integers(n))

    def _step(self, table: Any, i: int, reveals: str, query: str | None = None) -> OracleStep:
        return OracleStep(query or table.names[i], self.w.opening(table, i), reveals)

    # tier 1 ---------------------------------------------------------------------
    def _ref(self, table: Table, j: Any) -> tuple[str, str]:
        """(name, entity id) of row ``j`` of ``table``: an answer that names an entity."""
        return table.names[int(j)], table.entity_id(int(j))

    def _region(self, g: Any) -> tuple[str, str, str]:
        """A region as an answer: (name, entity id, alias "<name> region")."""
        name = self.w.regions[int(g)]
        return name, f"region:{int(g)}", f"{name} region"

    def _lookups(self) -> list[tuple[Table, str, str, Fact]]:
        """Tier-1 kinds: (table asked about, kind, question on its name, fact of row i)."""
        w, ref, year = self.w, self._ref, _year
        P, Org, C, W, E = w.people, w.orgs, w.places, w.works, w.events
        return [
            (P, "birth_year", "In what year was {} born?", lambda i: (year(P["birth_year"][i]), P.entity_id(i))),
            (P, "birth_place", "In which city was {} born?", lambda i: ref(C, P["birth_place"][i])),
            (P, "occupation", "What is the occupation of {}?", lambda i: (OCCUPATIONS[int(P["occupation"][i])], P.entity_id(i))),
            (P, "employer", "Which organisation does {} work at?", lambda i: ref(Org, P["employer"][i])),
            (Org, "org_founded", "In what year was the {} founded?", lambda i: (year(Org["founded"][i]), Org.entity_id(i))),
            (Org, "org_founder", "Who founded the {}?", lambda i: ref(P, Org["founder"][i])),
            (Org, "org_hq", "In which city is the {} headquartered?", lambda i: ref(C, Org["hq"][i])),
            (Org, "org_field", "In which field does the {} work?", lambda i: (FIELDS[int(Org["field"][i])], Org.entity_id(i))),
            (C, "place_region", "In which region is the city of {}?", lambda i: self._region(C["region"][i])),
            (C, "place_founded", "In what year was the city of {} founded?", lambda i: (year(C["founded"][i]), C.entity_id(i))),
            (W, "work_creator", "Who created {}?", lambda i: ref(P, W["creator"][i])),
            (W, "work_year", "In what year was {} released?", lambda i: (year(W["year"][i]), W.entity_id(i))),
            (E, "event_location", "In which city was the {} held?", lambda i: ref(C, E["location"][i])),
            (E, "event_year", "In what year was the {} held?", lambda i: (year(E["year"][i]), E.entity_id(i))),
        ]  # fmt: skip

    def lookup(self) -> _Draft | None:
        table, kind, question, fact = self.lookups[self._pick(len(self.lookups))]
        i = self._pick(len(table))
        answer, entity, *aliases = fact(i)
        return _Draft(
            kind,
            question.format(table.names[i]),
            answer,
            entity,
            [self._step(table, i, answer)],
            aliases,
        )

    # tier 2 ---------------------------------------------------------------------
    def _two_hops(self) -> list[tuple[Table, str, Table, str, str, Fact]]:
        """Tier-2 kinds: (table asked about, column naming the linked row, linked table, kind,
        question on the first name, fact of the linked row j)."""
        w, ref, year = self.w, self._ref, _year
        P, Org, C, W, E = w.people, w.orgs, w.places, w.works, w.events
        return [
            (P, "employer", Org, "employer_hq", "In which city is the organisation that {} works at headquartered?", lambda j: ref(C, Org["hq"][j])),
            (P, "employer", Org, "employer_founded", "In what year was the organisation that {} works at founded?", lambda j: (year(Org["founded"][j]), Org.entity_id(j))),
            (P, "employer", Org, "employer_founder", "Who founded the organisation that {} works at?", lambda j: ref(P, Org["founder"][j])),
            (P, "birth_place", C, "birthplace_region", "In which region is the city where {} was born?", lambda j: self._region(C["region"][j])),
            (P, "birth_place", C, "birthplace_founded", "In what year was the city where {} was born founded?", lambda j: (year(C["founded"][j]), C.entity_id(j))),
            (W, "creator", P, "creator_birth_year", "In what year was the creator of {} born?", lambda j: (year(P["birth_year"][j]), P.entity_id(j))),
            (W, "creator", P, "creator_birthplace", "In which city was the creator of {} born?", lambda j: ref(C, P["birth_place"][j])),
            (W, "publisher", Org, "publisher_hq", "In which city is the organisation that released {} headquartered?", lambda j: ref(C, Org["hq"][j])),
            (E, "organiser", Org, "organiser_founder", "Who founded the organisation that organised the {}?", lambda j: ref(P, Org["founder"][j])),
            (E, "location", C, "event_region", "In which region is the city where the {} was held?", lambda j: self._region(C["region"][j])),
            (Org, "founder", P, "founder_birthplace", "In which city was the founder of the {} born?", lambda j: ref(C, P["birth_place"][j])),
        ]  # fmt: skip

    def two_hop(self) -> _Draft | None:
        t1, col, t2, kind, question, fact = self.two_hops[self._pick(len(self.two_hops))]
        i = self._pick(len(t1))
        j = int(t1[col][i])
        answer, entity, *aliases = fact(j)
        if entity == t1.entity_id(i):  # "who founded the organisation that X works at?" → X
            return None
        steps = [self._step(t1, i, t2.names[j]), self._step(t2, j, answer)]
        return _Draft(kind, question.format(t1.names[i]), answer, entity, steps, aliases)

    # tier 3 ---------------------------------------------------------------------
    def multi_constraint(self) -> _Draft | None:
        w = self.w
        P, Org, C = w.people, w.orgs, w.places
        i = self._pick(len(P))
        entries = ["birth_city", "employer"] + (["award"] if P["award"][i] >= 0 else [])
        entry = entries[self._pick(len(entries))]
        c, o = int(P["birth_place"][i]), int(P["employer"][i])
        name = P.names[i]
        if entry == "award":
            a, y = int(P["award"][i]), int(P["award_year"][i])
            mask = (P["award"] == a) & (P["award_year"] == y)
            clue = f"They received the {w.awards[a]} in {y}."
            entry_step = OracleStep(
                f"{y} {w.awards[a]}", w.docs[int(w.ceremony_doc[i])].passage_id(0), name
            )
        elif entry == "birth_city":
            if self.born_count[c] > 3 * 8:
                return None
            mask = P["birth_place"] == c
            clue = f"They were born in {C.names[c]}."
            entry_step = OracleStep(
                f"notable people born in {C.names[c]} include",
                w.doc_of(C, c).passage_id(int(w.born_list_para[i])),
                name,
            )
        else:
            if self.staff_count[o] > 3 * 8:
                return None
            mask = P["employer"] == o
            clue = f"They work at the {Org.names[o]}."
            entry_step = OracleStep(
                f"employees of the {Org.names[o]} include",
                w.doc_of(Org, o).passage_id(int(w.staff_list_para[i])),
                name,
            )
        if mask.sum() < 2:
            return None
        by, occ = int(P["birth_year"][i]), int(P["occupation"][i])
        local = {
            "decade": (
                P["birth_year"] // 10 == by // 10,
                f"They were born in the {by // 10 * 10}s.",
            ),
            "occupation": (
                P["occupation"] == occ,
                f"They work as {with_article(OCCUPATIONS[occ])}.",
            ),
        }
        hops: dict[str, tuple[np.ndarray, str]] = {}
        if entry != "employer":
            hops["employer_founded"] = (
                self.emp_founded == self.emp_founded[i],
                f"They work at an organisation founded in {int(self.emp_founded[i])}.",
            )
            hops["employer_field"] = (
                self.emp_field == self.emp_field[i],
                f"They work at {with_article(FIELDS[int(self.emp_field[i])])} organisation.",
            )
        if entry != "birth_city":
            g = int(self.bp_region[i])
            hops["birth_region"] = (
                self.bp_region == g,
                f"They were born in a city in the {w.regions[g]} region.",
            )
        hop_names = list(hops)
        first_hop = hop_names[self._pick(len(hop_names))]
        rest = [k for k in [*local, *hop_names] if k != first_hop]
        order = [first_hop] + [rest[j] for j in self.rng.permutation(len(rest))]
        chosen: list[str] = []
        for key in order[:4]:
            m, _ = local.get(key) or hops[key]
            chosen.append(key)
            mask = mask & m
            if mask.sum() == 1 and len(chosen) >= 2:
                break
        if mask.sum() != 1 or not mask[i]:
            return None
        clues = [clue] + [(local.get(k) or hops[k])[1] for k in chosen]
        clues = [clues[j] for j in self.rng.permutation(len(clues))]
        uses_org = "employer_founded" in chosen or "employer_field" in chosen
        # the person's opening names both the employer and the birth city
        steps = [entry_step, self._step(P, i, Org.names[o] if uses_org else C.names[c])]
        if uses_org:
            reveals = (
                str(int(Org["founded"][o]))
                if "employer_founded" in chosen
                else FIELDS[int(Org["field"][o])]
            )
            steps.append(self._step(Org, o, reveals))
        if "birth_region" in chosen:
            steps.append(self._step(C, c, w.regions[int(C["region"][c])]))
        q = (
            "Find the person who matches every clue. "
            + " ".join(clues)
            + " Answer with their full name."
        )
        return _Draft(f"identify_{entry}", q, name, P.entity_id(i), steps)

    # tier 4 ---------------------------------------------------------------------
    def comparison(self) -> _Draft | None:
        w, r = self.w, self._pick(4)
        P, Org, C = w.people, w.orgs, w.places
        if r == 0:
            ids = self.rng.choice(len(P), 3, replace=False)
            years = P["birth_year"][ids]
            places = P["birth_place"][ids]
            if len(set(years.tolist())) < 3 or len(set(places.tolist())) < 3:
                return None
            first = int(ids[int(np.argmin(years))])
            c = int(P["birth_place"][first])
            names = [P.names[int(j)] for j in ids]
            q = (
                f"Of {names[0]}, {names[1]} and {names[2]}, who was born first? "
                "Answer with the city where that person was born."
            )
            steps = [self._step(P, int(j), str(int(P["birth_year"][j]))) for j in ids]
            return _Draft("oldest_birthplace", q, C.names[c], C.entity_id(c), steps)
        if r == 1:
            ids = self.rng.choice(len(Org), 2, replace=False)
            f, h = Org["founded"][ids], Org["hq"][ids]
            if f[0] == f[1] or h[0] == h[1]:
                return None
            first = int(ids[int(np.argmin(f))])
            c = int(Org["hq"][first])
            q = (
                f"Which was founded first, the {Org.names[int(ids[0])]} or the {Org.names[int(ids[1])]}? "
                "Answer with the city where it is headquartered."
            )
            steps = [self._step(Org, int(j), str(int(Org["founded"][j]))) for j in ids]
            return _Draft("earliest_org_hq", q, C.names[c], C.entity_id(c), steps)
        if r == 2:
            ids = self.rng.choice(len(P), 2, replace=False)
            y = P["birth_year"][ids]
            if y[0] == y[1]:
                return None
            q = f"How many years apart were {P.names[int(ids[0])]} and {P.names[int(ids[1])]} born?"
            steps = [self._step(P, int(j), str(int(P["birth_year"][j]))) for j in ids]
            return _Draft(
                "birth_gap", q, str(abs(int(y[0]) - int(y[1]))), P.entity_id(int(ids[0])), steps
            )
        ids = self.rng.choice(len(C), 2, replace=False)
        pops = [int(C["population"][j]) for j in ids]
        total = sum(pops)
        q = f"What is the combined population of {C.names[int(ids[0])]} and {C.names[int(ids[1])]}?"
        steps = [self._step(C, int(j), f"{p:,}") for j, p in zip(ids, pops, strict=True)]
        return _Draft(
            "population_sum", q, f"{total:,}", C.entity_id(int(ids[0])), steps, [str(total)]
        )


def generate_tasks(world: World, cfg: WorldConfig | None = None) -> list[Task]:
    """``cfg.tasks`` tasks with tiers drawn from ``cfg.tier_mix`` (deterministic)."""
    cfg = cfg or world.config
    rng = np.random.default_rng([cfg.seed, 1])
    gen = _Gen(world, rng)
    makers: dict[int, Callable[[], _Draft | None]] = {
        1: gen.lookup,
        2: gen.two_hop,
        3: gen.multi_constraint,
        4: gen.comparison,
    }
    mix = np.asarray(cfg.tier_mix, dtype=float)
    tiers = rng.choice(np.arange(1, 5), size=cfg.tasks, p=mix / mix.sum())
    tasks: list[Task] = []
    seen: set[str] = set()
    for tier in tiers.tolist():
        for _attempt in range(200):
            d = makers[tier]()
            if d is None or d.question in seen:
                continue
            if contains_answer(d.question, [d.answer, *d.aliases]):
                continue
            seen.add(d.question)
            evidence = list(dict.fromkeys(s.passage.split("#")[0] for s in d.steps))
            tasks.append(
                Task(
                    task_id=f"t{len(tasks):06d}",
                    split=split_of(d.answer_entity, cfg.seed, cfg.split_fractions),
                    tier=tier,
                    kind=d.kind,
                    question=d.question,
                    answer=d.answer,
                    aliases=[a for a in d.aliases if a != d.answer],
                    answer_entity=d.answer_entity,
                    evidence=evidence,
                    min_searches=len(d.steps),
                    oracle=d.steps,
                )
            )
            break
    return tasks
