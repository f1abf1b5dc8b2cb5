"""bfloat16 against float32 on this CPU: matmul, the RL trainer step, the engine replay.

The benchmark is :mod:`provrl.bench.dtype` (its docstring has the method); this script runs
it: ``python benchmarks/dtype.py --json --out results/dtype_cpu.json``.
"""

import sys

from provrl.bench.dtype import main

if __name__ == "__main__":
    main(sys.argv[1:])
