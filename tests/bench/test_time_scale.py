"""provrl.bench.time_scale: N = the engine's seconds per sampling step here over the
deployment's time per output token, and the ``--time-scale`` flag's values."""

from __future__ import annotations

import argparse

import pytest

from provrl.bench.time_scale import (
    DEPLOYMENT,
    DEPLOYMENT_TPOT_S,
    engine_step_s,
    parse_time_scale,
    slowdown,
    time_scale,
)


def test_engine_step_time_is_busy_seconds_per_sampling_step():
    assert engine_step_s({"busy_s": 120.0, "steps": 400.0}) == 0.3
    with pytest.raises(ValueError, match="no sampling step"):
        engine_step_s({"busy_s": 1.0, "steps": 0.0})


def test_time_scale_is_the_ratio_of_step_times():
    # 0.42 s per step here (the learning benchmark's seed 0 in float32: 19.6 rows per step,
    # 60 % busy, 28.3 generated tokens/s) against 10.94 ms per token at the deployment
    assert slowdown(0.42, 0.01094) == pytest.approx(38.39, abs=0.01)
    assert time_scale(0.42) == 38.4
    assert time_scale(DEPLOYMENT_TPOT_S) == 1.0
    assert DEPLOYMENT["tpot_s"] == DEPLOYMENT_TPOT_S and DEPLOYMENT["source"].startswith("https://")
    with pytest.raises(ValueError, match="> 0"):
        slowdown(0.0)


def test_flag_values():
    assert parse_time_scale("auto") == "auto"
    assert parse_time_scale("32") == 32.0
    for bad, msg in (("fast", "number or 'auto'"), ("0", "> 0"), ("-3", "> 0"), ("nan", "> 0")):
        with pytest.raises(argparse.ArgumentTypeError, match=msg):
            parse_time_scale(bad)
