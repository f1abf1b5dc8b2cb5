"""`/retrieve` under load, clean and with hostile requests mixed in, side by side in one run.

The benchmark is :mod:`provrl.bench.retrieve_load` (its docstring has the method and the options);
this script runs it: ``python benchmarks/retrieve_load.py --help``.
"""

import sys

from provrl.bench.retrieve_load import main

if __name__ == "__main__":
    main(sys.argv[1:])
