"""Why provrl TRPO on Pendulum-v1 varies across seeds (the preset's tuning seeds).

The benchmark is :mod:`provrl.bench.trpo_pendulum_seeds` (its docstring has the method and the options);
this script runs it: ``python benchmarks/trpo_pendulum_seeds.py --help``.
"""

import sys

from provrl.bench.trpo_pendulum_seeds import main

if __name__ == "__main__":
    main(sys.argv[1:])
