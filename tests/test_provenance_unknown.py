"""Unknown provenance fields (an engine that cannot know them, e.g. vLLM): NaN kept_mass and
kv_min = UNKNOWN_VERSION validate, are counted as unknown by the trainer's diagnostics, and
never pass for values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from provrl.objectives.config import AdvantageConfig
from provrl.objectives.diagnostics import truncation_stats
from provrl.provenance import (
    NO_VERSION,
    UNKNOWN_VERSION,
    ProvenanceError,
    Trajectory,
    TrajectoryBatch,
    TrajectoryBuilder,
)
from provrl.train.rl import prepare_batch


def traj(kept=(1.0, np.nan, 0.5), kv_min=(0, UNKNOWN_VERSION, 1), version=(1, 1, 1)) -> Trajectory:
    b = TrajectoryBuilder("t-unk", "task")
    b.add_prompt([1, 2])
    b.add_actions(
        [3, 4, 5],
        logprob=[-0.1, -0.2, -0.3],
        kept_mass=kept,
        version=version,
        kv_min=kv_min,
        kv_max=version,
        replica=0,
    )
    return b.build(reward=1.0)


def test_unknown_kept_mass_and_kv_min_validate():
    t = traj()
    assert np.isnan(t.kept_mass[3]) and t.kv_min[3] == UNKNOWN_VERSION


@pytest.mark.parametrize(
    ("field", "index", "value", "rule"),
    [
        ("kv_min", 3, NO_VERSION, "no kv_versions"),  # -1 is 'no version', not 'unknown'
        ("kv_min", 3, -3, "no kv_versions"),
        ("kv_max", 3, UNKNOWN_VERSION, "no kv_max"),  # kv_max is always known
        ("kept_mass", 3, np.inf, r"kept_mass outside \(0, 1\]"),
        ("logprob", 3, np.nan, "logprob is not finite"),  # log q is never unknown
        ("kv_min", 0, UNKNOWN_VERSION, "non-action token has kv_versions"),
    ],
)
def test_unknown_is_not_a_wildcard(field, index, value, rule):
    t = traj()
    arr = getattr(t, field).copy()
    arr[index] = value
    setattr(t, field, arr)
    with pytest.raises(ProvenanceError, match=rf"token {index}: .*{rule}"):
        t.validate()


def test_truncation_stats_count_unknown_kept_mass_apart():
    km = torch.tensor([[1.0, float("nan"), 0.5, 1.0]])
    mask = torch.tensor([[False, True, True, True]])
    d = truncation_stats(km, mask)
    assert d["kept_mass_unknown_frac"] == pytest.approx(1 / 3)
    assert d["truncated_frac"] == pytest.approx(1 / 2)  # of the 2 known tokens
    assert d["q_excluded_mass"] == pytest.approx(0.25)
    all_unknown = truncation_stats(torch.full((1, 2), float("nan")), torch.ones(1, 2, dtype=bool))
    assert all_unknown == {"truncated_frac": 0.0, "q_excluded_mass": 0.0,
                           "kept_mass_unknown_frac": 1.0}  # fmt: skip


def test_rl_batch_counts_unknown_kv_apart_from_stale():
    t = traj(kept=(1.0, 1.0, 1.0), kv_min=(0, UNKNOWN_VERSION, 1), version=(1, 1, 1))
    batch, _ = prepare_batch([t], pad_token_id=0, vocab_size=10, cfg=AdvantageConfig())
    assert batch.kv_stale_frac == pytest.approx(1 / 3)  # kv_min 0 < version 1
    assert batch.kv_unknown_frac == pytest.approx(1 / 3)
    tb = TrajectoryBatch.from_trajectories([traj()], pad_token_id=0)
    assert torch.isnan(tb.kept_mass[0, 3]) and tb.kept_mass[0, 2] == 1.0
