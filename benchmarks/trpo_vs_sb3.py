"""provrl TRPO vs sb3-contrib TRPO on classic control.

The benchmark is :mod:`provrl.bench.trpo_vs_sb3` (its docstring has the method and the options);
this script runs it: ``python benchmarks/trpo_vs_sb3.py --help``.
"""

import sys

from provrl.bench.trpo_vs_sb3 import main

if __name__ == "__main__":
    main(sys.argv[1:])
