"""Running mean/variance (Chan's parallel update) against numpy on the concatenation."""

from __future__ import annotations

import numpy as np

from provrl.classic.normalize import RunningMeanStd


def test_running_stats_equal_batch_stats(rng):
    rms = RunningMeanStd(3)
    batches = [rng.normal(loc=[1, -2, 5], scale=[0.1, 3, 10], size=(n, 3)) for n in (1, 7, 100, 33)]
    for b in batches:
        rms.update(b)
    allx = np.concatenate(batches)
    assert rms.count == len(allx)
    assert np.allclose(rms.mean, allx.mean(0))
    assert np.allclose(rms.var, allx.var(0))


def test_normalize_standardises_and_clips(rng):
    rms = RunningMeanStd(2, clip=3.0)
    x = rng.normal(loc=[4, -1], scale=[2, 0.5], size=(5000, 2))
    rms.update(x)
    z = rms.normalize(x)
    assert z.dtype == np.float32
    assert np.allclose(z.mean(0), 0, atol=0.05) and np.allclose(z.std(0), 1, atol=0.05)
    assert rms.normalize(np.array([[1e6, -1e6]])).tolist() == [[3.0, -3.0]]


def test_empty_batch_changes_nothing():
    rms = RunningMeanStd(2)
    rms.update(np.zeros((0, 2)))
    assert rms.count == 0 and rms.var.tolist() == [1.0, 1.0]
