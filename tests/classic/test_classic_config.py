"""Presets: every one validates, states its tuning seeds, and is refused on them."""

from __future__ import annotations

import pytest

from provrl.classic.config import ENV_PRESETS, check_held_out, config_for
from provrl.config import ConfigError


def test_every_preset_validates_and_states_its_tuning_seeds():
    for env_id, preset in ENV_PRESETS.items():
        cfg = config_for(env_id)
        assert cfg.env_id == env_id
        r = preset.tuning_seeds
        assert f"seeds {r.start}-{r.stop - 1}" in preset.doc, env_id
    assert config_for("Pendulum-v1").bounded_mean
    assert not config_for("Pendulum-v1", {"bounded_mean": False}).bounded_mean


def test_check_held_out_refuses_tuning_seeds_and_names_them():
    with pytest.raises(ConfigError, match=r"Pendulum-v1: seeds \[40, 41, 42\] are tuning.*10-42"):
        check_held_out("Pendulum-v1", range(40, 50))  # 41-42 motivated bounded_mean
    with pytest.raises(ConfigError, match=r"CartPole-v1: seeds \[10, 23\]"):
        check_held_out("CartPole-v1", [0, 10, 23, 41])
    check_held_out("CartPole-v1", range(41, 61))
    check_held_out("Pendulum-v1", range(43, 61))
    check_held_out("MountainCarContinuous-v0", range(10, 20))  # no preset: nothing to refuse
