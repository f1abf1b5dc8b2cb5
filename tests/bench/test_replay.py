"""The workload replay on the tiny model: every arm processes the workload's token counts."""

from __future__ import annotations

import json

import pytest

from provrl.bench.replay import (
    replay_on_engine,
    replay_on_hf,
    run_workload_benchmark,
    tool_waits,
    workload_flop,
)
from provrl.bench.workload import FIXTURE, Episode, Turn, WorkloadError, read_workload, take
from provrl.bench.workload import token_counts as counts_of
from provrl.engine import EngineConfig, LocalEngine
from provrl.trajlog import read_all

ARM_FIELDS = {
    "processed_tokens_per_s", "generated_tokens_per_s", "episodes_per_s", "turn_s_mean",
    "batch_occupancy", "prefix_hit_share", "matmul_fraction",
}  # fmt: skip


def test_the_engine_samples_exactly_the_recorded_lengths_of_the_fixture(tiny):
    eps = take(read_workload(FIXTURE)[0], 8)  # one group: they share a prompt
    c = counts_of(eps)
    recorded = {t.traj_id: t for t in read_all(FIXTURE.parent / "trainer_batch.jsonl")}
    assert c["processed"] == sum(len(recorded[e.episode_id]) for e in eps)
    assert c["action"] == sum(recorded[e.episode_id].num_actions for e in eps)
    waits = tool_waits(eps, "none")
    cfg = EngineConfig(max_seqs=8, max_context=max(map(len, eps)) + 8, eos_stops=False)
    with LocalEngine(tiny, cfg) as eng:
        run = replay_on_engine(eng, eps, 4, waits)
    assert run.sampled == c["action"] == run.engine["tokens_generated"]
    assert len(run.turn_s) == c["turns"]
    # every context token is prefilled or served by the prefix cache, and only once
    fed = run.engine["prefill_tokens"] + run.engine["prefix_hit_tokens"]
    assert fed == c["context"] + c["turns"] - c["episodes"]  # + each turn's last token fed back
    assert run.engine["prefix_hit_tokens"] > 0


def test_the_hf_floor_samples_the_same_tokens(tiny):
    eps = take(read_workload(FIXTURE)[0], 3)
    run = replay_on_hf(tiny.model, tiny.tokenizer.pad_token_id, eps, 2, tool_waits(eps, "none"))
    assert run.sampled == counts_of(eps)["action"]


def test_the_matmul_work_is_the_layers_for_every_fed_token_and_the_head_per_sample(tiny):
    from provrl.engine.llama import LlamaShape

    shape = LlamaShape.from_config(tiny.model.config)
    c = {"episodes": 2, "processed": 102, "action": 10}
    V, D = shape.vocab_size, shape.hidden
    body = sum(p.numel() for n, p in tiny.model.named_parameters() if "embed" not in n)
    body -= 0 if shape.tied else V * D  # an untied head is counted per sampled row
    assert workload_flop(shape, c) == 2.0 * (body * 100 + V * D * 10)


def test_tool_waits_recorded_or_drawn():
    eps = [Episode("a", "g", (Turn((1,), 1), Turn((2,), 1, 0.25)))]
    assert tool_waits(eps, "none") == [[0.0, 0.0]]
    assert tool_waits(eps, "recorded") == [[0.0, 0.25]]
    drawn = tool_waits(eps, "web-fast", seed=3)
    assert drawn[0][0] == 0.0 and drawn[0][1] > 0 and drawn == tool_waits(eps, "web-fast", seed=3)
    with pytest.raises(WorkloadError, match="tool_latency 'slow'"):
        tool_waits(eps, "slow")


def test_the_benchmark_reports_every_arm_on_the_tiny_model():
    r = run_workload_benchmark("fixture", "tiny", episodes=6, repeats=1, threads=1,
                               dtype="float32", backend="vllm")  # fmt: skip
    assert r["tokens"] == counts_of(take(read_workload(FIXTURE)[0], 6))
    assert r["engine"].keys() >= ARM_FIELDS and r["hf"]["processed_tokens_per_s"] > 0
    assert "batch_occupancy" not in r["hf"]  # HF counts no engine steps
    assert r["engine"]["prefix_hit_share"] <= r["tokens"]["shareable"] / r["tokens"]["context"]
    assert r["ratio_engine_vs_hf"] == pytest.approx(
        r["engine"]["processed_tokens_per_s"] / r["hf"]["processed_tokens_per_s"]
    )
    assert r["concurrency"] == 32 and r["workload_differs_from_real"]
    assert "vllm" in r or r["vllm_skipped"]  # vLLM only where it is importable
    # the roofline: probed before the engines start and before each repeat, its peak the
    # faster dtype's over the run, the denominator of every arm's fraction
    assert list(r["fp32_matmul_probes"]) == ["before the engines", "repeat 1"]
    assert r["matmul_gflops"] == max(r["bf16_matmul_gflops"], r["fp32_matmul_gflops"])
    e = r["engine"]
    assert e["matmul_fraction"] == pytest.approx(r["workload_gflop"] / e["wall_s"] / r["matmul_gflops"])  # fmt: skip
    json.dumps(r)


def test_cli_replays_the_fixture(tmp_path):
    from typer.testing import CliRunner

    from provrl.cli import app

    res = CliRunner().invoke(
        app,
        ["bench", "engine", "--model", "tiny", "--workload", "fixture", "--workload-episodes",
         "2", "--repeats", "1", "--no-hf", "--dtype", "float32", "--json",
         "--out", str(tmp_path / "w.json")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["tokens"]["episodes"] == 2 and "hf" not in out
    assert json.loads((tmp_path / "w.json").read_text())["benchmark"] == "engine_workload"


def test_the_vllm_arm_replays_the_same_tokens_where_vllm_is_installed():
    pytest.importorskip("vllm")
    r = run_workload_benchmark("fixture", "tiny-h32", episodes=2, repeats=1, threads=1,
                               dtype="float32", hf=False, backend="vllm")  # fmt: skip
    assert "vllm_skipped" not in r, r.get("vllm_skipped")
    assert r["vllm"]["processed_tokens_per_s"] > 0 and r["ratio_engine_vs_vllm"] > 0
