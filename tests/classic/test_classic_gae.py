"""GAE(γ, λ) against hand computations and its two limits."""

from __future__ import annotations

import numpy as np
import pytest

from provrl.classic.gae import discounted_returns, gae


def test_gae_matches_a_hand_computation():
    # one env, 3 steps, episode continues past the rollout
    r = np.array([[1.0], [0.0], [2.0]], np.float32)
    v = np.array([[0.5], [1.0], [0.2]], np.float32)
    v_next = np.array([[1.0], [0.2], [0.4]], np.float32)
    no = np.zeros((3, 1), bool)
    g, lam = 0.9, 0.5
    d = [1.0 + 0.9 * 1.0 - 0.5, 0.0 + 0.9 * 0.2 - 1.0, 2.0 + 0.9 * 0.4 - 0.2]
    a2 = d[2]
    a1 = d[1] + g * lam * a2
    a0 = d[0] + g * lam * a1
    adv, ret = gae(r, v, v_next, no, no, g, lam)
    assert adv[:, 0] == pytest.approx([a0, a1, a2], rel=1e-6)
    assert ret[:, 0] == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 0.2], rel=1e-6)


def test_termination_cuts_bootstrap_and_truncation_keeps_it():
    r = np.ones((2, 2), np.float32)
    v = np.zeros((2, 2), np.float32)
    v_next = np.full((2, 2), 10.0, np.float32)
    term = np.array([[True, False], [False, False]])
    done = np.array([[True, True], [False, False]])  # env 1 is truncated at t = 0
    adv, _ = gae(r, v, v_next, term, done, gamma=0.5, lam=1.0)
    assert adv[0, 0] == pytest.approx(1.0)  # terminal: r only, no V(s'), no carry-over
    assert adv[0, 1] == pytest.approx(1.0 + 0.5 * 10.0)  # truncated: bootstrap, no carry
    assert adv[1, 0] == pytest.approx(1.0 + 0.5 * 10.0)


def test_lambda_one_with_zero_values_is_the_discounted_return(rng):
    T, N = 50, 4
    r = rng.normal(size=(T, N)).astype(np.float32)
    done = rng.random((T, N)) < 0.1
    done[-1] = True  # every episode ends inside the rollout
    z = np.zeros((T, N), np.float32)
    adv, _ = gae(r, z, z, done, done, gamma=0.97, lam=1.0)
    assert np.allclose(adv, discounted_returns(r, done, 0.97), atol=1e-4)


def test_lambda_zero_is_the_one_step_td_error(rng):
    T, N = 20, 3
    r, v, vn = (rng.normal(size=(T, N)).astype(np.float32) for _ in range(3))
    term = rng.random((T, N)) < 0.2
    adv, _ = gae(r, v, vn, term, term, gamma=0.9, lam=0.0)
    assert np.allclose(adv, r + 0.9 * (1 - term) * vn - v, atol=1e-6)


def test_shape_mismatch_is_named():
    with pytest.raises(ValueError, match="next_values"):
        gae(
            np.zeros((3, 2)),
            np.zeros((3, 2)),
            np.zeros((3, 1)),
            np.zeros((3, 2)),
            np.zeros((3, 2)),
            0.9,
            0.9,
        )
