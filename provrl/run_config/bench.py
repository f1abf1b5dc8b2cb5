"""Typed settings of the benchmarks (the ``bench`` section of the run config; here rather
than in ``provrl/bench/``, which sits above the run config and imports it).

``provrl bench NAME --config FILE --set bench.NAME.key=value`` or the flags generated from
these fields; each benchmark prints JSON with provrl's figure, the peer's figure measured in
the same run, and their ratio.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from provrl.config import Section
from provrl.env.config import LatencyConfig


class EngineBenchConfig(Section):
    """``provrl bench engine``: LocalEngine vs HF generate, same process, interleaved."""

    model: str = Field(
        "smollm2-135m",
        description="Model name (smollm2-135m, tiny, tiny-h32 for vLLM) or HF dir; tiny only "
        "checks that the benchmark runs (its figures mean nothing).",
    )
    concurrency: int = Field(
        64, ge=1, description="Requests in flight at once (8-64; the published figure is 64)."
    )
    new_tokens: int = Field(128, ge=1, description="Tokens sampled per request.")
    repeats: int = Field(
        3, ge=1, description="Interleaved HF / engine repeats; medians are reported (3-5)."
    )
    threads: int = Field(
        1,
        ge=0,
        description="torch intra-op threads for both sides (0 = torch's default); 1 and 2 are "
        "the published columns.",
    )
    swaps: int = Field(5, ge=0, description="Keep-mode hot-loads in the hot-load phase.")
    hotload_tokens: int = Field(32, ge=1, description="Tokens per request in the hot-load phase.")
    perturb: float = Field(
        1e-3,
        ge=0,
        description="Relative size of the weight change each swap loads (1e-3 moves logprobs "
        "by ~1e-2: enough for the KV-staleness audit to see).",
    )
    audits: int = Field(8, ge=0, description="Turns recomputed by the KV-staleness audit.")
    prefix_cache: bool = Field(
        True, description="Engine prefix cache (the prompts share a system prompt)."
    )
    hf_continuous_batching: bool = Field(
        False,
        description="Also time transformers' continuous batching (generate_batch); slow on CPU.",
    )
    backend: Literal["local", "vllm"] = Field(
        "local",
        description="'local', or 'vllm': also the vLLM backend side by side (needs vLLM; the "
        "built-in tiny has head_dim 16, use model tiny-h32).",
    )
    vllm_compile: bool = Field(
        False, description="Let vLLM torch.compile (slow start on CPU); default eager."
    )
    device: str = Field(
        "cpu", description="torch device of the model, HF and the local engine (cuda on GPU)."
    )
    workload: str = Field(
        "",
        description="Replay recorded agent episodes turn by turn instead of the synthetic "
        "requests (provrl.bench.replay): 'fixture' (the shipped 4 x 8 SmolLM2 probe episodes, "
        "provrl/bench/data/workload.json), a provrl-workload/1 file, or a run's trajectory log "
        "(RUN/rl/trajectories.jsonl). '' = the synthetic benchmark.",
    )
    workload_episodes: int = Field(
        0,
        ge=0,
        description="Workload replay: episodes replayed (0 = all; more than the workload has "
        "cycles through it again as new groups).",
    )
    workload_concurrency: int = Field(
        0,
        ge=0,
        description="Workload replay: agent loops in flight (0 = the workload's own, 32 for a "
        "trajectory log).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Workload replay: dtype of the engine and the HF floor (auto: the default "
        "preset's engine, bfloat16 with bf16 matrix units, else float32). The synthetic "
        "benchmark runs float32.",
    )
    tool_latency: Literal["none", "recorded", "web-fast", "web-ai", "web-serp"] = Field(
        "none",
        description="Workload replay: each tool call waits not at all, its recorded seconds, "
        "or a draw from that search-latency preset (env.search.latency.preset).",
    )
    hf: bool = Field(True, description="Workload replay: also replay on the HF generate floor.")


class SearchBenchConfig(Section):
    """``provrl bench search``: SQLite FTS5 BM25 vs bm25s / rank_bm25 on one world."""

    docs: int = Field(
        100_000,
        ge=50,
        description="Documents in the benchmark world (100,000 is the published figure; a "
        "few thousand for a smoke run).",
    )
    seed: int = Field(0, description="World seed.")
    k: int = Field(10, ge=1, description="Results per query (recall@k).")
    repeats: int = Field(3, ge=1, description="Timed passes; medians are reported.")
    tasks: int = Field(2000, ge=1, description="Tasks whose queries are timed.")
    peers: tuple[str, ...] = Field(
        ("bm25s", "rank_bm25"), description="Peer libraries measured: bm25s, rank_bm25."
    )
    rank_bm25_queries: int = Field(
        100, ge=1, description="Queries per set for rank_bm25 (slow: pure Python scoring)."
    )


class LogBenchConfig(Section):
    """``provrl bench log``: trajectory-log write / read throughput and bytes per token."""

    trajectories: int = Field(10_000, ge=1, description="Number of trajectories.")
    tokens: int = Field(2_000, ge=8, description="Tokens per trajectory.")
    repeats: int = Field(3, ge=1, description="Repeats per format; medians reported.")


class LogprobBenchConfig(Section):
    """``provrl bench logprobs``: chunked vs full teacher-forced logprobs, time and memory."""

    model: str = Field("smollm2-135m", description="Model name or dir.")
    batch: int = Field(2, ge=1, description="Sequences per batch.")
    seq_len: int = Field(256, ge=16, description="Tokens per sequence.")
    action_frac: float = Field(
        0.5, gt=0, le=1, description="Fraction of each sequence that is action tokens (its end)."
    )
    chunk_tokens: int = Field(256, ge=1, description="LM-head chunk (positions).")
    repeats: int = Field(3, ge=1, description="Timed repeats per method.")


class TrainerBenchConfig(Section):
    """``provrl bench trainer``: one RL step standalone vs a TRL-style reference step."""

    model: str = Field(
        "smollm2-135m",
        description="Model name or HF dir (tiny only checks that the benchmark runs).",
    )
    fixture: str = Field(
        "",
        description="Trajectory log of the batch ('' = the shipped 4 × 8 SmolLM2 probe batch, "
        "provrl/bench/data/trainer_batch.jsonl).",
    )
    repeats: int = Field(
        3, ge=1, description="Interleaved repeats per side, each in a fresh process (3-5)."
    )
    threads: int = Field(2, ge=0, description="torch intra-op threads of every side (0 = all).")
    reference_micro_batch: int = Field(
        4, ge=1, description="Trajectories per padded micro-batch of the reference step."
    )
    rl: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the default preset's rl section for the provrl side "
        '(e.g. {"micro_batch_size": 8}).',
    )
    lag0: bool = Field(
        True, description="Also measure the trainer-engine mismatch at lag 0 (fp32 / bf16)."
    )
    baseline: str = Field(
        "",
        description="A results JSON of an earlier run of this benchmark to compare tokens/s "
        "and peak RSS with ('' = none).",
    )
    sharing_run: str = Field(
        "",
        description="A run directory whose RL steps' batches give the prefix-sharing factor "
        "of real batches (prefix_sharing_factor.real_run; '' = the fixture's only).",
    )


class LearningBenchConfig(Section):
    """``provrl bench learning``: a preset with several RL seeds from one warm start, on the
    whole test split and on a second world (provrl.bench.learning)."""

    preset: str = Field("default", description="The preset run (a name in configs/ or a YAML).")
    seeds: int = Field(3, ge=1, description="RL seeds (pipeline.loop.seed = rl.seed = 0 … n−1).")
    runs: str = Field(
        "runs/bench-learning", description="Directory of the runs (resumable: rerun to go on)."
    )
    eval_k: int = Field(4, ge=1, description="Samples per test task (k ≥ 4 for the figure).")
    world2_seed: int = Field(
        0, ge=0, description="Generator seed of the second world (0: drawn, and recorded)."
    )
    overrides: tuple[str, ...] = Field(
        (), description="key=value overrides of the preset for every run (like --set)."
    )
    plot: str = Field(
        "", description="Also draw the record here (PNG; per seed and tier: accuracy, calls)."
    )
    from_record: str = Field(
        "",
        description="Run nothing: read this finished record (results/learning.json), check "
        "its targets and draw --plot; or a benchmark directory stopped early: the record of "
        "its finished seeds (marked partial), written to --out.",
    )
    shared: str = Field(
        "",
        description="A finished run whose world, warm start, probe and filter the benchmark "
        "reuses (linked into RUNS/shared; its warm start is still evaluated on test). Empty: "
        "built here.",
    )
    markdown: bool = Field(
        False,
        description="With --from-record FILE: print the docs' tables of the record instead "
        "(per seed and the targets, every figure a link into FILE as docs/ quotes results).",
    )
    keep: str = Field(
        "",
        description="A folder (under results/, committed) where each finished piece is kept "
        "as JSON: the warm start's evaluations, each seed's row. A rerun on a machine that "
        "lost --runs rebuilds the shared stages, checks they are the same (world, warm-start "
        "weights, pools) and goes on from the kept pieces. Empty: nothing kept.",
    )


class DevBenchConfig(Section):
    """``provrl bench dev``: one run of a preset on the dev split, summarised as the record
    that chose a knob (provrl.bench.dev; docs/pipeline.md's knob table links these)."""

    name: str = Field("run", description="The run's name: RUNS/NAME and its log RUNS/NAME.log.")
    preset: str = Field("default", description="The preset run (a name in configs/ or a YAML).")
    runs: str = Field("runs/dev", description="Directory of the dev runs (resumable).")
    overrides: tuple[str, ...] = Field(
        (), description="key=value overrides of the preset (like --set): the knobs compared."
    )
    shared: str = Field(
        "",
        description="A finished run whose world, warm start, probe and filter this run reuses "
        "(only RL and eval run again); empty: its own.",
    )
    eval_n: int = Field(
        0, ge=0, description="Dev tasks evaluated (0: every dev task of the tiers)."
    )
    eval_k: int = Field(2, ge=1, description="Samples per dev task.")
    eval_versions: tuple[int, ...] = Field(
        (),
        description="RL versions (steps) also evaluated on dev, from checkpoints the run keeps "
        "(pipeline.loop.keep_versions): the record's eval_at[v], to choose "
        "pipeline.loop.steps on dev.",
    )
    from_run: str = Field(
        "",
        description="Summarise this finished run directory (evaluated on dev: warmstart and rl) "
        "instead of running one.",
    )


class SimulateBenchConfig(Section):
    """``provrl bench simulate``: predicted async / sync wall-time ratio of an RL run at scale
    (a discrete-event simulation, provrl.bench.simulate; docs/simulate.md). Every timing is
    an input: put your own measured figures in (the defaults are a sizing example)."""

    concurrency: tuple[int, ...] = Field(
        (8, 64, 512), description="Concurrent episodes (agent loops) at each point of the curve."
    )
    replicas: tuple[int, ...] = Field(
        (1, 4, 16), description="Engine replica counts N: one curve each."
    )
    batch: int = Field(
        0, ge=0, description="Trajectories per trainer step B; 0 = the point's concurrency."
    )
    steps: int = Field(4, ge=1, description="Trainer steps simulated (both modes train steps × B).")
    seeds: int = Field(3, ge=1, description="Seeds per point (medians are reported).")
    tool_calls: tuple[int, int] = Field(
        (2, 32), description="Tool calls per episode, uniform in [min, max] (turns = calls + 1)."
    )
    tokens_per_turn: tuple[int, int] = Field(
        (32, 256), description="Tokens sampled per assistant turn, uniform in [min, max]."
    )
    latency: LatencyConfig = Field(
        default_factory=lambda: LatencyConfig(preset="web-ai"),
        description="The tool-call latency model (env.search.latency's fields; default the "
        "web-ai preset, fitted to a published web-search API's p50 / p95).",
    )
    step_s: float = Field(
        0.012, gt=0, description="Engine step time at batch 0 (s): d(b) = step_s + row_s · b."
    )
    row_s: float = Field(1e-4, ge=0, description="Engine step time per generating sequence (s).")
    train_fixed_s: float = Field(
        10.0, ge=0, description="Trainer step time: train_fixed_s + train_per_traj_s · B (s)."
    )
    train_per_traj_s: float = Field(0.05, ge=0, description="Trainer seconds per trajectory.")
    load_s: float = Field(
        3.0, ge=0, description="Weight load on every replica after each step (s; pauses it)."
    )
    max_lag: int = Field(1, ge=0, description="async: staleness bound L (admission and drop).")
    contention: float = Field(
        1.0,
        ge=1,
        description="Engine step time multiplier while the trainer runs (1 = separate "
        "hardware; about 2 when both share the same cores).",
    )
    plot: str = Field("", description="Also draw the predicted curve to this PNG ('' = no plot).")


class BenchConfig(Section):
    """Every benchmark's settings (what ``provrl bench …`` runs)."""

    engine: EngineBenchConfig = Field(
        default_factory=EngineBenchConfig, description="provrl bench engine."
    )
    search: SearchBenchConfig = Field(
        default_factory=SearchBenchConfig, description="provrl bench search."
    )
    log: LogBenchConfig = Field(default_factory=LogBenchConfig, description="provrl bench log.")
    logprobs: LogprobBenchConfig = Field(
        default_factory=LogprobBenchConfig, description="provrl bench logprobs."
    )
    trainer: TrainerBenchConfig = Field(
        default_factory=TrainerBenchConfig, description="provrl bench trainer."
    )
    learning: LearningBenchConfig = Field(
        default_factory=LearningBenchConfig, description="provrl bench learning."
    )
    dev: DevBenchConfig = Field(default_factory=DevBenchConfig, description="provrl bench dev.")
    simulate: SimulateBenchConfig = Field(
        default_factory=SimulateBenchConfig, description="provrl bench simulate."
    )
