"""One RL step standalone vs a TRL-style step: `python benchmarks/trainer.py --json`.

Tokens/s, peak RSS with its breakdown, FLOP/s against the bf16 matmul rate measured in the
same run, and the lag-0 trainer-engine mismatch; prints JSON. It is `provrl bench trainer`
(provrl/bench/trainer.py).
"""

import typer

from provrl.cli.bench import bench_trainer

if __name__ == "__main__":
    typer.run(bench_trainer)
