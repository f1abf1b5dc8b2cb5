"""Search backends side by side: `python benchmarks/search.py --docs 100000 --json`.

Builds (or reuses) a world of --docs documents, then measures SQLite FTS5 BM25 (provrl's
embedded default) and the peer BM25 libraries bm25s and rank_bm25 on the same passages and
the same queries in the same run: index build time, query latency p50/p99, queries/s, and
recall@10 of the gold evidence documents. Same as `provrl bench search`.
"""

from __future__ import annotations

import argparse
import json

from provrl.env.bench import run_search_benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--peers", default="bm25s,rank_bm25")
    ap.add_argument("--rank-bm25-queries", type=int, default=100)
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args()
    result = run_search_benchmark(
        args.docs,
        seed=args.seed,
        k=args.k,
        repeats=args.repeats,
        tasks=args.tasks,
        peers=tuple(p for p in args.peers.split(",") if p),
        rank_bm25_queries=args.rank_bm25_queries,
        progress=not args.json,
    )
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
