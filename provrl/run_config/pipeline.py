"""Typed config of ``provrl run`` (the ``pipeline`` section of :class:`RunConfig`).

It lives beside :class:`RunConfig` rather than in ``provrl/pipeline/``: the pipeline takes
the whole run config, so the run config cannot import the pipeline package."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from provrl.config import Section, peer_names


class TaskSliceConfig(Section):
    """Which train tasks each stage uses. The warm-start slice and the RL slice are disjoint
    (the RL tasks are never seen as teacher traces); evaluation is on the test split."""

    tiers: tuple[int, ...] = Field(
        (1, 2),
        description="Task tiers of every stage (1 lookup, 2 two-hop, 3 multi-constraint, 4 "
        "comparison). SmolLM2-135M learns tiers 1-2 from a light warm start; keep (1, 2) "
        "unless the model is larger.",
    )
    warmstart: int = Field(
        128,
        ge=0,
        description="Train tasks whose oracle traces the warm start imitates (128 gives "
        "SmolLM2-135M a spread of K on tier 1; 1,024 saturates tiers 1-2).",
    )
    probe: int = Field(
        64,
        ge=1,
        description="Train tasks probed k times (disjoint from the warm-start slice); the "
        "filter's kept pool is the RL task pool.",
    )
    eval: int = Field(
        0, ge=0, description="Test tasks evaluated per policy (0 = every test task of the tiers)."
    )
    seed: int = Field(0, description="Seed of the slices (which tasks go where).")
    file: str | None = Field(
        None,
        description="A task file (provrl tasks or plain {question, answer} JSONL, "
        "provrl.env.tasks.read_task_file) probed and trained on instead of the world's train "
        "split (all of it: probe and tiers do not apply); the warm start still imitates the "
        "world's oracle traces (unless pipeline.warmstart_data), and evaluation stays on the "
        "world's test split.",
    )


class RLLoopConfig(Section):
    """The RL stage's orchestration (the trainer's own settings are the ``rl`` section)."""

    mode: Literal["sync", "async"] = Field(
        "async",
        description="sync: strict on-policy — generate a batch, train, drain, reset caches, "
        "load, repeat. async: rollouts never stop; each new version is hot-loaded into the "
        "running engine; staleness bounded by max_lag.",
    )
    steps: int = Field(
        12,
        ge=0,
        description="RL optimizer steps (= new policy versions).",
        **peer_names("steps", trl="max_steps", verl="trainer.total_training_steps"),
    )
    save_total_limit: int = Field(
        2,
        ge=1,
        description="Complete RL checkpoints kept (the newest; older ones are deleted after "
        "each save). With 2 or more, a resume that finds the newest damaged (its files "
        "checked against the CRC-32s written with it) falls back to the one before and "
        "redoes the lost step exactly from the trajectory log; with 1 it can only stop.",
        **peer_names("save_total_limit", trl="save_total_limit"),
    )
    keep_versions: list[int] = Field(
        default_factory=list,
        description="RL checkpoints (versions) kept besides the newest save_total_limit, e.g. "
        "to evaluate intermediate steps on dev and choose pipeline.loop.steps there "
        "(provrl bench dev --eval-versions; provrl eval --policy RUN/rl/ckpt-vN --split dev).",
    )

    @model_validator(mode="before")
    @classmethod
    def _removed_save_every(cls, data: Any) -> Any:
        """``save_every`` was removed: every version is saved before it is hot-loaded (no
        version is reused after a crash), so only 1 ever worked; 1 is still read."""
        if isinstance(data, dict) and "save_every" in data:
            data = dict(data)
            if data.pop("save_every") != 1:
                raise ValueError(
                    "save_every was removed: every step's version is saved before it is "
                    "hot-loaded; drop the key"
                )
        return data

    seed: int | None = Field(
        None,
        description="Seed of the RL stage's sampling and task order (None: the run's seed). "
        "Vary it for independent RL runs from one warm start and probe (bench learning).",
    )
    groups_per_step: int = Field(
        4, ge=1, description="GRPO groups (tasks × k samples) per step; batch = groups · k."
    )
    k: int = Field(
        8,
        ge=2,
        description="Samples per group (GRPO group size); the probe takes as many per task.",
        **peer_names("k", trl="num_generations", verl="actor_rollout_ref.rollout.n"),
    )
    max_lag: int = Field(
        1,
        ge=0,
        description="async: a group is trained only if every action token is at most this "
        "many versions older than the weights being updated; older groups are dropped and "
        "counted. Admission control starts no episode that would be trained later than that. "
        "1-2 is typical; 0 makes async wait like sync.",
        **peer_names("max_lag", trl="max_staleness"),
    )
    admission: Literal["eager", "paced"] = Field(
        "eager",
        description="async: when a new group starts. eager: as soon as the max_lag budget "
        "allows. paced: just in time for the step that will train it (from the measured step "
        "and group times, provrl.pipeline.admission.paced_start) — when the learner is the "
        "slower side, fresher groups (lag ≤ 1) whose episodes span the hot-load; when "
        "generation is, the same as eager.",
    )
    straddle: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="async, paced: the share s of a group's time still ahead of it at the "
        "hot-load. A group starts once the step in progress has s · group_s less left than "
        "the group takes (provrl.pipeline.admission.paced_start), so its episodes are in "
        "flight across the swap and sample under two versions; the learner waits about "
        "s · group_s for each batch. 0: timed to finish at the hot-load.",
    )
    hotload: Literal["keep", "recompute"] = Field(
        "keep",
        description="async: keep = swap weights between decode steps, keep in-flight KV; "
        "recompute = re-prefill in-flight KV under the new weights.",
    )
    concurrency: int = Field(
        32, ge=1, description="Agent loops in flight on the engine (continuous batching)."
    )
    split_cores: bool = Field(
        False,
        description="async: give the engine's scheduler thread and the learner thread half of "
        "torch's intra-op threads each (at least one), so the two never oversubscribe the "
        "cores. Worth it when rollouts keep the engine busy through a whole training step "
        "(generation-bound runs). Off here; the default preset turns it on (engine and "
        "learner a core each: no oversubscribed thread pools). sync ignores it: engine and "
        "trainer take turns.",
    )
    lend_cores: bool = Field(
        False,
        description="async with split_cores: while the learner waits for a batch, the engine "
        "(an in-process one: local, or a router of local replicas) runs on all of torch's "
        "intra-op threads; when a step starts it goes back to its half. The engine is busy "
        "while the learner idles in a generation-bound run, so the learner's core would "
        "otherwise sit idle.",
    )
    borrow_cores: bool = Field(
        False,
        description="async with split_cores: before each of the learner's micro-batches, if "
        "the engine (an in-process one) has no turn generating or queued — every episode "
        "waits on a tool, or paced admission holds the next groups back — the learner runs it "
        "on all of torch's intra-op threads, else on its half. The mirror of lend_cores: the "
        "engine's core would otherwise sit idle while the learner computes. Work that reaches "
        "the engine mid-micro-batch shares its core until that micro-batch ends.",
    )


class CurriculumConfig(Section):
    """The RL stage's online, version-aware curriculum (provrl.pipeline.curriculum): a Beta
    posterior per task on its pass rate under the current policy, pools re-decided as
    evidence arrives and ages, re-probes of the unsolved and solved pools, no training on
    groups without signal."""

    enabled: bool = Field(
        True,
        description="Pools follow the evidence of every group (False: the filter's kept pool, "
        "fixed, visited in seeded rounds; zero-signal groups still never trained on).",
    )
    prior_a: float = Field(1.0, gt=0, description="Beta prior a₀ (1, 1: uniform).")
    prior_b: float = Field(1.0, gt=0, description="Beta prior b₀.")
    p_low: float = Field(0.075, gt=0, lt=1, description="Unsolved when P(p ≤ p_low) ≥ confidence.")
    p_high: float = Field(0.925, gt=0, lt=1, description="Solved when P(p ≥ p_high) ≥ confidence.")
    confidence: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Posterior probability a verdict needs; with the defaults one group of 8 "
        "reproduces the probe filter (K = 0 unsolved, K = 8 solved).",
    )
    exit_confidence: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="A solved (unsolved) task leaves its pool only when P(p ≥ p_high) "
        "(P(p ≤ p_low)) falls below this: hysteresis, so one verdict at the edge does not "
        "flip back and forth as evidence ages.",
    )
    forget: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Evidence from a policy u − v versions older weighs forget^(u−v): older "
        "verdicts loosen as the policy moves (1: never forget).",
    )
    reprobe_every: int = Field(
        8,
        ge=0,
        description="Every this many groups started, one is a re-probe of the unsolved or "
        "solved task with the oldest evidence (0: never).",
    )
    balance_tiers: bool = Field(
        False,
        description="Start kept tasks tier by tier: from the tier whose kept tasks have been "
        "started least in total, then least visited within it, so a tier with fewer kept tasks "
        "(tier 2 against tier 1 in a default run) gets as many groups as the "
        "larger one (False: the kept pool is one pool, least visited first).",
    )
    balance_count: Literal["with_probe", "loop"] = Field(
        "with_probe",
        description="What balance_tiers counts as a tier's groups started. with_probe: every "
        "round of its kept tasks, the probe's included, so the tier with fewer kept tasks "
        "starts alone until its total catches up (tier 2 first in a default run); "
        "loop: only the loop's groups, so the tiers alternate from the first group.",
    )
    skip_zero_signal: bool = Field(
        True,
        description="Never train on a group whose rewards are all equal (every advantage 0; it "
        "would only dilute the token-mean step); the loop waits for groups with signal. "
        "False trains on them (the quick preset: the random tiny model's groups are all "
        "equal, and its RL stage only exercises the machinery).",
    )
    zero_signal_limit: int = Field(
        256,
        ge=1,
        description="Stop with an error after this many finished groups in a row without "
        "signal: the policy or the reward cannot teach anything.",
    )
    train_on_probe: bool = Field(
        True,
        description="Start with the probe's own groups of kept tasks in the ready queue: they "
        "were sampled at the RL stage's first version with per-token stamps, so training on "
        "them is exact (subject to max_lag like any group).",
    )


class FilterConfig(Section):
    """The filter band: tasks with min_successes ≤ K ≤ max_successes are kept; K below the
    band goes to ``unsolved`` (re-probed later, never "unlearnable"), above it to ``solved``."""

    min_successes: int = Field(
        1, ge=0, description="Lowest K kept (1: drop all-failure groups, which have no signal)."
    )
    max_successes: int | None = Field(
        None,
        ge=0,
        description="Highest K kept (None = k − 1: drop all-success groups). A lower bound "
        "such as k − 2 keeps only tasks the policy still fails often.",
    )


class EvalStageConfig(Section):
    """The held-out evaluation of each policy on the test split (dev while choosing knobs)."""

    split: Literal["dev", "test"] = Field(
        "test",
        description="Held-out split evaluated: test for reported figures; dev for choosing a "
        "preset's knobs (never tune on test).",
    )
    k: int = Field(
        4,
        ge=1,
        description="Samples per test task (accuracy = mean EM over tasks × k; the standard "
        "error shrinks with k).",
    )
    policies: tuple[str, ...] = Field(
        ("base", "warmstart", "rl"),
        description="Which policies to evaluate: base (the model as loaded), warmstart (after "
        "SFT on oracle traces), selfsft (after SFT on own successes), rl (after the RL stage).",
    )
    temperature: float = Field(
        1.0, ge=0, description="Sampling temperature at evaluation (the policy as trained)."
    )
    file: str | None = Field(
        None,
        description="A task file (plain {question, answer} JSONL or provrl tasks) evaluated "
        "instead of the world's split (all of it, or pipeline.tasks.eval of it; tiers do not "
        "apply); disjoint from pipeline.tasks.file. GRPOTrainer's eval_dataset.",
    )
    concurrency: int = Field(32, ge=1, description="Agent loops in flight during evaluation.")


class PipelineConfig(Section):
    """``provrl run``: world → warm start → probe → filter → (self-SFT) → RL → eval → report."""

    renamed: ClassVar[dict[str, str]] = {"rl": "loop"}
    """``pipeline.rl`` was the RL loop's section; ``rl`` alone is the trainer's."""

    tasks: TaskSliceConfig = Field(
        default_factory=TaskSliceConfig, description="Task slices of the stages."
    )
    warmstart: bool = Field(
        True,
        description="SFT on oracle (teacher) traces first: needed for models that cannot use "
        "the tools zero-shot (SmolLM2-135M, the tiny model).",
    )
    warmstart_data: tuple[str, ...] = Field(
        (),
        description="Your own warm-start files, SFT'd on instead of the world's teacher "
        'traces: chat JSONL ({"messages": [...]} per line) and/or trajectory logs '
        "(trajectories.jsonl, or a run directory holding one), told apart by their first "
        "record. Needed with env.search.index (your own collection): the world's oracle "
        "cannot solve tasks on it.",
    )
    teacher: Literal["oracle", "explorer"] = Field(
        "oracle",
        description="Whose traces the warm start imitates: oracle (the minimal plan: one "
        "search per evidence passage) or explorer (the same plan with the reformulations, "
        "unused opens and confirming searches of a large agent, ~2x the calls: "
        "env.explorer). Every trace and report names its teacher.",
    )
    teacher_samples: int = Field(
        1,
        ge=1,
        description="Teacher traces per warm-start task (the explorer's differ; the oracle's "
        "are identical, so 1).",
    )
    filter: FilterConfig = Field(
        default_factory=FilterConfig, description="Which probed tasks RL trains on."
    )
    self_sft: bool = Field(
        False,
        description="After the filter, SFT on the policy's own shortest successful probe "
        "traces (one per task) before RL.",
    )
    rl_pools: tuple[Literal["kept", "unsolved", "solved"], ...] = Field(
        ("kept",),
        description="With curriculum.enabled false: the filter pools the RL stage trains on, "
        "fixed. kept (0 < K < k) is the point of filtering; add unsolved only for a policy "
        "that solves nothing yet (the quick preset's random tiny model). With the curriculum "
        "every probed task is in play and the evidence moves it between pools.",
    )
    allow_stale_pools: bool = Field(
        False,
        description="Let RL train on pools whose probe manifest does not match the current "
        "policy or tools (normally refused).",
    )
    loop: RLLoopConfig = Field(
        default_factory=RLLoopConfig,
        description="The RL loop's orchestration (the trainer is the top-level rl section).",
    )
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig,
        description="Which task the RL loop starts next; pools moved by evidence.",
    )
    eval: EvalStageConfig = Field(
        default_factory=EvalStageConfig, description="Held-out evaluation."
    )
