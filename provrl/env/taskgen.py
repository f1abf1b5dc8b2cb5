"""Task generators: four tiers of questions drawn from a world, each with the oracle's plan.

:func:`generate_tasks` draws ``cfg.tasks`` tiers from ``cfg.tier_mix`` and asks the tier's
generator for a draft until one fits (a new question whose answer it does not contain);
the draft's oracle steps (query → passage → what it reveals) become the task's ``oracle``
and ``evidence``, its answer entity's hash its split (:func:`split_of`). The tiers and the
task schema are described in :mod:`provrl.env.tasks`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from provrl.env.config import WorldConfig
from provrl.env.rewards import contains_answer
from provrl.env.tasks import SPLITS, OracleStep, Task
from provrl.env.world import FIELDS, OCCUPATIONS, Table, World, with_article


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
