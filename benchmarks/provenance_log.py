"""Trajectory-log throughput: `python benchmarks/provenance_log.py --json`.

Writes and reads 10,000 trajectories of 2,000 tokens in provrl's format and the
alternatives (JSONL number lists, Arrow IPC) side by side; prints JSON. It is `provrl bench
log` (provrl/bench/log.py).
"""

import typer

from provrl.cli.bench import bench_log

if __name__ == "__main__":
    typer.run(bench_log)
