"""Issue 36's bound on the RL loop: the loop reads top to bottom; what it does not own lives in
its own module (build, admission, steplog, rl_stats), so the file stays small."""

from __future__ import annotations

from pathlib import Path

import provrl.pipeline.rl_loop as rl_loop


def test_rl_loop_py_stays_at_most_300_lines():
    n = len(Path(rl_loop.__file__).read_text().splitlines())
    assert n <= 300, f"provrl/pipeline/rl_loop.py has {n} lines (bound 300): move a piece out"
