"""SQLite FTS5 BM25 backend: exact pruned ranking, caching on disk, open, threads."""

from __future__ import annotations

import math
import os
import random
import threading

import pytest

from provrl.env import sqlite_index
from provrl.env.build import load_split
from provrl.env.search import query_terms
from provrl.env.sqlite_index import SqliteSearch, cached_index


def _queries(world_dir) -> list[str]:
    tasks = load_split(world_dir, "train")
    qs = [s.query for t in tasks for s in t.oracle] + [t.question for t in tasks]
    rng = random.Random(0)
    words = " ".join(qs).split()
    # messy model-like queries: random word salads with common words
    qs += [" ".join(rng.sample(words, rng.randint(1, 6))) for _ in range(150)]
    return qs


@pytest.mark.parametrize("k", [1, 3, 10])
def test_pruned_ranking_equals_plain_fts5(small_world, monkeypatch, k):
    """The two-step ranking (rare terms in FTS5, common terms in Python) returns exactly
    FTS5's own BM25 top-k — same passages, same scores."""
    monkeypatch.setattr(sqlite_index, "COMMON_DF", 40)  # many common terms in a small index
    path = small_world / "index-test-common40.sqlite"
    if not path.exists():
        sqlite_index.build_index(sqlite_index.iter_corpus(small_world), path, corpus_sha256="test")
    s = SqliteSearch(path)
    assert len(s.common) > 30
    mixed = 0
    for q in _queries(small_world):
        terms = query_terms(q)
        if not terms:
            continue
        fast = s.ranked(q, k)
        exact = s._fts(terms, k)
        assert [round(r[3], 9) for r in fast] == [round(r[3], 9) for r in exact], q
        # equal scores may swap order; the sets of (rowid, score) agree up to ties
        top = {r[0] for r in exact}
        assert all(r[0] in top or math.isclose(r[3], exact[-1][3]) for r in fast), q
        mixed += any(t in s.common for t in terms) and any(t not in s.common for t in terms)
    assert mixed > 100
    s.close()


def test_python_bm25_matches_fts5_on_single_terms(small_search):
    """IDF and the tf part computed in Python equal FTS5's bm25() for common terms."""
    for term in list(small_search.common)[:10]:
        rows = small_search._fts([term], 5)
        part = small_search._common_part(rows, [term])
        for r, p in zip(rows, part, strict=True):
            assert math.isclose(r[3], p, rel_tol=1e-9), term


def test_name_search_returns_the_opening_first(small_world, small_search):
    tasks = [t for t in load_split(small_world, "train") if t.tier == 1]
    for t in tasks:
        hits = small_search.search(t.oracle[0].query, 3)
        assert hits[0].passage_id == t.oracle[0].passage, t.question


def test_search_edge_cases_and_open(small_search):
    assert small_search.search("", 3) == []
    assert small_search.search("the of and", 3) == []  # only stopwords
    assert small_search.search('"quotes" AND OR NOT ( * ^', 3) is not None  # no FTS5 syntax leaks
    assert small_search.search("zzzqqqxxx", 3) == []
    hits = small_search.search("born", 5)
    assert len(hits) == 5 and hits == sorted(hits, key=lambda h: -h.score)
    text = small_search.open(hits[0].doc_id)
    assert text is not None and text.startswith(hits[0].title)
    assert small_search.open("d9999999") is None


def test_index_is_cached_on_disk(small_world):
    p1 = cached_index(small_world)
    m = os.stat(p1).st_mtime_ns
    p2 = cached_index(small_world)
    assert p1 == p2 and os.stat(p2).st_mtime_ns == m


def test_concurrent_searches_agree(small_search, small_world):
    qs = _queries(small_world)[:200]
    want = [small_search.search(q, 3) for q in qs]
    got: dict[int, list] = {}

    def work(j: int) -> None:
        got[j] = [small_search.search(q, 3) for q in qs]

    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(v == want for v in got.values())


def test_connections_of_exited_threads_are_closed(small_world):
    """A server's worker pool recycles threads; every connection used to stay open (with
    its page cache), so RSS grew without bound under steady load."""
    import threading

    from provrl.env.sqlite_index import SqliteSearch, cached_index

    s = SqliteSearch(cached_index(small_world))
    for _ in range(30):
        th = threading.Thread(target=s.search, args=("people born in the city", 3))
        th.start()
        th.join()
    assert s.num_connections <= 2  # this thread's and the last worker's
    s.close()
    assert s.num_connections == 0
