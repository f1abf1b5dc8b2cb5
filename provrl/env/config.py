"""Typed settings of the search-agent environment (one :class:`Section` per part).

:class:`EnvConfig` is the ``env`` section of :class:`provrl.run_config.RunConfig`; the
convenience flags of ``provrl world / eval / index / serve-search`` are generated from
these fields (:mod:`provrl.cli.options`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from provrl.config import Section, peer_names
from provrl.env.prompts import Prompt, check_template, read_template, render, resolve_template
from provrl.env.search import RetrieveLimits

VERL_ROLLOUT = "actor_rollout_ref.rollout."


class WorldConfig(Section):
    """The synthetic world: fictional entities rendered into documents, plus tasks."""

    seed: int = Field(0, description="Seed of the generator (same seed → same bytes).")
    entities: int = Field(
        2000, ge=50, description="Number of entities (people, organisations, places, ...)."
    )
    docs: int = Field(
        5000,
        ge=50,
        description="Target number of documents; entity pages and award pages come first, "
        "news digests (distractors) fill the rest.",
    )
    twin_fraction: float = Field(
        0.08,
        ge=0.0,
        le=0.5,
        description="Fraction of people and organisations whose name is a one-letter "
        "variant of another's (near-identical-name distractors).",
    )
    award_fraction: float = Field(
        0.35, ge=0.0, le=1.0, description="Fraction of people who received an award."
    )
    conflict_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Fraction of digest facts that contradict the entity's own page (only "
        "minor facts that no task asks about).",
    )
    tasks: int = Field(2000, ge=0, description="Number of tasks to generate (all splits).")
    tier_mix: tuple[float, float, float, float] = Field(
        (0.4, 0.25, 0.2, 0.15),
        description="Share of tiers 1-4: lookup, two-hop, multi-constraint, comparison.",
    )
    split_fractions: tuple[float, float, float] = Field(
        (0.8, 0.1, 0.1), description="Share of answer entities in train / dev / test."
    )


LATENCY_PUBLISHED: dict[str, tuple[float, float, str]] = {
    # preset → (p50 s, p95 s, the API whose published figures these are); sources: docs/env.md §3
    "web-fast": (0.25, 0.70, "Brave Search API"),
    "web-ai": (0.80, 2.20, "Tavily search API"),
    "web-serp": (1.20, 3.50, "SerpAPI (Google results)"),
}
"""The published p50 / p95 each ``env.search.latency.preset`` is fitted to."""

LATENCY_PRESETS: dict[str, dict[str, float | str]] = {
    # fit_lognormal_pareto(p50, p95, tail_prob=0.02, tail_alpha=1.5, max_s=30), rounded to 3
    # significant figures (tests/env/test_latency.py checks the fit). The Pareto tail (2 % of
    # calls, α = 1.5) is an assumption: no source found publishes a p99 (docs/env.md §3).
    "web-fast": {"kind": "pareto", "median_s": 0.246, "sigma": 0.571, "tail_prob": 0.02, "tail_alpha": 1.5},
    "web-ai": {"kind": "pareto", "median_s": 0.789, "sigma": 0.56, "tail_prob": 0.02, "tail_alpha": 1.5},
    "web-serp": {"kind": "pareto", "median_s": 1.18, "sigma": 0.594, "tail_prob": 0.02, "tail_alpha": 1.5},
}  # fmt: skip
"""``env.search.latency.preset`` → the fields it sets (:data:`LATENCY_PUBLISHED`)."""


class LatencyConfig(Section):
    """A simulated network latency added to every search call (benchmarks, realism)."""

    preset: Literal["", "web-fast", "web-ai", "web-serp"] = Field(
        "",
        description="A web-search API's latency fitted to its published p50 / p95 "
        "(docs/env.md §3): web-fast, web-ai, web-serp; it sets kind, median_s, sigma, "
        "tail_prob and tail_alpha, except those given explicitly (when the config is read: "
        "a file, --set, a flag; not on assignment). '' = the fields as given.",
    )
    kind: Literal["none", "lognormal", "pareto"] = Field(
        "none", description="none; lognormal(median, sigma); or lognormal body + Pareto tail."
    )
    median_s: float = Field(0.5, gt=0, description="Median latency in seconds.")
    sigma: float = Field(0.6, gt=0, description="Log-normal shape σ (log-space std).")
    tail_prob: float = Field(
        0.05, ge=0, le=1, description="pareto: probability that a call falls in the tail."
    )
    tail_alpha: float = Field(
        1.5, gt=0, description="pareto: tail index α (smaller = heavier tail)."
    )
    max_s: float = Field(30.0, gt=0, description="Latencies are clipped to this many seconds.")
    time_scale: float = Field(
        1.0,
        gt=0,
        description="Every latency, its clip max_s included, times this: on an engine N times "
        "slower than the deployment whose tool latency the model describes (a 2-core CPU "
        "standing in for a GPU), N keeps the share of an episode spent waiting on tools. The "
        "simulated call's deadline, env.agent.tool_timeout_s, dilates with it. 1 = the "
        "seconds as given.",
    )
    seed: int = Field(0, description="Seed of the latency sampler.")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: object) -> object:
        """A preset's fields, under those given explicitly."""
        if isinstance(data, dict) and data.get("preset") in LATENCY_PRESETS:
            return {**LATENCY_PRESETS[data["preset"]], **data}
        return data


class SearchConfig(Section):
    """Which search backend the agent talks to, and how results are shown."""

    backend: Literal["sqlite", "http"] = Field(
        "sqlite", description="sqlite: embedded FTS5 BM25 index; http: a /retrieve service."
    )
    url: str = Field(
        "http://127.0.0.1:8765",
        description="URL of the /retrieve service (backend=http), with or without the "
        "trailing /retrieve.",
    )
    retries: int = Field(
        2,
        ge=0,
        le=10,
        description="backend=http: retries of a request that cannot connect or is answered "
        "429/502/503/504, after retry_backoff_s, then twice that, … (a request that timed "
        "out is not retried).",
    )
    retry_backoff_s: float = Field(
        0.25, ge=0, description="backend=http: wait before the first retry (doubling after)."
    )
    max_tool_error_rate: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Stop a probe, eval or RL stage with one line when more than this share "
        "of the last 50 search/open calls (judged from 20 on) failed: the policy would be "
        "scored, or trained, on error observations. 1 never stops.",
    )
    index: str = Field(
        "",
        description="backend=sqlite: an index file built by `provrl index docs.jsonl` (a "
        "user's own collection); '' = the built-in world's index.",
    )
    k: int = Field(3, ge=1, le=50, description="Search results shown to the agent per query.")
    title_weight: float = Field(
        2.0, gt=0, description="BM25 weight of the title column (body weight is 1)."
    )
    snippet_words: int = Field(
        48, ge=4, description="Each result's snippet is cut to this many words."
    )
    open_words: int = Field(160, ge=8, description="An opened document is cut to this many words.")
    latency: LatencyConfig = Field(
        default_factory=LatencyConfig, description="Simulated latency added to each call."
    )
    passage_words: int = Field(
        128,
        ge=8,
        description="`provrl index`: documents of your own collection are cut at blank lines, "
        "then into passages of at most this many words (the world's pages are cut by the "
        "generator). 64-256 is typical; leave it unless your passages are very long or short.",
    )


class AgentConfig(Section):
    """The multi-turn agent loop: protocol, prompt and limits."""

    protocol: Literal["tag", "hermes"] = Field(
        "tag",
        description="tag: <search>q</search> / <open>id</open> / <answer>a</answer>; "
        'hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen family).',
    )
    prompt: Literal["auto", "world", "neutral", "search-r1"] = Field(
        "auto",
        description="The instructions' template (docs/env.md §Prompts): world (the built-in "
        "world's wording: 'the documents are about a fictional world'), neutral (the same "
        "without it), search-r1 (Search-R1's prompt, as the user turn; protocol tag); auto = "
        "world on the built-in world's tasks and index, neutral on your own tasks or index.",
    )
    prompt_file: str = Field(
        "",
        description="Your own template, a UTF-8 text file (placeholders {tools}, {reasoning}, "
        "{question}; with {question} it is the user turn, without it the system turn); "
        "used instead of prompt. '' = none.",
    )
    prompt_template: str = Field(
        "",
        description="Your own template as a string (as prompt_file; give one of the two). "
        "'' = none.",
    )
    reasoning: bool = Field(
        False,
        description="Ask for a reasoning block, <think>…</think>, before each tool call and the "
        "answer ({reasoning} in the template; search-r1 always asks). Raise max_new_tokens "
        "with it. The teacher's traces (pipeline.teacher) then start each turn with one too: "
        "what the last result showed and whether it answers the question (env.oracle.found).",
    )
    shots: int = Field(
        0, ge=0, le=8, description="Worked examples (oracle traces on train tasks) in the prompt."
    )
    observation_role: Literal["user", "tool"] = Field(
        "user", description="Chat role of the turn that carries tool results."
    )
    max_turns: int = Field(8, ge=1, description="Maximum assistant turns per episode.")
    max_tool_calls: int = Field(6, ge=0, description="Maximum search/open calls per episode.")
    repeat_calls: Literal["run", "note"] = Field(
        "run",
        description="A search or open identical to one the episode already ran successfully "
        "(same tool, same argument up to case and spacing): run (run it again: the same "
        "results, another call) or note (not run: the observation says it was already made and "
        "that its results are above; it still counts as a call, toward max_tool_calls and the "
        "call cost). Either way the trajectory's num_repeat_calls counts it.",
    )
    max_malformed: int = Field(
        2,
        ge=1,
        description="The episode ends after this many malformed turns in a row (each one "
        "gets an error observation first; a model that ignores the format twice rarely "
        "recovers, and the turns cost tokens).",
    )
    max_total_tokens: int = Field(
        1536, ge=64, description="Budget for the whole trajectory (prompt + all turns)."
    )
    max_new_tokens: int = Field(96, ge=1, description="Maximum sampled tokens per turn.")
    max_observation_tokens: int = Field(
        256,
        ge=16,
        description="A tool result is truncated to this many tokens (k=3 results of the "
        "default world need at most ~225).",
    )
    tool_timeout_s: float = Field(
        10.0, gt=0, description="A tool call slower than this returns a timeout observation."
    )
    temperature: float = Field(
        1.0,
        ge=0,
        description="Sampling temperature (0 = greedy).",
        **peer_names("temperature", trl="temperature", verl=VERL_ROLLOUT + "temperature"),
    )
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling mass.",
        **peer_names("top_p", trl="top_p", verl=VERL_ROLLOUT + "top_p"),
    )
    top_k: int = Field(
        0,
        ge=0,
        description="Top-k sampling (0 = off; verl and TRL use -1 / None for off).",
        **peer_names("top_k", trl="top_k", verl=VERL_ROLLOUT + "top_k"),
    )
    reward: Literal["em", "f1"] = Field(
        "em", description="Outcome score: exact match (with aliases) or token F1."
    )
    format_penalty: float = Field(
        0.0,
        ge=0,
        description="Subtracted from the reward when the episode has no well-formed answer "
        "or any malformed call.",
    )
    tool_call_cost: float = Field(
        0.0,
        ge=0,
        description="Cost per tool call on a *successful* episode: reward = score · (1 − c · "
        "calls). Rewards reaching the answer with fewer searches without making failure "
        "cheaper than success (needs c · max_tool_calls < 1). Typical 0.05-0.15; 0 = off.",
    )
    tool_call_cost_on: Literal["all", "after_answer"] = Field(
        "all",
        description="Which calls tool_call_cost charges: all (every search/open) or "
        "after_answer (only those made after a tool result shown to the model already held a "
        "gold answer: calls the episode did not need, rollout.agent.calls_after_answer; the "
        "hops a question needs stay free). Either way the trajectory's calls_after_answer "
        "metric counts them. after_answer reads the gold answers, like the score: a training "
        "reward, not something an agent could compute.",
    )
    tool_call_cost_warmup: int = Field(
        0,
        ge=0,
        description="Policy versions over which the call cost rises linearly from 0 to "
        "tool_call_cost: an episode whose first action was sampled under version v pays "
        "c · min(1, v / W) per call (rewards.call_cost_at), so RL first learns to answer, then "
        "to answer with fewer calls. 0 = the full cost from the start.",
    )

    rewards: tuple[str, ...] = Field(
        (),
        description="Reward functions whose weighted sum replaces the outcome formula above "
        "(reward, format_penalty, tool_call_cost): built-ins em, f1, format (1 for a "
        "well-formed answer), outcome (that formula), a function registered in this process "
        "(provrl.env.rewards.register_reward; what provrl.GRPOTrainer does with its "
        "reward_funcs) or an importable 'module:function' with TRL's reward signature. Each "
        "one's score is in the trajectory's metrics as reward/<name>. () = the formula.",
    )
    reward_weights: tuple[float, ...] = Field(
        (),
        description="Weights of the rewards, in order (() = all 1).",
        **peer_names("reward_weights", trl="reward_weights"),
    )

    @field_validator("top_k", mode="before")
    @classmethod
    def _peer_top_k_off(cls, v: object) -> object:
        """verl's and vLLM's top_k = -1 (off) is provrl's 0."""
        return 0 if v == -1 else v

    @model_validator(mode="after")
    def _check_rewards(self) -> AgentConfig:
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} weights for "
                f"{len(self.rewards)} rewards"
            )
        if len(set(self.rewards)) != len(self.rewards):
            raise ValueError(f"rewards names a function twice: {list(self.rewards)}")
        return self

    @model_validator(mode="after")
    def _check_prompt(self) -> AgentConfig:
        """Your own template is read and checked when the config is (one line naming it)."""
        if self.prompt_file and self.prompt_template:
            raise ValueError("give prompt_file or prompt_template, not both")
        if self.prompt_file:
            read_template(self.prompt_file)
        elif self.prompt_template:
            check_template(self.prompt_template, "env.agent.prompt_template")
        elif self.prompt == "search-r1" and self.protocol != "tag":
            raise ValueError("prompt search-r1 writes the tag protocol's calls: set protocol tag")
        return self

    def instructions(self, *, world: bool) -> Prompt:
        """The episode's instructions: your template if you gave one, else the named one
        (``auto``: the world's wording when ``world`` — the built-in world's task and index —
        else the neutral one), for this protocol and reasoning setting."""
        if self.prompt_file:
            text = read_template(self.prompt_file)
        elif self.prompt_template:
            text = self.prompt_template
        else:
            text = resolve_template(self.prompt, world=world)
        return render(text, self.protocol, self.reasoning)

    @model_validator(mode="after")
    def _check_cost(self) -> AgentConfig:
        if self.tool_call_cost * self.max_tool_calls >= 1:
            raise ValueError(
                f"tool_call_cost={self.tool_call_cost} × max_tool_calls={self.max_tool_calls} "
                "≥ 1: a successful episode could score below a failed one"
            )
        if self.tool_call_cost_warmup and self.rewards:
            raise ValueError(
                "tool_call_cost_warmup schedules the built-in reward's call cost: with "
                "env.agent.rewards give the cost in your reward functions instead"
            )
        return self


class ExplorerConfig(Section):
    """The exploratory teacher (:func:`provrl.env.oracle.run_explorer`): the oracle's plan with
    the extra calls a large agent makes, each a seeded coin per plan step."""

    reformulate: float = Field(
        0.6,
        ge=0,
        le=1,
        description="Per plan step: probability of a vaguer query (some of the exact query's "
        "words) before the exact one.",
    )
    open_unused: float = Field(
        0.4,
        ge=0,
        le=1,
        description="Per plan step: probability of opening a result the plan does not use.",
    )
    confirm: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Probability of one confirming search for the answer before answering.",
    )
    max_calls: int | None = Field(
        None,
        ge=0,
        description="The teacher's own call budget: extras are dropped where they would pass "
        "it (None = env.agent.max_tool_calls). A large agent's budget may exceed the student's "
        "cap; the traces do not name either, and the student's calls past its cap are refused.",
    )
    seed: int = Field(0, description="Seed of the coins (with the task id and sample number).")


class EvalConfig(Section):
    """``provrl eval`` (the command): which tasks, how many samples. ``provrl run``'s eval
    stage reads ``pipeline.eval`` and ``pipeline.tasks`` instead, and refuses a changed key
    here, naming the one it reads."""

    split: Literal["train", "dev", "test"] = Field("dev", description="Task split to evaluate.")
    n: int = Field(0, ge=0, description="Number of tasks (0 = all of the split).")
    tiers: tuple[int, ...] = Field(
        (), description="Only tasks of these tiers (empty = every tier), chosen before n."
    )
    k: int = Field(1, ge=1, description="Samples per task (K = successes out of k).")
    concurrency: int = Field(
        16, ge=1, description="Agent loops running at once (continuous batching needs work)."
    )
    seed: int = Field(0, description="Seed for task sampling and samplers.")


class ServeConfig(Section):
    """``provrl serve-search``: where the /retrieve service listens and what one request may
    ask (its search settings are the ``search`` section's)."""

    host: str = Field(
        "127.0.0.1",
        description="Interface to bind (127.0.0.1 = this machine only; 0.0.0.0 exposes the "
        "service to the network, which has no authentication).",
    )
    port: int = Field(8765, ge=0, le=65535, description="TCP port (0 = any free port).")
    limits: RetrieveLimits = Field(
        default_factory=RetrieveLimits, description="Bounds on one /retrieve request."
    )


class EnvConfig(Section):
    """Everything about the search-agent environment."""

    world: WorldConfig = Field(default_factory=WorldConfig, description="World generator.")
    search: SearchConfig = Field(default_factory=SearchConfig, description="Search backend.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Agent loop.")
    eval: EvalConfig = Field(
        default_factory=EvalConfig,
        description="`provrl eval` (the command); provrl run's eval stage is pipeline.eval.",
    )
    serve: ServeConfig = Field(
        default_factory=ServeConfig, description="`provrl serve-search` (the /retrieve service)."
    )
    explorer: ExplorerConfig = Field(
        default_factory=ExplorerConfig,
        description="The exploratory teacher (pipeline.teacher: explorer).",
    )
