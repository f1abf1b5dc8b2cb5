"""Generators and validation of tabular MDPs."""

from __future__ import annotations

import numpy as np
import pytest

from provrl.theory.mdp import TabularMDP, chain_mdp, gridworld_mdp, random_mdp


@pytest.mark.parametrize("branching", [None, 1, 3])
@pytest.mark.parametrize("reward", ["dense", "sparse", "signed"])
def test_random_mdp_is_valid(branching, reward, rng):
    m = random_mdp(rng, 12, 3, 0.9, branching=branching, reward=reward)
    assert m.P.shape == (12, 3, 12) and m.R.shape == (12, 3)
    np.testing.assert_allclose(m.P.sum(-1), 1.0, atol=1e-12)
    if branching is not None:
        assert ((m.P > 0).sum(-1) <= branching).all()
        assert ((m.P > 0).sum(-1) >= 1).all()
    if reward == "sparse":
        assert set(np.unique(m.R)) <= {0.0, 1.0} and m.R.max() == 1.0
    if reward == "signed":
        assert m.R.min() < 0 < m.R.max()


def test_random_mdp_is_reproducible():
    a = random_mdp(np.random.default_rng(3), 5, 2, 0.5, branching=2)
    b = random_mdp(np.random.default_rng(3), 5, 2, 0.5, branching=2)
    np.testing.assert_array_equal(a.P, b.P)
    np.testing.assert_array_equal(a.R, b.R)


def test_chain_structure():
    m = chain_mdp(5, 0.9, p_forward=0.6)
    np.testing.assert_allclose(m.P.sum(-1), 1.0)
    assert m.P[2, 0, 1] == 1.0  # left always succeeds
    assert m.P[2, 1, 3] == pytest.approx(0.6)
    assert m.P[2, 1, 1] == pytest.approx(0.2)
    assert m.P[4, 1, 4] == pytest.approx(0.8)  # right wall: forward + stay
    assert m.R[4, 1] == 1.0 and m.R[0, 0] == 0.005 and m.mu0[0] == 1.0


def test_gridworld_structure():
    m = gridworld_mdp(3, 3, 0.9, slip=0.0)
    np.testing.assert_allclose(m.P.sum(-1), 1.0)
    # deterministic moves from the centre (cell 4): up → 1, down → 7, left → 3, right → 5
    assert [int(m.P[4, a].argmax()) for a in range(4)] == [1, 7, 3, 5]
    assert m.P[0, 0, 0] == 1.0  # bumping into the top wall
    assert (m.R[8] == 1.0).all() and (m.P[8, :, 0] == 1.0).all()  # goal pays and resets
    assert (m.R[7] == -1.0).all()
    slippery = gridworld_mdp(3, 3, 0.9, slip=0.4)
    assert slippery.P[4, 0, 1] == pytest.approx(0.6 + 0.1)


def test_validation_names_the_field():
    P = np.full((2, 2, 2), 0.5)
    R = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"field P\[1, 0, :\] sums to"):
        bad = P.copy()
        bad[1, 0] = [0.5, 0.6]
        TabularMDP(bad, R, 0.9, np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="field R must have shape"):
        TabularMDP(P, np.zeros(2), 0.9, np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="field gamma"):
        TabularMDP(P, R, 1.0, np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="field mu0 sums to"):
        TabularMDP(P, R, 0.9, np.array([0.7, 0.0]))
    with pytest.raises(ValueError, match="branching"):
        random_mdp(np.random.default_rng(0), 4, 2, 0.9, branching=0)
