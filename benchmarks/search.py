"""Search backends side by side: `python benchmarks/search.py --docs 100000 --json`.

Builds (or reuses) a world of --docs documents, then measures SQLite FTS5 BM25 (provrl's
embedded default) and the peer BM25 libraries bm25s and rank_bm25 on the same passages and
the same queries in the same run: index build time, query latency p50/p99, queries/s, and
recall@10 of the gold evidence documents. It is `provrl bench search` (provrl/bench/search.py).
"""

import typer

from provrl.cli.bench import bench_search

if __name__ == "__main__":
    typer.run(bench_search)
