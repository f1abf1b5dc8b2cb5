"""Size a cluster before renting it: `python benchmarks/simulate.py --json --out results/simulate.json
--plot docs/img/simulate.png`.

A discrete-event simulation of the RL run (agent loops, engine replicas, trainer) predicts
the async / sync wall-time ratio at each concurrency and replica count from the tool-latency
model, episode lengths and step times given as flags (docs/simulate.md). It is
`provrl bench simulate` (provrl/bench/simulate.py).
"""

import typer

from provrl.cli.bench import bench_simulate

if __name__ == "__main__":
    typer.run(bench_simulate)
