"""The seed's result, reproducibly: `python benchmarks/learning.py --json --seeds 3`.

The default preset with several RL seeds from one warm start, evaluated on the whole test
split and on a second world; prints JSON (per seed, mean, 95 % interval). It is
`provrl bench learning` (provrl/bench/learning.py).
"""

import typer

from provrl.cli.bench import bench_learning

if __name__ == "__main__":
    typer.run(bench_learning)
