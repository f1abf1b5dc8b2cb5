"""The false-alarm rate of `provrl conformance` on provrl's own engine, over repeated seeds.

The benchmark is :mod:`provrl.bench.conformance` (its docstring has the method and the options);
this script runs it: ``python benchmarks/conformance_false_alarm.py --help``.
"""

import sys

from provrl.bench.conformance import main

if __name__ == "__main__":
    main(sys.argv[1:])
