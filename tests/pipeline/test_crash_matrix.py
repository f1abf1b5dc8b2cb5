"""Kill and resume at every window between two durable writes of the RL stage, and at a torn
tail of each of its logs, each checked by the independent checker (``runcheck.py``).

The windows are the failpoints of ``provrl/pipeline/rl_loop.py`` (its module docstring draws
them) and of the collector. Nothing here depends on timing: every kill is a failpoint
(``PROVRL_FAILPOINT``, SIGKILL at an exact place) and every wait is for a process to exit,
so the matrix passes on a loaded machine.

* ``test_kill_at_every_window_then_finish_each`` (``ci``, in ``make test``): one run,
  killed at each window in turn — every resume is the next window's run — with a torn tail
  cut into each log on the way, checked after every kill and at the end. At each window the
  killed run is also **forked** (copied) and the fork resumed to the end with no further
  kill: each window's recovery — and each torn log's — runs to a finished run on its own.
  The forks resume in a second process beside the chain (every process pays the same
  start-up, so sharing the chain's kills is what keeps this in ``make test``'s budget).
  **Exact resume** (issue 38): the finished chain and every finished fork equal a
  reference — the same base run to the end with no kill, one more process in the forks'
  lane — in their step records, what each step trained, their curriculum (pools,
  transitions, every task's posterior and groups) and the whole run's counts
  (:func:`runcompare.differences` says what is compared and why the clock's fields, the
  order within a batch and the last ulps of the importance statistics are not).

  Why the reference is reproducible: every sample's seed is a function of its id (task,
  round, sample), the curriculum picks tasks in a seeded order, and in this configuration
  (async, ``max_lag`` 1, G = 2, ``concurrency`` 8) admission lets a group start only
  after the step before it was hot-loaded (:meth:`Admission.settled` frees its slots in
  ``finish_step``, whose hot-load precedes the next start), and its ≤ 4 × 24 tokens are
  sampled before the next step has trained and saved its checkpoint — so each sample
  carries one version, the one its group started under. Two uninterrupted runs write the
  same trajectories, token for token, and the same step records but for the clock's
  fields and float noise. What is left to timing is the order in which one batch's groups
  complete (compared as sets) and log their first samples (a group killed before its
  first keeps its start number: ``Curriculum.lost``) and the race a rollout would have to lose against a whole
  step (train, checkpoint, hot-load) to change a version stamp or miss the last step;
  should a loaded machine ever make a rollout that slow, the failure names the field
  (``lag_histogram``, ``finished_groups``). The quick preset's tiny model scores every sample
  the same (−0.5, malformed), so its GRPO advantages — and updates — are 0: the
  comparison checks the bookkeeping of a resume, not that of a learning run's weights
  (the damaged-checkpoint test of ``test_rl_loop.py`` checks a redone step's weights).
* ``test_kill_at_one_window_then_resume`` and ``test_torn_tail_of_each_log_then_resume``
  (slow, ``make test-all``): each window and each torn log from a fresh copy of the base
  run, killed in the second step — the same recoveries without the chain's history before
  them, at twice the processes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from crashrun import RUN, STEPS, copy_of, finish, killed, tear
from runcheck import check_run
from runcompare import differences

WINDOWS = [
    "rl.trained",  # the update exists only in memory
    "rl.ckpt.weights",  # weights and optimizer saved, no state.json
    "rl.ckpt.state",  # state.json and the step records in the checkpoint, no COMPLETE
    "rl.ckpt.complete",  # committed; the step's record only in the checkpoint
    "rl.ckpt.pruned",  # the older checkpoint pruned; record not yet in steps.jsonl
    "rl.recorded",  # steps.jsonl has it; the metrics row not yet
    "rl.saved",  # recorded everywhere; not yet hot-loaded
    "engine.hotload",  # inside the engine's hot-load
    "rl.hotloaded",  # hot-loaded
    "collector.written",  # a trajectory appended mid-rollout
]
TEARS = {
    "rl.ckpt.complete": "trajectories.jsonl",  # torn before the next resume
    "rl.recorded": "metrics.jsonl",
    "rl.saved": "steps.jsonl",  # issue 28's case: a torn step record
}


def finished_fork(fork, log: str | None) -> dict:
    """Resume a fork to the end; a torn ``log`` has been set aside (``LOG.torn-*``)."""
    out = finish(fork)
    if log is not None:
        assert list((fork / RUN / "rl").glob(f"{log}.torn-*")), f"{log}: torn tail kept"
    return out


def never_killed(base: Path, to: Path) -> Path:
    """The reference: ``base`` run to the end with no kill."""
    d = copy_of(base, to)
    finish(d)
    return d


@pytest.mark.ci
def test_kill_at_every_window_then_finish_each(crash_base, tmp_path):
    d = copy_of(crash_base, tmp_path / "chain")
    rl = d / RUN / "rl"
    seen, forks = [], {}
    pool = ThreadPoolExecutor(max_workers=1)
    ref = pool.submit(never_killed, crash_base, tmp_path / "reference")
    try:
        for window in WINDOWS:
            killed(d, f"{window}:1")
            seen.append(check_run(d / RUN, finished=False)["n"])
            if window in TEARS:
                tear(rl / TEARS[window])
                check_run(d / RUN, finished=False)
            fork = copy_of(d, tmp_path / f"fork-{window}")
            forks[window] = pool.submit(finished_fork, fork, TEARS.get(window))
        assert seen[-1] >= 5, f"the chain committed too few steps: {seen}"
        assert list(rl.glob("trajectories.jsonl.torn-*")) and list(rl.glob("steps.jsonl.torn-*"))
        out = finish(d)
        assert out["steps"] == list(range(1, STEPS + 1))
        reference = ref.result() / RUN
        diffs = {"the chain": differences(d / RUN, reference)}
        for window, done in forks.items():
            assert done.result()["steps"] == list(range(1, STEPS + 1)), window
            diffs[window] = differences(tmp_path / f"fork-{window}" / RUN, reference)
        diffs = {k: v for k, v in diffs.items() if v}
        assert not diffs, "resumed runs differ from the run never killed:\n" + "\n".join(
            f"{k}: {line}" for k, v in diffs.items() for line in v
        )
    finally:  # a failure stops here: the forks not yet started are not run
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("window", [*WINDOWS, "collector.written:20"])
def test_kill_at_one_window_then_resume(crash_base, tmp_path, window):
    d = copy_of(crash_base, tmp_path)
    killed(d, window if ":" in window else f"{window}:2")  # in the second step
    check_run(d / RUN, finished=False)
    finish(d)


@pytest.mark.slow
@pytest.mark.parametrize("log", ["trajectories.jsonl", "steps.jsonl", "metrics.jsonl"])
def test_torn_tail_of_each_log_then_resume(crash_base, tmp_path, log):
    d = copy_of(crash_base, tmp_path)
    killed(d, "rl.saved:2")
    tear(d / RUN / "rl" / log)
    check_run(d / RUN, finished=False)
    finish(d)
    assert list((d / RUN / "rl").glob(f"{log}.torn-*"))
