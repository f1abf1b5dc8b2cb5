"""Mixed-version importance sampling, computed exactly over every trajectory."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from provrl.objectives.corrections import sequence_log_weight
from provrl.provenance import Trajectory, TrajectoryBatch, TrajectoryBuilder
from provrl.theory.mixed import (
    SequenceModel,
    Versions,
    attribution_biases,
    log_softmax,
    mixed_version_report,
    reward_share,
    switch_log_behaviour,
    top_p_analysis,
    top_p_log_table,
)


@pytest.fixture(scope="module")
def small():
    model = SequenceModel.build(3, 4)
    return model, Versions.random(model, seed=1), reward_share(model)


def test_enumeration_against_a_direct_product():
    """q_κ(τ) from the vectorised tables equals the product over tokens written out by hand."""
    model = SequenceModel.build(2, 3)
    rng = np.random.default_rng(0)
    old, new = (log_softmax(rng.normal(size=(model.n_hist, 2))) for _ in range(2))
    rows = {(): 0, (0,): 1, (1,): 2, (0, 0): 3, (0, 1): 4, (1, 0): 5, (1, 1): 6}
    log_q = switch_log_behaviour(model.token_logprobs(old), model.token_logprobs(new))
    for n, seq in enumerate(itertools.product(range(2), repeat=3)):
        assert tuple(model.seqs[n]) == seq
        for kappa in range(4):
            direct = sum((old if t < kappa else new)[rows[seq[:t]], seq[t]] for t in range(3))
            assert log_q[kappa, n] == pytest.approx(direct, abs=1e-12)
    np.testing.assert_allclose(np.exp(log_q).sum(1), 1.0, rtol=1e-12)


def history_tables(model, versions, eta, version) -> dict[tuple[int, ...], np.ndarray]:
    """log π_v(·|h) keyed by the history h itself, not by SequenceModel's row index (rows are
    breadth-first: (), (0,), (1,), …, (0, 0), …; the direct-product test checks that)."""
    lt = versions.log_table(version, eta)
    hs = [h for d in range(model.length) for h in itertools.product(range(model.vocab), repeat=d)]
    assert len(hs) == lt.shape[0]
    return dict(zip(hs, lt, strict=True))


PROMPT = 7  # one non-action token before the actions (a real trajectory has a prompt)


def mixed_trajectory(tau, kappa, old, new, label_new=False) -> Trajectory:
    """τ as the engine records it after a hot-load at token κ: tokens t < κ sampled by
    version 0 (``old``), t ≥ κ by version 1 (``new``), each with its own log q. With
    ``label_new`` every token is labelled version 1 and its q recomputed from that label
    (the wrong attribution)."""
    table = [new if label_new or t >= kappa else old for t in range(len(tau))]
    b = TrajectoryBuilder(f"k{kappa}-{tau}", "t")
    b.add_prompt([PROMPT])
    b.add_actions(
        list(tau),
        logprob=[table[t][tau[:t]][a] for t, a in enumerate(tau)],
        kept_mass=1.0,
        version=[1 if label_new or t >= kappa else 0 for t in range(len(tau))],
        kv_min=0,
        kv_max=[0 if t < kappa else 1 for t in range(len(tau))],
        replica=0,
    )
    return b.build(reward=0.0)


def enumerate_with_project_weights(model, old, new, target, f_of, *, label_new=False):
    """For each κ = 0 … T: Σ_τ q_κ(τ) · w(τ) · f(τ) by plain enumeration of every τ, with
    q_κ multiplied out token by token here and w(τ) from the project's code — both
    ``Trajectory.log_w`` and the objectives' ``sequence_log_weight`` over a padded
    ``TrajectoryBatch`` (the trainer's layout), which must agree."""
    T = model.length
    taus = list(itertools.product(range(model.vocab), repeat=T))
    out = []
    for kappa in range(T + 1):
        trajs = [mixed_trajectory(tau, kappa, old, new, label_new) for tau in taus]
        log_pi = [[target[tau[:t]][a] for t, a in enumerate(tau)] for tau in taus]
        w_traj = np.array([t.log_w(lp) for t, lp in zip(trajs, log_pi, strict=True)])
        tb = TrajectoryBatch.from_trajectories(trajs, pad_token_id=0)
        logp = torch.zeros(tb.behaviour_logprobs.shape, dtype=torch.float64)
        logp[tb.action_mask] = torch.tensor(log_pi, dtype=torch.float64).reshape(-1)
        w_batch = sequence_log_weight(logp, tb.behaviour_logprobs, tb.action_mask).numpy()
        np.testing.assert_allclose(w_batch, w_traj, rtol=0, atol=1e-5)  # float32 log q
        log_q = np.array(
            [
                sum((old if t < kappa else new)[tau[:t]][a] for t, a in enumerate(tau))
                for tau in taus
            ]
        )
        f = np.array([f_of(tau) for tau in taus])
        out.append(float((np.exp(log_q + w_traj) * f).sum()))
    truth = sum(
        math.exp(sum(target[tau[:t]][a] for t, a in enumerate(tau))) * f_of(tau) for tau in taus
    )
    return np.array(out), truth


def share_of_zeros(tau) -> float:
    return sum(a == 0 for a in tau) / len(tau)


@pytest.mark.parametrize("target", [0, 1, 2])
@pytest.mark.parametrize("eta", [0.0, 0.3, 2.0])
def test_the_projects_weights_are_unbiased_by_an_independent_enumeration(small, target, eta):
    """w(τ) as provrl computes it from the *recorded* per-token q, on every trajectory of
    every switch point, gives E_{q_κ}[w f] = E_{π_θ}[f] for each κ. A weight that used the
    wrong version, the wrong token or a recomputed q would not (the label-recomputed weights
    below, the wrong attribution, are biased by the same enumeration)."""
    model, versions, _ = small
    old, new = (history_tables(model, versions, eta, v) for v in (0, 1))
    pi = history_tables(model, versions, eta, target)
    est, truth = enumerate_with_project_weights(model, old, new, pi, share_of_zeros)
    np.testing.assert_allclose(est, truth, rtol=0, atol=2e-6)  # float32 log q in the record
    wrong, _ = enumerate_with_project_weights(model, old, new, pi, share_of_zeros, label_new=True)
    if eta > 0:
        assert np.abs(wrong - truth).max() > 1e-2  # this enumeration can tell them apart

    # theory.mixed's exact sums agree with the enumeration, rule by rule and κ by κ
    f = reward_share(model)
    r = attribution_biases(model, versions, f, eta, target_version=target)
    assert r["truth"] == pytest.approx(truth, abs=1e-12)
    np.testing.assert_allclose(r["bias"]["exact"] + truth, est, atol=2e-6)
    np.testing.assert_allclose(r["bias"]["latest"] + truth, wrong, atol=2e-6)


def test_wrong_attribution_is_biased_where_versions_differ(small):
    model, versions, f = small
    T = model.length
    r = attribution_biases(model, versions, f, 1.0, target_version=1)
    latest, earliest = r["bias"]["latest"], r["bias"]["earliest"]
    assert abs(latest[0]) < 1e-12  # κ = 0: every token from v_new, "latest" is right
    assert abs(earliest[T]) < 1e-12  # κ = T: every token from v_old, "earliest" is right
    assert (np.abs(latest[1:]) > 1e-3).all()
    assert (np.abs(earliest[:T]) > 1e-3).all()
    # no policy change: every attribution is exact
    r0 = attribution_biases(model, versions, f, 0.0, target_version=1)
    for k in ("latest", "earliest", "none"):
        np.testing.assert_allclose(r0["bias"][k], 0.0, atol=1e-12)
    # the bias of "latest" grows with the policy change (this example, averaged over κ)
    b = [
        abs(attribution_biases(model, versions, f, e)["bias"]["latest"].mean())
        for e in (0.1, 0.5, 1.0, 2.0)
    ]
    assert b == sorted(b)


def test_stale_kv_needs_the_recorded_logprob(small):
    """After a keep-mode hot-load the sampler's distribution is not π_{v_new}: weights from the
    recorded logprob stay unbiased, weights recomputed from the version label do not."""
    model, versions, f = small
    stale = log_softmax(0.7 * (versions.base + versions.direction) + 0.3 * versions.base)
    r = attribution_biases(model, versions, f, 1.0, behaviour_after=stale)
    np.testing.assert_allclose(r["bias"]["exact"], 0.0, atol=1e-12)
    assert np.abs(r["bias"]["label"][:-1]).min() > 1e-4


def test_top_p_truncation():
    lt = np.log(np.array([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    lq, kept = top_p_log_table(lt, 0.75)
    np.testing.assert_array_equal(kept, [[True, True, False, False], [True, False, False, False]])
    np.testing.assert_allclose(np.exp(lq).sum(-1), 1.0)
    assert np.exp(lq[0, 0]) == pytest.approx(0.5 / 0.8)
    _, all_kept = top_p_log_table(lt, 1.0)
    assert all_kept.all()


@pytest.mark.parametrize("top_p", [0.6, 0.9])
def test_top_p_bias_is_the_missing_contribution(small, top_p):
    model, versions, f = small
    r = top_p_analysis(model, versions, f, 1.0, top_p)
    assert r["bias_exact_weights"] < -1e-3  # f ≥ 0: missing trajectories only remove mass
    assert r["bias_exact_weights"] == pytest.approx(r["minus_missing_contribution"], abs=1e-12)
    # the missing π mass: exact = 1 − E[w] = E[Σ_t w_{<t} m_t] (measurable from logged data)
    assert r["missing_mass"] > 0
    assert r["missing_mass_from_mean_weight"] == pytest.approx(r["missing_mass"], abs=1e-12)
    assert r["missing_mass_from_token_decomposition"] == pytest.approx(r["missing_mass"], abs=1e-12)
    assert abs(r["bias_exact_weights"]) <= r["bias_bound"] + 1e-12
    assert r["interval_low"] - 1e-12 <= r["truth"] <= r["interval_high"] + 1e-12
    assert abs(r["bias_pre_truncation_weights"]) > 1e-6  # the pre-top-p logprob is wrong too
    full = top_p_analysis(model, versions, f, 1.0, 1.0)
    assert abs(full["bias_exact_weights"]) < 1e-12 and full["missing_mass"] == 0.0


def test_default_report_numbers_are_consistent():
    rep = mixed_version_report()
    avg = rep["averaged_over_switch"]
    assert abs(avg["exact"]["bias"]) < 1e-12
    assert abs(avg["latest"]["bias"]) > 1e-2 and abs(avg["earliest"]["bias"]) > 1e-2
    # target = newest version: attributing to it makes every weight 1 (= no correction)
    assert avg["latest"]["bias"] == pytest.approx(avg["none"]["bias"], abs=1e-12)
    assert rep["by_switch_point"]["kappa"] == list(range(7))
    assert rep["top_p"]["top_p"] == 0.9
    with pytest.raises(ValueError, match="too many"):
        SequenceModel.build(10, 7)
