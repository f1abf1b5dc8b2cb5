"""``provrl bench learning``'s targets and plot, read from a record alone."""

from __future__ import annotations

import copy

import pytest

from provrl.bench.learning_report import plot_learning, targets


def _tier(warm: float, rl: float, cw: float, cr: float) -> dict[str, float]:
    return {"warmstart_accuracy": warm, "rl_accuracy": rl, "gain_points": 100 * (rl - warm),
            "warmstart_tool_calls_solved": cw, "rl_tool_calls_solved": cr}  # fmt: skip


def _record() -> dict:
    rows = []
    for s in range(3):
        tiers = {"1": _tier(0.6, 0.7, 2.3, 1.6), "2": _tier(0.2, 0.6, 3.4, 2.2)}
        rows.append({
            "seed": s, "accuracy_gain_points": 20.0 + s, "accuracy_gain_se": 4.0,
            "tool_calls_solved_cut_frac": 0.3, "mixed_version_frac": 0.22,
            "second_world_gain_points": 12.0, "per_tier": tiers,
            "second_world_per_tier": copy.deepcopy(tiers),
        })  # fmt: skip
    return {"preset": "default", "eval_k": 4, "seeds": rows,
            "mean": {"accuracy_gain_points": 21.0, "tool_calls_solved_cut_frac": 0.3}}  # fmt: skip


def test_every_target_holds_on_a_record_that_meets_them():
    t = targets(_record())
    assert t["all_hold"], t
    assert t["checks"]["mean_gain"]["value"] == pytest.approx(21.0)


@pytest.mark.parametrize(
    ("field", "value", "check"),
    [
        ("tool_calls_solved_cut_frac", 0.24, "calls_cut_every_seed"),
        ("mixed_version_frac", 0.19, "mixed_every_seed"),
        ("accuracy_gain_se", 11.0, "every_seed_interval_above_0"),
    ],
)
def test_one_seed_missing_a_target_fails_it(field, value, check):
    rec = _record()
    rec["seeds"][1][field] = value
    t = targets(rec)
    assert not t["checks"][check]["holds"] and not t["all_hold"]


def test_a_tier_that_falls_fails_no_tier_falls():
    rec = _record()
    rec["seeds"][2]["per_tier"]["1"]["gain_points"] = -1.6
    assert not targets(rec)["checks"]["no_tier_falls"]["holds"]


def test_plot_is_written(tmp_path):
    png = plot_learning(_record(), tmp_path / "learning.png")
    assert png.stat().st_size > 10_000
