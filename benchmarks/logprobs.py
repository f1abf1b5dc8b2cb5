"""The trainer's chunked logprobs vs the full log-softmax: `python benchmarks/logprobs.py --json`.

Time and peak memory of forward + backward (and of the no-grad proximal pass) on the same
batch, side by side; prints JSON. It is `provrl bench logprobs` (provrl/bench/logprobs.py).
"""

import typer

from provrl.cli.bench import bench_logprobs

if __name__ == "__main__":
    typer.run(bench_logprobs)
