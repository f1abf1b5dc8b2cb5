"""benchmarks/retrieve_load.py (provrl/bench/retrieve_load.py) end to end on the small world:
a real serve-search process, clean and hostile phases, no errors, every hostile kind answered
within its bounds."""

from __future__ import annotations

import importlib


def test_load_benchmark_runs_with_zero_errors(small_world):
    bench = importlib.import_module("provrl.bench.retrieve_load")
    r = bench.run(small_world, concurrency=4, requests=72, repeats=1, hostile=0.5, progress=False)
    assert r["errors_total"] == 0, r["error_kinds"]
    assert set(r["hostile"]) == set(bench.hostile_bodies(small_world))
    for kind, h in r["hostile"].items():
        assert set(h["status"]) <= {"200", "400", "413", "422"}, (kind, h)
    assert r["hostile"]["query_8.9MB"]["status"] == {"413": r["hostile"]["query_8.9MB"]["n"]}
    assert r["hostile"]["max_terms_common"]["status"].get("200")  # served within its bounds
    assert r["clean"]["clean_p99_ms"] > 0 and r["rss_mb"]["end"] > 0
