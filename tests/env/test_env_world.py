"""World generator: determinism, scale, the facts the documents state, distractors."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from provrl.env.config import WorldConfig
from provrl.env.world import (
    OCCUPATIONS,
    WorldError,
    generate_world,
    iter_corpus,
    save_world,
)


def _corpus_bytes(cfg: WorldConfig, out) -> bytes:
    save_world(generate_world(cfg), out)
    return (out / "corpus.jsonl").read_bytes()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    cfg = WorldConfig(seed=3, entities=200, docs=500)
    a = _corpus_bytes(cfg, tmp_path / "a")
    b = _corpus_bytes(cfg, tmp_path / "b")
    c = _corpus_bytes(cfg.model_copy(update={"seed": 4}), tmp_path / "c")
    assert hashlib.sha256(a).digest() == hashlib.sha256(b).digest()
    assert a != c


def test_document_count_and_unique_names():
    w = generate_world(WorldConfig(seed=1, entities=400, docs=1000))
    assert len(w.docs) == 1000
    assert len({d.doc_id for d in w.docs}) == 1000
    for table in (w.people, w.orgs, w.places, w.works, w.events):
        assert len(set(table.names)) == len(table.names), table.kind
    # no word is both a place name and part of a person's name
    person_words = {x for n in w.people.names for x in n.split()}
    assert not person_words & set(w.places.names)


def test_opening_states_the_main_facts():
    w = generate_world(WorldConfig(seed=2, entities=300, docs=700))
    P = w.people
    for i in range(0, len(P), 7):
        opening = w.doc_of(P, i).paragraphs[0]
        assert P.names[i] in opening
        assert str(int(P["birth_year"][i])) in opening
        assert w.places.names[int(P["birth_place"][i])] in opening
        assert OCCUPATIONS[int(P["occupation"][i])] in opening
        assert w.orgs.names[int(P["employer"][i])] in opening
    Org = w.orgs
    for i in range(len(Org)):
        opening = w.doc_of(Org, i).paragraphs[0]
        assert str(int(Org["founded"][i])) in opening
        assert P.names[int(Org["founder"][i])] in opening
        assert w.places.names[int(Org["hq"][i])] in opening
        # founders were at least 20 when they founded it (or the oldest person available)
        assert Org["founded"][i] - P["birth_year"][int(Org["founder"][i])] >= 20


def test_near_identical_names_and_conflicting_minor_facts():
    cfg = WorldConfig(seed=5, entities=1000, docs=2500, twin_fraction=0.1, conflict_fraction=1.0)
    w = generate_world(cfg)
    # one-vowel variants among people's surnames
    by_first: dict[str, list[str]] = {}
    for n in w.people.names:
        first, last = n.split(" ", 1)
        by_first.setdefault(first, []).append(last)

    def one_off(a: str, b: str) -> bool:
        return len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) == 1

    twins = sum(one_off(a, b) for lasts in by_first.values() for a in lasts for b in lasts if a < b)
    assert twins >= 0.05 * len(w.people)
    # every digest elevation contradicts the place page (conflict_fraction = 1)
    elev = {w.places.names[i]: int(w.places["elevation"][i]) for i in range(len(w.places))}
    checked = 0
    for d in w.docs:
        if d.kind != "digest":
            continue
        for p in d.paragraphs:
            m = re.search(r"this month, (\w+) sits at (\d+) metres", p)
            if m:
                assert int(m.group(2)) != elev[m.group(1)]
                checked += 1
    assert checked > 10


def test_corpus_errors_name_line_and_field(tmp_path):
    save_world(generate_world(WorldConfig(entities=100, docs=200)), tmp_path)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
    lines[4] = lines[4].replace('"title"', '"titel"')
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(WorldError, match=r"corpus\.jsonl:5: field 'title'"):
        list(iter_corpus(tmp_path))


def test_people_types_share():
    w = generate_world(WorldConfig())
    n = np.array([len(w.people), len(w.orgs), len(w.places), len(w.works), len(w.events)])
    assert n.sum() == 2000
    assert len(w.docs) == 5000
