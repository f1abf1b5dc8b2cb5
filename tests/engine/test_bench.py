"""The engine benchmark runs end to end (tiny model) and SmolLM2 exactness (slow)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from provrl.bench.engine import bench_prompts, run_engine_benchmark
from provrl.engine import EngineConfig, LocalEngine
from provrl.provenance import SamplingParams

FIELDS = {
    "tokens_per_s",
    "hf_generate_tokens_per_s",
    "ratio_vs_hf",
    "roofline_tokens_per_s",
    "roofline_fraction",
    "hotload_update_ms",
    "dropped_requests",
    "logprob_mismatch_max_abs",
    "kv_staleness_mean_abs",
}


def test_benchmark_reports_every_field_on_the_tiny_model():
    r = run_engine_benchmark(
        "tiny", concurrency=4, new_tokens=8, repeats=1, swaps=2, hotload_tokens=24, audits=4
    )
    assert r.keys() >= FIELDS
    assert r["dropped_requests"] == 0
    assert r["logprob_mismatch_max_abs"] <= 1e-4
    assert r["tokens_per_s"] > 0 and r["hf_generate_tokens_per_s"] > 0
    assert r["ratio_vs_hf"] == pytest.approx(r["tokens_per_s"] / r["hf_generate_tokens_per_s"])
    assert r["roofline_tokens_per_s"] == pytest.approx(r["matmul_gflops"] * 1e9 / (2 * r["params"]))
    assert r["kv_staleness_samples"] > 0 and np.isfinite(r["kv_staleness_mean_abs"])
    assert r["hotload_swaps"] == 2 and r["tokens_with_older_kv"] > 0
    json.dumps(r)


def test_cli_prints_json(tmp_path):
    from provrl.cli import app

    res = CliRunner().invoke(
        app,
        ["bench", "engine", "--model", "tiny", "--concurrency", "2", "--new-tokens", "4",
         "--repeats", "1", "--swaps", "1", "--hotload-tokens", "8", "--audits", "1",
         "--run-dir", str(tmp_path), "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["model"] == "tiny" and out["concurrency"] == 2
    assert (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_smollm2_logprobs_match_teacher_forcing():
    """Issue 3 §6 on the real model: max |Δ| ≤ 1e-4 in fp32, batched decode + prefix cache."""
    from provrl.models import load_model
    from provrl.train.logprobs import token_logprobs

    lm = load_model("smollm2-135m")
    prompts = bench_prompts(lm.tokenizer, 8)
    with LocalEngine(lm, EngineConfig(max_seqs=8, max_context=512)) as eng:
        params = SamplingParams(temperature=1.0, max_new_tokens=48, seed=0)
        outs = [f.result() for f in [eng.submit(p, params) for p in prompts]]
    worst = 0.0
    for p, o in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = token_logprobs(lm.model, torch.tensor([p + o.token_ids]))[0, len(p) :]
        worst = max(worst, float((ref - torch.from_numpy(o.logprob)).abs().max()))
    assert worst <= 1e-4
