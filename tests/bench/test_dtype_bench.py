"""The dtype benchmark (provrl/bench/dtype.py) on the tiny model: both dtypes timed on every
repeat, and each ratio is float32's speed over bfloat16's from the raw values it reports."""

from __future__ import annotations

import statistics

import pytest

from provrl.bench import dtype as bench
from provrl.bench import trainer


def test_the_dtype_benchmark_times_both_dtypes_and_its_ratios_follow_the_raw_values(monkeypatch):
    # the matmul rate at SmolLM2's shapes is the slow part and is tested with the trainer
    # benchmark; here a fixed rate stands in for it
    monkeypatch.setattr(trainer, "matmul_rate", lambda threads: {"bf16_gflops": 100.0, "fp32_gflops": 150.0})  # fmt: skip
    r = bench.run_dtype_benchmark(repeats=2, threads=1, episodes=2, model="tiny")
    for part, key in (("trainer", "step_s_all"), ("engine", "processed_tokens_per_s_all")):
        for d in bench.DTYPES:
            assert len(r[part][key][d]) == 2 and all(x > 0 for x in r[part][key][d])
    step = {d: statistics.median(r["trainer"]["step_s_all"][d]) for d in bench.DTYPES}
    tps = {d: statistics.median(r["engine"]["processed_tokens_per_s_all"][d]) for d in bench.DTYPES}
    assert r["ratio_trainer_fp32_over_bf16"] == pytest.approx(step["bfloat16"] / step["float32"])
    assert r["ratio_engine_fp32_over_bf16"] == pytest.approx(tps["float32"] / tps["bfloat16"])
    assert r["ratio_matmul_fp32_over_bf16"] == pytest.approx(1.5)
    assert r["auto_resolves_to"] in bench.DTYPES
