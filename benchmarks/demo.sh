#!/usr/bin/env bash
# `make demo` on this checkout, end to end and timed (wall clock and peak RSS by
# /usr/bin/time -v, setup included), written as a results file (provrl/bench/demo.py).
# Run it on a fresh clone for the figure README and docs/pipeline.md quote:
#   git clone . /tmp/fresh && cd /tmp/fresh && benchmarks/demo.sh results/demo.json
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-results/demo.json}"
mkdir -p runs
/usr/bin/time -v -o runs/demo.time make demo 2>&1 | tee runs/demo.log
.venv/bin/python -m provrl.bench.demo --time-log runs/demo.time --run runs/default --out "$out"
