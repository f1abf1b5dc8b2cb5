"""Paced admission (``pipeline.loop.admission: paced``): a group starts just in time for the
step that will train it; eager when generation is the slower side or nothing is measured."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from provrl.pipeline.admission import Ema, RecentMedian, groups_needed, paced_start


def test_paced_start_waits_until_one_group_time_before_the_step_ends():
    kw: dict[str, Any] = {"pending": 0, "need": 4, "step_s": 30.0, "group_s": 10.0}
    assert not paced_start(elapsed_s=5.0, **kw)  # the batch would wait 15 s, aging
    assert paced_start(elapsed_s=20.0, **kw)  # finishes as the step ends
    assert paced_start(elapsed_s=None, **kw)  # learner idle: the trainer waits, start now


def test_straddle_starts_a_group_so_that_share_s_of_it_runs_after_the_hot_load():
    kw: dict[str, Any] = {"pending": 0, "need": 4, "step_s": 30.0, "group_s": 10.0}
    assert paced_start(elapsed_s=20.0, straddle=0.0, **kw)  # finishes at the hot-load
    assert not paced_start(elapsed_s=24.9, straddle=0.5, **kw)  # would finish before it
    assert paced_start(elapsed_s=25.0, straddle=0.5, **kw)  # 5 s of its 10 s after the swap
    assert paced_start(elapsed_s=None, straddle=0.5, **kw)  # learner idle: start now


def test_paced_start_is_eager_when_generation_is_slower_or_unmeasured():
    assert paced_start(pending=0, need=4, elapsed_s=0.0, step_s=10.0, group_s=25.0)
    assert paced_start(pending=0, need=4, elapsed_s=0.0, step_s=None, group_s=10.0)
    assert paced_start(pending=0, need=4, elapsed_s=0.0, step_s=10.0, group_s=None)


def test_paced_start_never_starts_beyond_what_the_next_step_needs():
    assert not paced_start(pending=4, need=4, elapsed_s=None, step_s=None, group_s=None)
    assert paced_start(pending=3, need=4, elapsed_s=None, step_s=None, group_s=None)


@pytest.mark.parametrize(("z", "want"), [(0.0, 4), (0.5, 8), (0.2, 5), (0.99, 12)])
def test_groups_needed_makes_up_for_groups_without_signal(z, want):
    assert groups_needed(4, z, cap=12) == want  # ⌈4 / (1 − z)⌉, z ≤ 0.9, at most the cap


def test_ema():
    e = Ema(alpha=0.5)
    assert e.value is None
    assert e.update(4.0) == 4.0 and e.update(2.0) == 3.0
    assert math.isclose(e.update(3.0), 3.0)


def test_the_step_time_estimate_follows_a_change_of_regime():
    """Dev run C's step times: three probe-era steps of ~80 s, then ~27-41 s. With an EMA
    (α = 0.3) the planned start fell after the real step end; the recent median does not."""
    steps = [82.2, 82.0, 72.2, 41.4, 40.7, 27.2, 29.8, 25.0]
    ema, med = Ema(), RecentMedian()
    for x in steps[:-1]:
        ema.update(x)
        med.update(x)
    group_s, real = 18.0, steps[-1]
    assert ema.value is not None and med.value is not None
    assert ema.value - group_s > real  # EMA: would start after the step is over
    assert med.value - group_s < real  # median of the last three: starts within the step
    assert RecentMedian().value is None
    m = RecentMedian(n=3)
    assert [m.update(x) for x in (5.0, 1.0, 3.0, 100.0)] == [5.0, 3.0, 3.0, 3.0]


def test_the_step_time_follows_the_batch_tokens():
    """Dev run H (seed 1), steps 2-8: forward tokens and train seconds. The step at hand is
    predicted from its own tokens times the recent seconds per token; the median of the last
    three step times trailed the shortening steps by 40-90 %, which started groups after
    the hot-load and left the learner waiting for a whole group."""
    from types import SimpleNamespace

    from provrl.pipeline.admission import Pacer

    steps = [(13964, 121.0), (16458, 131.0), (15376, 123.0), (12874, 92.0), (9291, 67.0),
             (7039, 51.0), (4614, 35.0)]  # fmt: skip
    pacer, med = Pacer(4, 2, paced=True), RecentMedian()
    assert pacer.expected_step_s() is None  # nothing measured: eager
    for i, (n, t) in enumerate(steps):
        batch = [SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(n))])]
        pacer.training(batch)  # type: ignore[arg-type]
        if i >= 3:
            predicted, trailing = pacer.expected_step_s(), med.value
            assert predicted is not None and trailing is not None
            assert abs(predicted - t) / t < 0.15
            assert abs(trailing - t) / t > 0.3
        pacer.s_per_token.update(t / n)  # what trained() measures (wall time / tokens)
        pacer.tokens = 0
        med.update(t)


def test_the_fixed_part_of_a_step_is_not_charged_per_token(monkeypatch):
    """T̂ = c + n · r: a step of 1000 tokens trained in 10 s of its 15 s wall time (5 s of
    save and hot-load) predicts 25 s for 2000 tokens, not the 30 s of 15 s per 1000."""
    from types import SimpleNamespace

    from provrl.pipeline import admission
    from provrl.pipeline.admission import Pacer

    clock = iter([0.0, 15.0, 20.0])
    monkeypatch.setattr(admission.time, "perf_counter", lambda: next(clock))
    pacer = Pacer(4, 2, paced=True)
    pacer.training([SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(1000))])])  # type: ignore[list-item]  # fmt: skip
    pacer.trained(train_s=10.0)
    pacer.training([SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(2000))])])  # type: ignore[list-item]  # fmt: skip
    assert pacer.expected_step_s() == pytest.approx(25.0)
    assert pacer.estimates()["paced_fixed_s"] == pytest.approx(5.0)


def test_the_learners_progress_takes_over_after_a_quarter_of_the_step(monkeypatch):
    """Predicted 25 s (5 s fixed + 2000 tokens at 10 ms); the learner reports 10 % done at
    t = 4 s (too early: the prediction stands), then half done at t = 15 s: its own pace says
    30 s of training, 35 s with the fixed part."""
    from types import SimpleNamespace

    from provrl.pipeline import admission
    from provrl.pipeline.admission import Pacer

    now = {"t": 0.0}
    monkeypatch.setattr(admission.time, "perf_counter", lambda: now["t"])
    pacer = Pacer(4, 2, paced=True)
    pacer.s_per_token.update(0.01)
    pacer.fixed_s.update(5.0)
    share = {"f": 0.0}
    batch = [SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(2000))])]
    pacer.training(batch, lambda: share["f"])  # type: ignore[arg-type]
    assert pacer.predicted == pytest.approx(25.0)
    now["t"], share["f"] = 4.0, 0.1
    assert pacer.expected_step_s() == pytest.approx(25.0)
    now["t"], share["f"] = 15.0, 0.5
    assert pacer.expected_step_s() == pytest.approx(35.0)
    assert pacer.estimates()["paced_step_s"] == pytest.approx(25.0)  # what was predicted


def test_a_groups_shared_prompt_is_counted_once():
    """The learner computes a group's shared prefix once (its radix tree): 8 samples of a
    100-token prompt and 20 distinct tokens each are 100 + 8 · 20 forward tokens."""
    from types import SimpleNamespace

    from provrl.pipeline.admission import forward_tokens

    prompt = np.arange(100)
    samples = [np.concatenate([prompt, 1000 + 20 * i + np.arange(20)]) for i in range(8)]
    group = SimpleNamespace(trajectories=[SimpleNamespace(token_id=x) for x in samples])
    assert forward_tokens([group, group]) == 2 * (100 + 8 * 20)  # type: ignore[list-item]


def test_admission_bounds_outstanding_groups_and_drops_the_stale_ones():
    """n < (1 + L) · G starts; a step takes G ready groups, oldest first; a group beyond
    the lag bound leaves the ready queue and the outstanding count."""
    from types import SimpleNamespace

    from provrl.pipeline.admission import Admission

    adm = Admission(groups_per_step=2, max_lag=1, paced=False)
    for i in range(4):
        assert adm.may_start(in_training=0)
        adm.started(f"t{i}#r1")
    assert not adm.may_start(in_training=0) and adm.outstanding == 4

    def group(key: str, v: int) -> SimpleNamespace:
        return SimpleNamespace(key=key, min_version=lambda: v)

    old, a, b = group("t0#r1", 0), group("t1#r1", 2), group("t2#r1", 2)
    for g in (old, a, b):
        adm.finished(g, signal=True, keep=True)  # type: ignore[arg-type]
    adm.finished(group("t3#r1", 2), signal=False, keep=False)  # type: ignore[arg-type]
    assert adm.outstanding == 3 and adm.ready == [old, a, b]
    assert adm.drop_stale(trainer_version=2) == [old] and adm.outstanding == 2
    assert adm.batch() == [a, b] and adm.ready == [] and adm.batch() is None
    adm.settled(2)
    assert adm.outstanding == 0 and adm.may_start(in_training=0)


def test_a_steps_record_says_when_its_groups_started_and_finished(monkeypatch):
    """Seconds after the hand-over: a group started at 12 s and one finished at 30 s while
    the step trained; a group started before the hand-over is not listed, and the next step
    starts a new list."""
    from types import SimpleNamespace

    from provrl.pipeline import admission
    from provrl.pipeline.admission import Pacer

    now = {"t": 0.0}
    monkeypatch.setattr(admission.time, "perf_counter", lambda: now["t"])
    pacer = Pacer(4, 2, paced=True)
    pacer.started("a#r1")  # learner idle: no step to time it against
    now["t"] = 100.0
    pacer.training([SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(10))])])  # type: ignore[list-item]  # fmt: skip
    now["t"] = 112.0
    pacer.started("b#r1")
    now["t"] = 130.0
    pacer.finished("a#r1", signal=True)
    est = pacer.estimates()
    assert est["paced_starts_s"] == [12.0] and est["paced_finishes_s"] == [30.0]
    pacer.trained()
    pacer.training([SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(10))])])  # type: ignore[list-item]  # fmt: skip
    assert pacer.estimates()["paced_starts_s"] == [] == pacer.estimates()["paced_finishes_s"]


def test_a_start_due_during_the_save_and_hot_load_is_made_when_training_ends(monkeypatch):
    """Dev run R: the save and hot-load hold the loop for c ≈ 12 s; once groups took less
    than 2c (straddle 0.5), every start was due inside that window, so none was made until
    the learner sat idle and no group spanned the swap. Trained, the step's due groups start
    before the swap; without a straddle the pacing is as before."""
    from types import SimpleNamespace

    from provrl.pipeline import admission
    from provrl.pipeline.admission import Pacer

    now = {"t": 0.0}
    monkeypatch.setattr(admission.time, "perf_counter", lambda: now["t"])
    batch = [SimpleNamespace(trajectories=[SimpleNamespace(token_id=np.arange(1000))])]
    for straddle, group_s in ((0.5, 16.0), (0.0, 8.0)):
        pacer = Pacer(4, 2, paced=True, straddle=straddle)
        pacer.s_per_token.update(0.04)  # 40 s of training for the batch's 1000 tokens
        pacer.fixed_s.update(12.0)  # then 12 s of save and hot-load: T̂ = 52 s
        pacer.group_time.update(group_s)  # a start is due at 52 − (1 − s) · group_s = 44 s
        now["t"] = 0.0
        pacer.training(batch)  # type: ignore[arg-type]
        now["t"] = 40.0
        assert not pacer.may_start(0)  # trained on time, but 44 s is inside the blocked window
        pacer.train_done()
        assert pacer.may_start(0) is (straddle > 0)  # no straddle: finish at the swap, as before
        pacer.trained(40.0)
        assert not pacer.loading
