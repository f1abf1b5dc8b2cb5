"""`provrl bench search` on a small world: every backend measured, recall sane, JSON shape."""

from __future__ import annotations

import json

from provrl.bench.search import run_search_benchmark


def test_search_benchmark_small(tmp_path, monkeypatch):
    monkeypatch.setenv("PROVRL_CACHE", str(tmp_path))
    r = run_search_benchmark(
        600, repeats=2, tasks=60, rank_bm25_queries=15, peers=("bm25s", "rank_bm25"), progress=False
    )
    json.dumps(r)  # JSON-able
    assert r["docs"] == 600 and r["tasks"] == 60
    assert set(r["backends"]) == {"sqlite", "sqlite_tw1", "bm25s", "rank_bm25"}
    for name, b in r["backends"].items():
        assert b["build_s"] > 0
        for set_name in ("oracle_queries", "questions"):
            lat = b["latency"][set_name]
            assert 0 < lat["p50_ms"] <= lat["p99_ms"] and lat["qps"] > 0
            rec = b["recall@10"][set_name]
            assert 0.0 <= rec <= 1.0, (name, set_name)
    # the oracle's queries find their gold documents (they were verified at k=3)
    assert r["backends"]["sqlite"]["recall@10"]["oracle_queries"] == 1.0
    assert r["backends"]["rank_bm25"]["latency"]["questions"]["queries"] == 15
    assert "bm25s_over_sqlite" in r["ratios"] and r["sqlite_exact_fallbacks"] >= 0
