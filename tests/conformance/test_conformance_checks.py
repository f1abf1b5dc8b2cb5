"""Conformance on the tiny model: passes on provrl's own engine (float32 and bfloat16), and
fails each planted fault, naming the right check."""

from __future__ import annotations

import pytest
from planted_faults import (
    SKIPPED,
    KeepWaitsForTheTurn,
    OffByOneStamps,
    SkipsATensor,
    StaleKVStampedFresh,  # type: ignore[import-not-found]
    TurnStartStamps,
    Wrapped,
    no_recompute,
    raw_logprobs,
    unrenormalised,
    untempered_kept_mass,
)

from provrl.conformance.run import CHECKS, run_conformance


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_local_engine_conforms(tiny, engine_on, small_cfg_conf, dtype):
    report = run_conformance(engine_on(dtype=dtype), tiny, small_cfg_conf, dtype)
    assert report.passed, [c.line() for c in report.checks]
    d = report.to_dict()
    assert [c["name"] for c in d["checks"]] == list(CHECKS)
    law = d["checks"][0]
    assert all(t["dof"] > 0 for t in law["tests"])  # both laws were really tested
    assert all(t["power"] > 0.5 for t in law["tests"])
    # the mid-turn swap landed after exactly swap_point tokens (drain: after the turn)
    mid = d["checks"][3]["midturn"]
    n, s = small_cfg_conf.turn_tokens, small_cfg_conf.swap_point
    assert {m: (x["split"], x["exact_split"]) for m, x in mid.items()} == {
        "keep": (s, True),
        "recompute": (s, True),
        "drain": (n, True),
    }
    if dtype == "float32":  # the log q alone would catch keep and recompute swapped
        tol = small_cfg_conf.logprob_tol[dtype]
        assert all(float(mid[m]["other_law_distance"]) > tol for m in ("keep", "recompute")), mid


@pytest.mark.parametrize(
    "fault, failing",
    [
        (raw_logprobs, {"law", "teacher"}),
        (unrenormalised, {"law", "teacher"}),
        (untempered_kept_mass, {"law", "teacher"}),
    ],
    ids=["raw-logprobs", "unrenormalised-q", "untempered-kept-mass"],
)
def test_sampler_faults_fail_law_and_teacher(
    tiny, engine_on, small_cfg_conf, plant_sampler, fault, failing
):
    plant_sampler(fault)
    report = run_conformance(engine_on(), tiny, small_cfg_conf, only=("law", "teacher"))
    assert set(report.failed()) == failing, [c.line() for c in report.checks]
    assert all(c.error for c in report.checks)


def test_an_off_by_one_version_stamp_fails_stamps(tiny, engine_on, small_cfg_conf):
    engine = OffByOneStamps(engine_on())
    report = run_conformance(engine, tiny, small_cfg_conf, only=("weights", "stamps"))
    assert report.failed() == ["stamps"], [c.line() for c in report.checks]
    err = report.checks[1].error
    assert err is not None and "version" in err


def test_a_keep_turn_stamped_fresh_over_stale_kv_fails_stamps(tiny, engine_on, small_cfg_conf):
    """A kv_min of the new version after a keep swap is believed only if turn 2's log q are
    those of a KV filled under it (an engine that re-prefills each new turn, as vLLM's
    version-salted prefix cache does, passes): over the kept KV they are not."""
    cfg = small_cfg_conf.model_copy(update={"modes": ["keep"]})
    report = run_conformance(StaleKVStampedFresh(engine_on()), tiny, cfg, only=("stamps",))
    assert report.failed() == ["stamps"], [c.line() for c in report.checks]
    err = report.checks[0].error
    assert err is not None and "keep: turn 2's log q differ from a fresh recompute" in err, err


@pytest.mark.parametrize(
    "fault, mode, field",
    [
        (TurnStartStamps, "keep", "version"),
        (no_recompute, "recompute", "log q"),
        (KeepWaitsForTheTurn, "keep", "version"),
    ],
    ids=["turn-start-stamps", "recompute-that-does-not", "keep-waits-for-the-turn"],
)
def test_mid_turn_faults_fail_stamps(tiny, engine_on, small_cfg_conf, monkeypatch, fault, mode, field):  # fmt: skip
    if fault is no_recompute:
        monkeypatch.setattr("provrl.engine.hotload.recompute_steps", no_recompute)
        engine = engine_on()
    else:
        engine = engine_on(fault)
    report = run_conformance(engine, tiny, small_cfg_conf, only=("weights", "stamps"))
    assert report.failed() == ["stamps"], [c.line() for c in report.checks]
    err = report.checks[1].error
    s = small_cfg_conf.swap_point
    assert err is not None and f"mid-turn {mode} (swap after token {s}" in err, err
    mid = next(e for e in err.split("; ") if e.startswith(f"mid-turn {mode}"))
    assert f"token {s}" in mid and field in mid, mid


def test_turn_start_stamps_pass_without_the_mid_turn_swap(tiny, engine_on, small_cfg_conf):
    """The between-turns swaps alone cannot see the turn-start fault: only mid-turn can."""
    report = run_conformance(engine_on(TurnStartStamps), tiny, small_cfg_conf, only=("stamps",))
    assert report.failed() == ["stamps"]
    assert all(e.startswith("mid-turn") for e in (report.checks[0].error or "").split("; "))


def test_an_engine_without_load_weights_async_is_swapped_from_a_thread(tiny, engine_on, small_cfg_conf):  # fmt: skip
    report = run_conformance(Wrapped(engine_on()), tiny, small_cfg_conf, only=("stamps",))
    assert report.passed, [c.line() for c in report.checks]
    mid = report.to_dict()["checks"][0]["midturn"]
    assert not any(x["exact_split"] for x in mid.values())
    assert all(x["split"] >= small_cfg_conf.swap_point for x in mid.values())


def test_expected_stamps_by_hand():
    from provrl.conformance.midturn import expected

    v, k = expected("keep", 3, 5, 2)
    assert v.tolist() == [3, 3, 4, 4, 4] and k.tolist() == [3] * 5
    v, k = expected("recompute", 3, 5, 2)
    assert v.tolist() == [3, 3, 4, 4, 4] and k.tolist() == [3, 3, 4, 4, 4]
    v, k = expected("drain", 3, 4, 4)
    assert v.tolist() == [3] * 4 and k.tolist() == [3] * 4


def test_logits_across_a_swap_keep_the_stale_prefix(tiny):
    import torch

    from provrl.conformance.reference import Reference, new_version

    ref = Reference(tiny)
    ids = list(range(5, 17))
    old = ref.logits(ids)
    new = new_version(tiny, 1, 0.5, 0)
    across = ref.logits_across(ids, 7, new)
    fresh = ref.logits(ids)  # the reference now holds v1
    assert torch.allclose(across[:7], old[:7], atol=1e-5)  # positions before the swap
    assert not torch.allclose(across[7:], fresh[7:], atol=1e-3)  # stale KV: not fresh v1
    assert not torch.allclose(across[7:], old[7:], atol=1e-3)
    ref.load(tiny.model.state_dict())
    same = ref.logits_across(ids, 7, tiny.model.state_dict())  # no change: a plain forward
    assert torch.allclose(same, old, atol=1e-5)


def test_swap_after_must_fall_inside_the_turn():
    from provrl.conformance.config import ConformanceConfig

    assert ConformanceConfig(turn_tokens=3).swap_point == 1
    with pytest.raises(ValueError, match="swap_after < turn_tokens"):
        ConformanceConfig(turn_tokens=4, swap_after=4)


def test_a_skipped_tensor_fails_weights_naming_it(tiny, engine_on, small_cfg_conf):
    report = run_conformance(engine_on(SkipsATensor), tiny, small_cfg_conf, only=("weights", "stamps"))  # fmt: skip
    assert "weights" in report.failed(), [c.line() for c in report.checks]
    err = report.checks[0].error
    assert err is not None and SKIPPED in err


def test_an_unknown_check_is_refused(tiny, engine_on, small_cfg_conf):
    with pytest.raises(ValueError, match="unknown check"):
        run_conformance(engine_on(), tiny, small_cfg_conf, only=("laws",))


def test_boundary_margin_by_hand():
    import math

    import torch

    from provrl.conformance.reference import Reference
    from provrl.provenance import SamplingParams

    row = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    p = SamplingParams(temperature=1.0, top_p=0.6)
    assert Reference.boundary_margin(row, 1, p) < 0  # inside S = {0, 1}
    assert Reference.boundary_margin(row, 2, p) == pytest.approx(0.8 - 0.6)
    k = SamplingParams(temperature=1.0, top_k=1)
    assert Reference.boundary_margin(row, 1, k) == pytest.approx(math.log(0.5 / 0.3))


def test_distance_counts_a_near_tie_at_the_cut_as_a_boundary_miss(tiny):
    import math

    import numpy as np
    import torch

    from provrl.conformance.reference import Reference
    from provrl.provenance import SamplingParams

    ref = Reference(tiny)
    rows = torch.log(torch.tensor([[0.5, 0.3, 0.2]] * 2))
    p = SamplingParams(temperature=1.0, top_p=0.6)  # support {0, 1}; token 2 is 0.2 past
    recorded = np.array([math.log(0.3 / 0.8), math.log(0.2)])
    d, misses = ref.distance(recorded, rows, [1, 2], p, tol=0.25)
    assert d.tolist() == pytest.approx([0.0, 0.0], abs=1e-6) and misses == 1
    d, misses = ref.distance(recorded, rows, [1, 2], p, tol=0.1)
    assert d[1] == math.inf and misses == 0
