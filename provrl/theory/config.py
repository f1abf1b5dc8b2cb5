"""Typed configs of the theory lab (one ``Section`` per ``provrl theory`` subcommand)."""

from __future__ import annotations

from pydantic import Field

from provrl.config import Section


class BoundCheckConfig(Section):
    """``provrl theory bound``: sample MDPs and policy pairs, check Theorem 1 exactly."""

    mdps: int = Field(1000, ge=1, description="Number of random / classic MDPs to sample.")
    pairs_per_family: int = Field(
        2, ge=1, description="Policy pairs per MDP for each non-search pair family."
    )
    search_steps: int = Field(
        30, ge=0, description="Hill-climbing steps of the adversarial search per MDP (0: off)."
    )
    search_candidates: int = Field(
        16, ge=1, description="Candidate pairs evaluated (in one batch) per search step."
    )
    gammas: list[float] = Field(
        [0.5, 0.8, 0.9, 0.95, 0.99], description="Discounts γ sampled uniformly from this list."
    )
    max_states: int = Field(30, ge=2, description="Largest number of states of a random MDP.")
    identity_tol: float = Field(
        1e-9, gt=0, description="Absolute tolerance of J(π') − J(π) = Σ_s ρ_π'(s) Ā(s)."
    )
    bound_rtol: float = Field(
        1e-9, gt=0, description="Relative tolerance before a bound counts as violated."
    )
    seed: int = Field(0, description="Seed of the sampler (numpy Generator).")


class MMConfig(Section):
    """``provrl theory mm``: exact Algorithm 1, average-KL TRPO and policy iteration."""

    mdp: str = Field("gridworld", description="MDP: gridworld, chain, random or random_sparse.")
    states: int = Field(16, ge=2, description="States (gridworld: rounded to a square grid).")
    actions: int = Field(4, ge=2, description="Actions of a random MDP.")
    gamma: float = Field(0.9, gt=0, lt=1, description="Discount γ.")
    iters: int = Field(40, ge=1, description="Update iterations per method.")
    deltas: list[float] = Field(
        [0.001, 0.01, 0.1, 1.0], description="Average-KL step sizes δ of practical TRPO."
    )
    c_scales: list[float] = Field(
        [1.0, 0.5],
        description="Algorithm 1 penalties c·C; c ≥ ½ keeps the guarantee (Pinsker).",
    )
    seed: int = Field(0, description="Seed of the random MDP.")


class MixedConfig(Section):
    """``provrl theory mixed``: exact IS on a categorical sequence model with a hot-load."""

    vocab: int = Field(4, ge=2, description="Vocabulary size V of the sequence model.")
    length: int = Field(6, ge=1, description="Tokens per trajectory T (V^T are enumerated).")
    eta: float = Field(1.0, ge=0, description="Policy change between versions (logit step).")
    eta_grid: list[float] = Field(
        [0.0, 0.125, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
        description="Policy changes η for the bias-vs-change curve.",
    )
    target_version: int = Field(
        1, ge=0, description="Version of π_θ the trainer evaluates (0 = old, 1 = new, 2 = …)."
    )
    top_p: float = Field(0.9, gt=0, le=1, description="Nucleus mass of the top-p example.")
    kv_mix: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Stale-KV example: weight of old-version logits after a switch.",
    )
    seed: int = Field(0, description="Seed of the sequence model.")


class FilteringConfig(Section):
    """``provrl theory filtering``: Pr(0 < K < k | p) and its Beta-prior expectation."""

    ks: list[int] = Field([4, 8, 16], description="Probe counts k to plot.")
    a: float = Field(1.0, gt=0, description="Beta prior parameter a (pass-rate prior).")
    b: float = Field(1.0, gt=0, description="Beta prior parameter b (pass-rate prior).")
    mc_samples: int = Field(200_000, ge=1000, description="Monte-Carlo samples of the check.")
    seed: int = Field(0, description="Seed of the Monte-Carlo check.")


class TheoryConfig(Section):
    """All theory-lab settings (what ``provrl theory …`` runs)."""

    out: str = Field("runs/theory", description="Directory for PNGs and JSON results.")
    bound: BoundCheckConfig = Field(default_factory=BoundCheckConfig, description="bound.")
    mm: MMConfig = Field(default_factory=MMConfig, description="mm.")
    mixed: MixedConfig = Field(default_factory=MixedConfig, description="mixed.")
    filtering: FilteringConfig = Field(default_factory=FilteringConfig, description="filtering.")
