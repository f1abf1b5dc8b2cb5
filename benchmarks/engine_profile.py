"""Where the rollout engine's time goes on the replayed agent workload (torch.profiler).

The profiler is :mod:`provrl.bench.engine_profile` (its docstring says what is written);
this script runs it::

    .venv/bin/python benchmarks/engine_profile.py --out-dir runs/engine-profile   # SmolLM2, the fixture
    .venv/bin/python benchmarks/engine_profile.py --out-dir runs/engine-profile --threads 2 \
        --out results/engine_profile.json                                     # the record docs quote
    .venv/bin/python benchmarks/engine_profile.py --out-dir /tmp/p --model tiny --episodes 4
"""

import sys

from provrl.bench.engine_profile import main

if __name__ == "__main__":
    main(sys.argv[1:])
