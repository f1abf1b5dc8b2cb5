"""The provenance invariant: validation rules, accessors, exact log q / log w."""

from __future__ import annotations

import math

import numpy as np
import pytest

from provrl.provenance import (
    NO_VERSION,
    ProvenanceError,
    Segment,
    ToolCall,
    Trajectory,
    TrajectoryBatch,
    TrajectoryBuilder,
)


def make_traj(versions=(0, 0, 1), logprobs=(-0.5, -1.0, -0.25)) -> Trajectory:
    b = TrajectoryBuilder("tr-1", "task-9")
    b.add_prompt([10, 11, 12])
    n = len(versions)
    b.add_actions(
        list(range(100, 100 + n)),
        logprob=logprobs,
        kept_mass=[1.0] * n,
        version=versions,
        kv_min=[0] * n,
        kv_max=versions,
        replica=0,
    )
    b.add_tool_call(ToolCall(turn=0, name="search", arguments="x"))
    b.next_turn()
    b.add_observation([20, 21])
    b.add_actions(
        [200], logprob=[-2.0], kept_mass=[0.9], version=[1], kv_min=[0], kv_max=[1], replica=0
    )
    return b.build(reward=1.0)


def test_builder_segments_and_accessors():
    t = make_traj()
    assert len(t) == 9 and t.num_actions == 4
    assert [s.kind for s in t.segments] == ["prompt", "action", "observation", "action"]
    assert t.segments[2] == Segment("observation", 6, 8, 1)
    np.testing.assert_array_equal(t.action_mask(), [0, 0, 0, 1, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(t.versions(), [-1, -1, -1, 0, 0, 1, -1, -1, 1])
    np.testing.assert_allclose(t.behaviour_logprobs(), [0, 0, 0, -0.5, -1.0, -0.25, 0, 0, -2.0])
    np.testing.assert_array_equal(t.version_lag(3), [3, 3, 2, 2])


def test_log_q_and_log_w_against_hand_computation():
    t = make_traj()
    # log q(τ) = -0.5 - 1.0 - 0.25 - 2.0
    assert t.log_q() == pytest.approx(-3.75, abs=1e-7)
    target_actions = np.array([-0.4, -1.5, -0.25, -1.0])
    expected = (-0.4 + 0.5) + (-1.5 + 1.0) + 0.0 + (-1.0 + 2.0)
    assert t.log_w(target_actions) == pytest.approx(expected, abs=1e-6)
    full = np.full(len(t), 123.0)  # non-action values must be ignored
    full[t.is_action] = target_actions
    assert t.log_w(full) == pytest.approx(expected, abs=1e-6)
    # exp(log w) equals the product of ratios
    ratios = np.exp(target_actions - t.logprob[t.is_action].astype(np.float64))
    assert math.exp(t.log_w(target_actions)) == pytest.approx(float(np.prod(ratios)), rel=1e-9)
    with pytest.raises(ProvenanceError, match="shape"):
        t.log_w([0.0])


def test_log_w_of_a_zero_probability_token_is_minus_inf_and_nan_raises():
    t = make_traj()
    target = np.array([-0.4, -math.inf, -0.25, -1.0])  # π_θ(a_t) = 0 for one action
    assert t.log_w(target) == -math.inf  # the product is exactly 0, not the other ratios
    action_at = np.flatnonzero(t.is_action)
    for bad in (math.nan, math.inf):
        target[1] = bad
        with pytest.raises(ProvenanceError, match=rf"token {action_at[1]}: target logprob"):
            t.log_w(target)


def test_non_numeric_reward_and_metrics_are_refused():
    t = make_traj()
    for reward in ("1.0", True, math.nan, math.inf):
        t.reward = reward  # type: ignore[assignment]
        with pytest.raises(ProvenanceError, match="field 'reward'"):
            t.validate()
    t.reward = 1
    t.metrics = {"f1": "high"}  # type: ignore[dict-item]
    with pytest.raises(ProvenanceError, match=r"field 'metrics\.f1'"):
        t.validate()
    t.metrics = {"f1": None, "em": 1.0}  # None: a NaN that went through JSON
    t.validate()


def test_log_w_stays_finite_where_products_underflow():
    n = 10_000
    b = TrajectoryBuilder("long", "t")
    b.add_prompt([1])
    b.add_actions(
        [5] * n,
        logprob=[-0.3] * n,
        kept_mass=[1.0] * n,
        version=[0] * n,
        kv_min=0,
        kv_max=0,
        replica=0,
    )
    t = b.build()
    assert np.prod(np.exp(t.logprob[t.is_action].astype(np.float64))) < 1e-300  # underflows
    assert t.log_q() == pytest.approx(-0.3 * n, rel=1e-6)
    assert t.log_w(np.full(n, -0.2)) == pytest.approx(0.1 * n, rel=1e-5)


def corrupt(field: str, index: int, value) -> Trajectory:
    t = make_traj()
    arr = getattr(t, field).copy()
    arr[index] = value
    setattr(t, field, arr)
    return t


@pytest.mark.parametrize(
    ("field", "index", "value", "rule"),
    [
        ("version", 4, NO_VERSION, "action token has no version"),
        ("logprob", 4, np.nan, "logprob is not finite"),
        ("logprob", 4, np.inf, "logprob is not finite"),
        ("logprob", 4, 0.01, "logprob > 0"),
        ("kept_mass", 4, 0.0, r"kept_mass outside \(0, 1\]"),
        ("kept_mass", 4, 1.5, r"kept_mass outside \(0, 1\]"),
        ("kv_min", 4, NO_VERSION, "no kv_versions"),
        ("kv_min", 5, 2, "kv_min > kv_max"),
        ("kv_max", 4, 5, "kv_max newer than the sampling version"),
        ("replica", 4, -1, "no replica"),
        ("version", 1, 0, "non-action token has a version"),
        ("logprob", 1, -1.0, "non-action token has a logprob"),
        ("kept_mass", 1, 1.0, "non-action token has a kept_mass"),
        ("kv_max", 1, 0, "non-action token has kv_versions"),
        ("replica", 1, 0, "non-action token has a replica"),
        ("token_id", 2, -3, "negative token id"),
    ],
)
def test_every_validation_rule_names_trajectory_and_token(field, index, value, rule):
    t = corrupt(field, index, value)
    with pytest.raises(ProvenanceError, match=rf"trajectory 'tr-1'.*token {index}: .*{rule}"):
        t.validate()


def test_length_mismatch_and_dtype_are_errors():
    t = make_traj()
    t.logprob = t.logprob[:-1]
    with pytest.raises(ProvenanceError, match="'logprob' has 8 entries, token_id has 9"):
        t.validate()
    t = make_traj()
    t.version = t.version.astype(np.int64)
    with pytest.raises(ProvenanceError, match="dtype"):
        t.validate()


def test_segment_rules():
    t = make_traj()
    t.segments[0] = Segment("prompt", 0, 4, 0)  # swallows an action token
    with pytest.raises(ProvenanceError, match="token 3: action token in prompt segment 0"):
        t.validate()
    t = make_traj()
    t.segments.append(Segment("prompt", 8, 20, 1))
    with pytest.raises(ProvenanceError, match="out of order or out of range"):
        t.validate()


def test_batch_padding_and_alignment():
    a, b = make_traj(), make_traj(versions=(2,), logprobs=(-0.1,))
    batch = TrajectoryBatch.from_trajectories([a, b], pad_token_id=0)
    assert batch.input_ids.shape == (2, 9)
    assert batch.lengths.tolist() == [9, 7]
    assert batch.action_mask[1, 7:].sum() == 0 and not batch.attention_mask[1, 7:].any()
    assert batch.behaviour_logprobs[0].sum().item() == pytest.approx(a.log_q(), abs=1e-6)
    assert batch.versions[1].tolist() == [-1, -1, -1, 2, -1, -1, 1, -1, -1]
    assert batch.rewards.tolist() == [1.0, 1.0]
