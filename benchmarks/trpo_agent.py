"""TRPO vs clipped GRPO on the asynchronous agent as max_lag grows (issue 35 item 5).

The benchmark is :mod:`provrl.bench.trpo_agent` (its docstring has the method and the options);
this script runs it: ``python benchmarks/trpo_agent.py --help``.
"""

import sys

from provrl.bench.trpo_agent import main

if __name__ == "__main__":
    main(sys.argv[1:])
