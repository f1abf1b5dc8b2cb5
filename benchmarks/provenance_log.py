"""Trajectory-log throughput: `python benchmarks/provenance_log.py --json`.

Writes and reads 10,000 trajectories of 2,000 tokens in provrl's format and the
alternatives (JSONL number lists, Arrow IPC) side by side; prints JSON.
"""

from __future__ import annotations

import argparse
import json

from provrl.bench_log import run_log_benchmark


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trajectories", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print JSON only")
    args = ap.parse_args()
    result = run_log_benchmark(args.trajectories, args.tokens, repeats=args.repeats)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
