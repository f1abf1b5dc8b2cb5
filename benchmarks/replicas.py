"""One in-process engine vs engine replicas as Ray actors, side by side in one run.

The benchmark is :mod:`provrl.bench.replicas` (its docstring has the method and the options);
this script runs it: ``python benchmarks/replicas.py --help``.
"""

import sys

from provrl.bench.replicas import main

if __name__ == "__main__":
    main(sys.argv[1:])
