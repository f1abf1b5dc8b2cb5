"""The attribution table of issue 34: each way of obtaining the behaviour probability, scored
against the exact recorded q on a run's mixed-version trajectories.

The benchmark is :mod:`provrl.bench.attribution` (its docstring has the method and the options);
this script runs it: ``python benchmarks/attribution.py --help``.
"""

import sys

from provrl.bench.attribution import main

if __name__ == "__main__":
    main(sys.argv[1:])
