"""`provrl bench search` on a small world: every backend measured, recall sane, JSON shape."""

from __future__ import annotations

import json

from provrl.bench.search import run_search_benchmark
from provrl.env import sqlite_index


def test_search_benchmark_small(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVRL_CACHE", str(tmp_path))
    monkeypatch.setattr(sqlite_index, "COMMON_DF", 100)  # a small world has common terms too
    r = run_search_benchmark(
        600, repeats=2, tasks=60, rank_bm25_queries=15, peers=("bm25s", "rank_bm25"), progress=False
    )
    json.dumps(r)  # JSON-able
    assert r["docs"] == 600 and r["tasks"] == 60
    assert set(r["backends"]) == {"sqlite", "sqlite_tw1", "bm25s", "rank_bm25"}
    for name, b in r["backends"].items():
        assert b["build_s"] > 0
        for set_name in ("oracle_queries", "questions"):
            for temp in ("cold", "warm"):
                lat = b["latency"][set_name][temp]
                assert 0 < lat["p50_ms"] <= lat["p99_ms"] and lat["qps"] > 0
                assert len(b["latency"][set_name]["raw"][temp]) == 2  # one pass per round
            rec = b["recall@10"][set_name]
            assert 0.0 <= rec <= 1.0, (name, set_name)
    # cold passes start with SQLite's ranking cache empty, warm ones find every template in it
    misses = r["sqlite_common_cache_misses"]
    assert len(misses["cold"]) == 2 and min(misses["cold"]) > 0 and misses["warm"] == [0, 0]
    # the headline ratios are the cold ones
    sq, peer = r["backends"]["sqlite"]["latency"], r["backends"]["bm25s"]["latency"]
    cold = r["ratios"]["bm25s_over_sqlite"]["questions"]["p50"]
    assert cold == round(peer["questions"]["cold"]["p50_ms"] / sq["questions"]["cold"]["p50_ms"], 2)
    assert "bm25s_over_sqlite" in r["ratios_warm"]
    # the oracle's queries find their gold documents (they were verified at k=3)
    assert r["backends"]["sqlite"]["recall@10"]["oracle_queries"] == 1.0
    assert r["backends"]["rank_bm25"]["latency"]["questions"]["queries"] == 15
    assert "bm25s_over_sqlite" in r["ratios"] and r["sqlite_exact_fallbacks"] >= 0
