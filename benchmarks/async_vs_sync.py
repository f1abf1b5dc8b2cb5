"""Asynchronous (hot-load) vs synchronous (strict on-policy) RL, side by side in one run.

The benchmark is :mod:`provrl.bench.async_vs_sync` (its docstring has the method and the options);
this script runs it: ``python benchmarks/async_vs_sync.py --help``.
"""

import sys

from provrl.bench.async_vs_sync import main

if __name__ == "__main__":
    main(sys.argv[1:])
