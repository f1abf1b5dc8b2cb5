"""Warm-start spread: does SFT on oracle traces give tier 1 a spread of K?

The benchmark is :mod:`provrl.bench.warmstart_spread` (its docstring has the method and the options);
this script runs it: ``python benchmarks/warmstart_spread.py --help``.
"""

import sys

from provrl.bench.warmstart_spread import main

if __name__ == "__main__":
    main(sys.argv[1:])
