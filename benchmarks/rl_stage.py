"""The RL stage's wall time under speed settings, side by side in one run.

The benchmark is :mod:`provrl.bench.rl_stage` (its docstring has the method and the options);
this script runs it: ``python benchmarks/rl_stage.py --help``.
"""

import sys

from provrl.bench.rl_stage import main

if __name__ == "__main__":
    main(sys.argv[1:])
