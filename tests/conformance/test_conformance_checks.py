"""Conformance on the tiny model: passes on provrl's own engine (float32 and bfloat16), and
fails each planted fault, naming the right check."""

from __future__ import annotations

import pytest
from planted_faults import (  # type: ignore[import-not-found]
    SKIPPED,
    OffByOneStamps,
    SkipsATensor,
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
