"""What giving KV pages back to the OS saves: the engine's resident memory on a long replay.

The benchmark is :mod:`provrl.bench.kv_memory` (its docstring has the method); this script
runs it: ``python benchmarks/kv_memory.py --json --out results/kv_memory.json``.
"""

import sys

from provrl.bench.kv_memory import main

if __name__ == "__main__":
    main(sys.argv[1:])
