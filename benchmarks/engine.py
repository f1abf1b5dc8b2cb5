"""Rollout-engine benchmark: provrl's LocalEngine vs HF generate, same process, interleaved.

    .venv/bin/python benchmarks/engine.py --json
    .venv/bin/python benchmarks/engine.py --model tiny --concurrency 8 --new-tokens 16 --json

Same options as ``provrl bench engine`` (it is that command); prints one JSON object.
"""

import typer

from provrl.cli.bench import bench_engine

if __name__ == "__main__":
    typer.run(bench_engine)
